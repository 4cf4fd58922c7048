//! A real S3 store for the upload tests: Garage 2.5.0 on loopback, through
//! `../shared/garage/garage.sh` (from the crate root) or `$RINGBAG_GARAGE_SH`. Where neither
//! exists the tests say they skip, unless `RINGBAG_UPLOAD_REQUIRED=1`, when they fail.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;

use ringbag::upload::client::S3Client;
use ringbag::upload::{Credentials, Target};

pub struct Garage {
    script: PathBuf,
    /// Holds Garage's state; removed on drop after Garage is stopped.
    dir: tempfile::TempDir,
    port: u16,
    pub endpoint: String,
    pub region: String,
    pub bucket: String,
    pub key_id: String,
    pub secret: String,
    pub pid: i32,
}

fn script() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("RINGBAG_GARAGE_SH").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/garage/garage.sh");
    p.is_file().then_some(p)
}

/// Three ports free now: S3 at `p`, RPC at `p+1`, admin at `p+3`.
fn free_ports() -> u16 {
    for _ in 0..200 {
        let probe = TcpListener::bind("127.0.0.1:0").expect("bind");
        let p = probe.local_addr().expect("addr").port();
        drop(probe);
        if p > 60_000 {
            continue;
        }
        let all_free = [p, p + 1, p + 3]
            .iter()
            .all(|q| TcpListener::bind(("127.0.0.1", *q)).is_ok());
        if all_free {
            return p;
        }
    }
    panic!("no free ports for Garage");
}

impl Garage {
    /// A fresh Garage, or `None` (after saying so) when it is not available here.
    pub fn start(test: &str) -> Option<Garage> {
        let Some(script) = script() else {
            if std::env::var("RINGBAG_UPLOAD_REQUIRED").as_deref() == Ok("1") {
                panic!("{test}: RINGBAG_UPLOAD_REQUIRED=1 but garage.sh is not found (set RINGBAG_GARAGE_SH)");
            }
            eprintln!("{test}: skipped: no garage.sh (../shared/garage or RINGBAG_GARAGE_SH)");
            return None;
        };
        let mut g = Garage {
            script,
            dir: tempfile::tempdir().expect("tmp"),
            port: free_ports(),
            endpoint: String::new(),
            region: String::new(),
            bucket: String::new(),
            key_id: String::new(),
            secret: String::new(),
            pid: 0,
        };
        g.launch();
        Some(g)
    }

    /// Start (or start again, on the same state and port).
    pub fn launch(&mut self) {
        let out = Command::new("bash")
            .arg(&self.script)
            .arg("start")
            .arg(self.dir.path())
            .arg(self.port.to_string())
            .output()
            .expect("garage.sh runs");
        assert!(
            out.status.success(),
            "garage.sh start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Some((k, v)) = line.trim().split_once('=') else {
                continue;
            };
            let v = v.trim_matches(|c| c == '\'' || c == '"').to_string();
            match k.trim_start_matches("export ") {
                "S3_ENDPOINT" => self.endpoint = v,
                "S3_REGION" => self.region = v,
                "S3_BUCKET" => self.bucket = v,
                "AWS_ACCESS_KEY_ID" => self.key_id = v,
                "AWS_SECRET_ACCESS_KEY" => self.secret = v,
                "GARAGE_PID" => self.pid = v.parse().expect("pid"),
                _ => {}
            }
        }
        assert!(
            !self.endpoint.is_empty() && !self.secret.is_empty() && self.pid > 0,
            "garage.sh printed no assignments"
        );
    }

    /// kill -9, as a power cut or a crash would.
    pub fn kill9(&self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(self.pid), None);
        // Not our child (garage.sh's): wait until it is gone.
        assert!(super::common::wait_for(
            std::time::Duration::from_secs(10),
            || nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid), None).is_err()
                || std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
                    .map(|s| s.contains(") Z "))
                    .unwrap_or(true)
        ));
    }

    pub fn target(&self) -> Target {
        Target {
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
            bucket: self.bucket.clone(),
            path_style: true,
            ca_file: None,
            credentials: Credentials {
                access_key_id: self.key_id.clone(),
                secret_access_key: self.secret.clone(),
                session_token: None,
            },
        }
    }

    /// An independent client for reading back (GET, HEAD, listings).
    pub fn client(&self) -> S3Client {
        S3Client::new(&self.target(), 1).expect("client")
    }

    /// `ringbag upload` against this Garage (credentials in the environment), robot `r1`.
    pub fn upload_cmd(&self) -> Command {
        self.upload_cmd_to(&self.endpoint, &self.bucket)
    }

    /// `ringbag upload` with this Garage's credentials but another endpoint or bucket.
    pub fn upload_cmd_to(&self, endpoint: &str, bucket: &str) -> Command {
        let mut c = super::common::ringbag();
        c.arg("upload")
            .args(["--endpoint", endpoint])
            .args(["--bucket", bucket])
            .args(["--region", &self.region])
            .args(["--path-style", "--robot-id", "r1"])
            .env("AWS_ACCESS_KEY_ID", &self.key_id)
            .env("AWS_SECRET_ACCESS_KEY", &self.secret)
            .env_remove("AWS_SESSION_TOKEN")
            .env_remove("RINGBAG_LOG");
        c
    }
}

impl Drop for Garage {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(&self.script)
            .arg("stop")
            .arg(self.dir.path())
            .output();
    }
}
