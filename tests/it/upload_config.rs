//! `[upload]` in ringbag.toml through the binary: `--check-config` names every mistake as
//! `file:line:col: upload.<key>: ...` (exit 2), refuses missing credentials without showing a
//! secret, and says where uploads go when all is well; the daemon records even when the
//! credentials are missing, and a SIGHUP picks them up.

use crate::common::SpawnExecd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common::{daemon_command, ringbag, stderr, without_credentials};

const SECRET: &str = "tEsTsEcReT/0123456789";

fn config(dir: &Path, upload: &str) -> PathBuf {
    let path = dir.join("ringbag.toml");
    std::fs::write(
        &path,
        format!(
            "output_root = \"{}\"\nsource = \"synthetic\"\n[upload]\n{upload}",
            dir.join("root").display()
        ),
    )
    .unwrap();
    path
}

/// `ringbag daemon --check-config` with only `vars` of the AWS/systemd variables set.
fn check(path: &Path, vars: &[(&str, &str)]) -> Output {
    let mut c = ringbag();
    c.args(["daemon", "--check-config", "--config"]).arg(path);
    without_credentials(&mut c).envs(vars.iter().copied());
    crate::common::RunOutput::run_output(&mut c).expect("ringbag runs")
}

const GOOD: &str = "endpoint = \"https://s3.example.com:9000\"\nbucket = \"fleet-bags\"\n\
                    robot_id = \"orin-07\"\n";

#[test]
fn check_config_names_each_upload_mistake_with_file_line_column_and_exits_2() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = [
        ("AWS_ACCESS_KEY_ID", "AKIDTEST"),
        ("AWS_SECRET_ACCESS_KEY", SECRET),
    ];
    for (upload, want) in [
        (
            format!("{GOOD}concurrency = 64\n"),
            "7:15: upload.concurrency: 64 is outside 1..=16 (parts in flight)".to_string(),
        ),
        (
            "endpoint = \"http://s3.example.com\"\nbucket = \"fleet-bags\"\n".into(),
            "4:12: upload.endpoint: plain http:// to s3.example.com, which is not loopback: data \
             and signatures would cross the network unencrypted; use https://, or set \
             allow_http = true"
                .into(),
        ),
        (
            format!("{GOOD}secret_access_key = \"{SECRET}\"\n"),
            format!(
                "7:1: upload.secret_access_key: {}",
                ringbag::upload::settings::WHERE_CREDENTIALS_GO
            ),
        ),
        (
            format!("{GOOD}tls_verify = false\n"),
            "7:1: upload.tls_verify: TLS is always verified; for a private certificate \
             authority set ca_file"
                .into(),
        ),
        (
            format!("{GOOD}bucket_name = \"x\"\n"),
            "7:1: upload.bucket_name: unknown key".into(),
        ),
    ] {
        let path = config(tmp.path(), &upload);
        let o = check(&path, &keys);
        assert_eq!(o.status.code(), Some(2), "{upload}: {}", stderr(&o));
        assert_eq!(
            stderr(&o),
            format!("ringbag: error: {}:{want}\n", path.display()),
            "{upload}"
        );
    }
}

#[test]
fn check_config_refuses_missing_or_exposed_credentials_without_showing_the_secret() {
    let tmp = tempfile::tempdir().unwrap();
    // None anywhere: the table is the place.
    let path = config(tmp.path(), GOOD);
    let o = check(&path, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(
        stderr(&o),
        format!(
            "ringbag: error: {}:3:2: upload: no credentials: CREDENTIALS_DIRECTORY is not set, \
             no upload.credentials_file, and AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY are not \
             set\n",
            path.display()
        )
    );
    // A credentials file others may read: refused, naming the mode; the secret never shown.
    let file = tmp.path().join("s3.credentials");
    std::fs::write(
        &file,
        format!("[default]\naws_access_key_id = AKIDFILE\naws_secret_access_key = {SECRET}\n"),
    )
    .unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let path = config(
        tmp.path(),
        &format!("{GOOD}credentials_file = \"{}\"\n", file.display()),
    );
    let o = check(&path, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(
        stderr(&o),
        format!(
            "ringbag: error: {}:7:20: upload.credentials_file: credentials from \
             credentials_file {}: mode 0644 lets group or others read it; chmod 600 it (0600 \
             or stricter)\n",
            path.display(),
            file.display()
        )
    );
    // Fixed: valid, and the summary says where uploads go and whose credentials they use.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let o = check(&path, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.lines().any(|l| l
            == format!(
                "ringbag: info: upload: to https://s3.example.com:9000/fleet-bags as orin-07, \
                 credentials from credentials_file {}",
                file.display()
            )),
        "{err}"
    );
    assert!(!err.contains(SECRET), "{err}");
    assert!(
        !tmp.path().join("root").exists(),
        "the check creates nothing"
    );
    // systemd's credential comes first.
    let creds = tmp.path().join("creds");
    std::fs::create_dir(&creds).unwrap();
    std::fs::write(
        creds.join("s3"),
        format!("aws_access_key_id = AKIDSYSTEMD\naws_secret_access_key = {SECRET}\n"),
    )
    .unwrap();
    let o = check(&path, &[("CREDENTIALS_DIRECTORY", creds.to_str().unwrap())]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!(
            "credentials from $CREDENTIALS_DIRECTORY/s3 ({}/s3)",
            creds.display()
        )),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_good_upload_table_with_environment_credentials_passes_the_check() {
    let tmp = tempfile::tempdir().unwrap();
    let path = config(
        tmp.path(),
        "endpoint = \"http://127.0.0.1:3900\"\nbucket = \"ringbag\"\nregion = \"garage\"\n\
         path_style = true\nrobot_id = \"bench-1\"\nmax_rate = \"2MiB\"\npart_size = \
         \"16MiB\"\nconcurrency = 2\ndelete_after_upload = false\n",
    );
    let o = check(
        &path,
        &[
            ("AWS_ACCESS_KEY_ID", "GK1"),
            ("AWS_SECRET_ACCESS_KEY", SECRET),
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "ringbag: info: upload: to http://127.0.0.1:3900/ringbag as bench-1, credentials \
             from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
        ),
        "{}",
        stderr(&o)
    );
}

#[test]
fn the_daemon_records_without_credentials_and_a_sighup_picks_them_up() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    use std::time::Duration;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let status = tmp.path().join("status.json");
    let file = tmp.path().join("s3.credentials");
    let cfg = tmp.path().join("ringbag.toml");
    std::fs::write(
        &cfg,
        crate::common::small_daemon_config(
            &root,
            &status,
            &format!(
                "[upload]\n{GOOD}credentials_file = \"{}\"\n",
                file.display()
            ),
        ),
    )
    .unwrap();
    let log = tmp.path().join("stderr");
    let mut c = daemon_command(&cfg);
    without_credentials(&mut c)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let mut child = c.spawn_execd().expect("daemon starts");
    let pid = Pid::from_raw(child.id() as i32);
    let logged = || std::fs::read_to_string(&log).unwrap_or_default();
    let limit = Duration::from_secs(30);
    let first_split = || {
        std::fs::read_dir(&root).is_ok_and(|d| {
            d.flatten().any(|b| {
                let n = b.file_name().to_string_lossy().into_owned();
                b.path().join(format!("{n}_0.db3")).is_file()
            })
        })
    };
    let recording = crate::common::wait_for(limit, first_split);
    if !recording {
        let _ = child.kill();
    }
    assert!(recording, "no split recorded: {}", logged());
    let said = format!(
        "ringbag: error: {}:13:20: upload.credentials_file: credentials from credentials_file \
         {}: cannot open it: No such file or directory (os error 2); recording goes on, nothing \
         is uploaded until a reload (SIGHUP) finds credentials",
        cfg.display(),
        file.display()
    );
    assert!(logged().lines().any(|l| l == said), "{}", logged());
    std::fs::write(
        &file,
        format!("aws_access_key_id = AKIDFILE\naws_secret_access_key = {SECRET}\n"),
    )
    .unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    kill(pid, Signal::SIGHUP).unwrap();
    let summary = "ringbag: info: upload: to https://s3.example.com:9000/fleet-bags as orin-07, \
                   credentials from credentials_file";
    let reloaded =
        crate::common::wait_for(limit, || logged().lines().any(|l| l.starts_with(summary)));
    kill(pid, Signal::SIGTERM).unwrap();
    let st = child.wait().unwrap();
    assert!(reloaded, "{}", logged());
    assert_eq!(st.code(), Some(0), "{}", logged());
    assert!(!logged().contains(SECRET));
}
