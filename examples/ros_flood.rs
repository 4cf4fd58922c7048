//! The publisher of `scripts/bench-ros.sh`: floods one topic with prebuilt CDR through r2r's
//! untyped publisher (`publish_raw`), so the recorders, not serialization, are what is
//! measured. Reliable, keep-last 10, volatile: what the race in issue 11 used.
//!
//! usage: ros_flood TOPIC TYPE SIZE COUNT RATE [--subscribers N] [--wait-timeout S] [--hold]
//!                  [--depth N | --keep-all]
//!   TYPE: std_msgs/msg/String (SIZE = serialized bytes, encapsulation header included)
//!         sensor_msgs/msg/Image (SIZE = WIDTHxHEIGHT, rgb8; or a byte count, one row)
//!   RATE: messages per second, or `max` (as fast as `publish_raw` returns)
//!
//! Waits until N subscriptions of other processes match (default 2: both recorders), says so
//! on stderr (`ros_flood: matched N`), publishes, then prints one JSON line on stdout:
//! `{"published":..,"failed":..,"seconds":..,"bytes_per_message":..}`. With `--hold` it then
//! keeps the writer alive until stdin reaches end of file: a reliable writer that exits
//! takes its unacknowledged samples with it, and the recorders would miss them for a reason
//! that is the publisher's, not theirs.

use std::io::Read;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use ringbag::source::cdr::{CdrWriter, HEADER_LEN};

#[derive(Parser)]
#[command(about = "Publish prebuilt CDR on one topic, reliably, for scripts/bench-ros.sh")]
struct Args {
    /// Topic to publish on.
    topic: String,
    /// `std_msgs/msg/String` or `sensor_msgs/msg/Image`.
    type_name: String,
    /// String: serialized size in bytes. Image: WIDTHxHEIGHT (rgb8) or a data byte count.
    size: String,
    /// Messages to publish.
    count: u64,
    /// Messages per second, or `max`.
    rate: String,
    /// Matched subscriptions (other processes) to wait for before publishing.
    #[arg(long, default_value_t = 2)]
    subscribers: usize,
    /// Seconds to wait for them.
    #[arg(long, default_value_t = 30.0)]
    wait_timeout: f64,
    /// After publishing, keep the writer alive until stdin is closed.
    #[arg(long)]
    hold: bool,
    /// History depth of the writer (keep-last).
    #[arg(long, default_value_t = 10)]
    depth: usize,
    /// Keep-all history instead (a diagnostic: Cyclone then never prunes an unacknowledged
    /// sample and throttles the writer instead).
    #[arg(long, conflicts_with = "depth")]
    keep_all: bool,
}

/// A prebuilt message and where its per-message sequence number goes, so each message is
/// distinct (a reader can check order and gaps) at the cost of one 8-byte store.
struct Message {
    bytes: Vec<u8>,
    seq_offset: usize,
}

impl Message {
    fn set_seq(&mut self, seq: u64) {
        self.bytes[self.seq_offset..self.seq_offset + 8].copy_from_slice(&seq.to_le_bytes());
    }
}

/// std_msgs/String whose whole serialization is `total` bytes: header, u32 length, text, NUL.
fn string_message(total: usize) -> Result<Message, String> {
    // 4 (encapsulation) + 4 (length) + 8 (seq) + text + 1 (NUL).
    let min = HEADER_LEN + 4 + 8 + 1;
    if total < min {
        return Err(format!(
            "a String message needs at least {min} bytes, not {total}"
        ));
    }
    let text_len = total - HEADER_LEN - 5;
    let mut bytes = Vec::with_capacity(total);
    let mut w = CdrWriter::new(&mut bytes);
    w.sequence_len(text_len + 1);
    let seq_offset = w.buffer_offset();
    // The seq bytes are overwritten per message; the text must stay valid UTF-8, so the
    // sequence number is written as 8 printable bytes (below), not raw little-endian.
    for i in 0..text_len {
        w.u8(b'a' + (i % 26) as u8);
    }
    w.u8(0);
    debug_assert_eq!(bytes.len(), total);
    Ok(Message { bytes, seq_offset })
}

/// sensor_msgs/Image, rgb8, `width` x `height`, a mid-grey picture.
fn image_message(width: u32, height: u32) -> Message {
    let step = width * 3;
    let len = step as usize * height as usize;
    let mut bytes = Vec::with_capacity(len + 64);
    let mut w = CdrWriter::new(&mut bytes);
    w.time(0);
    w.string("camera");
    w.u32(height);
    w.u32(width);
    w.string("rgb8");
    w.u8(0); // is_bigendian
    w.u32(step);
    w.sequence_len(len);
    let seq_offset = w.buffer_offset();
    bytes.resize(bytes.len() + len, 128);
    Message { bytes, seq_offset }
}

fn build(type_name: &str, size: &str) -> Result<Message, String> {
    match type_name {
        "std_msgs/msg/String" => {
            let n: usize = size
                .parse()
                .map_err(|_| format!("String size {size:?}: expected a byte count"))?;
            string_message(n)
        }
        "sensor_msgs/msg/Image" => {
            let (w, h) = match size.split_once('x') {
                Some((w, h)) => (w.parse::<u32>().ok(), h.parse::<u32>().ok()),
                None => (
                    size.parse::<u32>()
                        .ok()
                        .filter(|n| n % 3 == 0)
                        .map(|n| n / 3),
                    Some(1),
                ),
            };
            match (w, h) {
                (Some(w), Some(h)) if w > 0 && h > 0 && (w as u64 * h as u64 * 3) >= 8 => {
                    Ok(image_message(w, h))
                }
                _ => Err(format!(
                    "Image size {size:?}: expected WIDTHxHEIGHT or a byte count divisible by 3 (at least 8 bytes of data)"
                )),
            }
        }
        other => Err(format!(
            "type {other:?}: expected std_msgs/msg/String or sensor_msgs/msg/Image"
        )),
    }
}

/// Eight printable bytes for a String's text (hex digits of the low 32 bits), raw for images.
fn seq_bytes(text: bool, seq: u64) -> u64 {
    if !text {
        return seq;
    }
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 8];
    for (i, d) in out.iter_mut().enumerate() {
        *d = DIGITS[((seq >> (28 - 4 * i)) & 0xf) as usize];
    }
    u64::from_le_bytes(out)
}

fn run(a: Args) -> Result<(), String> {
    let mut msg = build(&a.type_name, &a.size)?;
    let period = match a.rate.as_str() {
        "max" => None,
        r => match r.parse::<f64>() {
            Ok(hz) if hz > 0.0 && hz.is_finite() => Some(Duration::from_secs_f64(1.0 / hz)),
            _ => return Err(format!("rate {r:?}: expected messages per second or `max`")),
        },
    };
    let ctx = r2r::Context::create().map_err(|e| format!("rcl context: {e}"))?;
    let mut node =
        r2r::Node::create(ctx, "ringbag_ros_flood", "").map_err(|e| format!("node: {e}"))?;
    let qos = if a.keep_all {
        r2r::QosProfile::default().keep_all().reliable()
    } else {
        r2r::QosProfile::default().keep_last(a.depth).reliable()
    };
    let publisher = node
        .create_publisher_untyped(&a.topic, &a.type_name, qos)
        .map_err(|e| format!("publisher on {} ({}): {e}", a.topic, a.type_name))?;

    let deadline = Instant::now() + Duration::from_secs_f64(a.wait_timeout.max(0.0));
    loop {
        let n = publisher
            .get_inter_process_subscription_count()
            .map_err(|e| format!("subscription count on {}: {e}", a.topic))?;
        if n >= a.subscribers {
            break;
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "timed out after {} s waiting for {} matched subscriptions on {} (have {n}); \
                 are the recorders running, on the same ROS_DOMAIN_ID and DDS config?",
                a.wait_timeout, a.subscribers, a.topic
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!("ros_flood: matched {}", a.subscribers);

    let text = a.type_name == "std_msgs/msg/String";
    let mut failed = 0u64;
    let start = Instant::now();
    for seq in 0..a.count {
        if let Some(p) = period {
            // An absolute schedule: a late message is sent at once, so the mean rate holds
            // even where one sleep overshoots (10 kHz is below the sleep granularity).
            let due = start + p.mul_f64(seq as f64);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
        }
        msg.set_seq(seq_bytes(text, seq));
        if publisher.publish_raw(&msg.bytes).is_err() {
            failed += 1;
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "{{\"published\":{},\"failed\":{failed},\"seconds\":{seconds:.6},\"bytes_per_message\":{}}}",
        a.count - failed,
        msg.bytes.len()
    );
    if a.hold {
        // Ends when the driver closes our stdin (or dies). The content is irrelevant.
        let mut sink = [0u8; 64];
        let mut stdin = std::io::stdin();
        while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
    }
    drop(publisher);
    Ok(())
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ros_flood: {e}");
            ExitCode::from(2)
        }
    }
}
