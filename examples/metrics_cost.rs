//! What a Prometheus scrape costs (issue 25): the exposition of a recording with 50 topics,
//! every family present (a ring, uploads), rendered as the status loop renders it once a
//! second, and fetched through the real `GET /metrics` server over loopback TCP.
//!
//!   cargo run --release --example metrics_cost [-- ROUNDS]
//!
//! Prints JSON: body bytes, render time and scrape time (connect to last byte), p50 and max.

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringbag::metrics::http::{Body, Server};
use ringbag::metrics::render::{render, sample_status, State};

fn scrape(addr: std::net::SocketAddr) -> (Duration, usize) {
    let t0 = Instant::now();
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    (t0.elapsed(), out.len())
}

fn p50_max(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    (
        v[v.len() / 2].as_secs_f64() * 1e3,
        v[v.len() - 1].as_secs_f64() * 1e3,
    )
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200);
    let st = sample_status(50);
    let mut renders = Vec::with_capacity(rounds);
    let mut text = String::new();
    for _ in 0..rounds {
        let t0 = Instant::now();
        text = render(&st, State::Recording);
        renders.push(t0.elapsed());
    }
    let body = Arc::new(Body::new());
    body.set(text.clone());
    let server = Server::start("127.0.0.1:0".parse().unwrap(), body).expect("server");
    let addr = server.local_addr();
    let mut scrapes = Vec::with_capacity(rounds);
    let mut response = 0;
    for _ in 0..rounds {
        let (t, n) = scrape(addr);
        scrapes.push(t);
        response = n;
    }
    server.finish();
    let (r50, rmax) = p50_max(renders);
    let (s50, smax) = p50_max(scrapes);
    println!(
        "{{\"topics\": 50, \"body_bytes\": {}, \"response_bytes\": {response}, \"samples\": {}, \
         \"render_ms_p50\": {r50:.3}, \"render_ms_max\": {rmax:.3}, \
         \"scrape_ms_p50\": {s50:.3}, \"scrape_ms_max\": {smax:.3}, \"rounds\": {rounds}}}",
        text.len(),
        text.lines().filter(|l| !l.starts_with('#')).count()
    );
}
