//! The `[upload]` settings: one set of rules for the service's TOML table and for `ringbag
//! upload`'s flags. Both fill a [`RawUpload`] (every field optional, as written) and call
//! [`RawUpload::check`], which applies the defaults, the bounds and the endpoint policy and
//! gives [`UploadSettings`]; [`UploadSettings::resolve`] then finds the credentials.
//!
//! Credentials are never part of the settings themselves. They come, in this order, from
//! `$CREDENTIALS_DIRECTORY/s3` (systemd's `LoadCredential=s3:...`), from `credentials_file`,
//! or from `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN`). No error
//! and no `Debug` output ever shows a secret: messages name the source and what is wrong with
//! it, never a value read from it.
//!
//! The process environment (variables, `/etc/machine-id`, the effective uid) is an
//! [`Environment`] passed in, so tests never mutate the real one.

use std::ffi::OsString;
use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{Credentials, KeyTemplate, Target, Tuning, DEFAULT_CONCURRENCY, DEFAULT_KEY_TEMPLATE};
use crate::config::Quantity;

/// The default region: what AWS's own tools assume, and what MinIO answers by default.
pub const DEFAULT_REGION: &str = "us-east-1";
/// AWS's smallest part (every part but the last): 5 MiB. Garage accepts less, AWS refuses it
/// with `EntityTooSmall` at CompleteMultipartUpload, after every part was sent.
pub const MIN_PART_SIZE: u64 = 5 << 20;
/// AWS's largest part: 5 GiB.
pub const MAX_PART_SIZE: u64 = 5 << 30;
/// AWS's most parts in one upload.
pub const MAX_PARTS: u64 = 10_000;
/// Parts in flight at most: each holds a part in memory.
pub const MAX_CONCURRENCY: u64 = 16;
/// The longest robot id.
pub const MAX_ROBOT_ID_BYTES: usize = 128;
/// Where the robot id comes from when `robot_id` is not set.
pub const MACHINE_ID: &str = "/etc/machine-id";
/// The name of the credential systemd hands over (`LoadCredential=s3:/etc/ringbag/...`).
pub const SYSTEMD_CREDENTIAL: &str = "s3";
/// A credentials file larger than this is not one (a few hundred bytes in practice).
const MAX_CREDENTIALS_BYTES: u64 = 64 << 10;
/// A CA bundle larger than this is refused (Mozilla's whole bundle is about 220 KB).
const MAX_CA_BYTES: u64 = 4 << 20;

/// `[upload]` as written (or `ringbag upload`'s flags): every field optional, nothing checked.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawUpload {
    /// `false` keeps the table but turns uploads off; the table's presence turns them on.
    pub enabled: Option<bool>,
    pub endpoint: Option<String>,
    pub allow_http: Option<bool>,
    pub region: Option<String>,
    pub bucket: Option<String>,
    pub key: Option<String>,
    pub robot_id: Option<String>,
    pub path_style: Option<bool>,
    pub ca_file: Option<PathBuf>,
    /// Bytes per second, as a size (`"2MiB"`, or an integer); an optional `/s` is allowed.
    pub max_rate: Option<Quantity>,
    pub part_size: Option<Quantity>,
    pub concurrency: Option<u64>,
    pub delete_after_upload: Option<bool>,
    pub credentials_file: Option<PathBuf>,
}

/// Every key of `[upload]` (the fields of [`RawUpload`]).
pub const KEYS: &[&str] = &[
    "enabled",
    "endpoint",
    "allow_http",
    "region",
    "bucket",
    "key",
    "robot_id",
    "path_style",
    "ca_file",
    "max_rate",
    "part_size",
    "concurrency",
    "delete_after_upload",
    "credentials_file",
];

/// A key of `[upload]` that was refused, and why (one line). `key` is the TOML key; the
/// config prefixes `upload.`, the command line maps it to its flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct SettingError {
    pub key: &'static str,
    pub message: String,
}

fn refuse(key: &'static str, message: impl Into<String>) -> SettingError {
    SettingError {
        key,
        message: message.into(),
    }
}

/// Where the robot id came from (for the `--check-config` summary and messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RobotIdFrom {
    Setting,
    MachineId(PathBuf),
}

/// `[upload]` checked: defaults applied, every value within its bounds. Credentials are not
/// part of it ([`UploadSettings::resolve`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadSettings {
    /// `enabled = false`: every key was checked, but nothing is uploaded.
    pub enabled: bool,
    /// `https://host[:port]` or `http://host[:port]`, lowercase scheme and host, no path.
    pub endpoint: String,
    pub region: String,
    pub bucket: String,
    pub path_style: bool,
    pub ca_file: Option<PathBuf>,
    pub key: KeyTemplate,
    pub robot_id: String,
    pub robot_id_from: RobotIdFrom,
    pub tuning: Tuning,
    pub credentials_file: Option<PathBuf>,
}

/// Looks up an environment variable by name.
pub type VarLookup<'a> = Box<dyn Fn(&str) -> Option<OsString> + 'a>;

/// What the process sees of its environment: variables, the machine id's path, the effective
/// uid. [`Environment::process`] is the real one; tests build their own.
pub struct Environment<'a> {
    pub var: VarLookup<'a>,
    pub machine_id: PathBuf,
    pub euid: u32,
}

impl Environment<'static> {
    /// This process's environment.
    pub fn process() -> Self {
        Environment {
            var: Box::new(|name: &str| std::env::var_os(name)),
            machine_id: PathBuf::from(MACHINE_ID),
            euid: nix::unistd::geteuid().as_raw(),
        }
    }
}

impl<'a> Environment<'a> {
    /// Variables from `vars` only (tests).
    pub fn from_vars(vars: &'a [(&'a str, &'a str)], machine_id: &Path) -> Self {
        Environment {
            var: Box::new(move |name| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| OsString::from(v))
            }),
            machine_id: machine_id.to_path_buf(),
            euid: nix::unistd::geteuid().as_raw(),
        }
    }
}

impl RawUpload {
    /// Every rule of `[upload]`; the first broken one is the error.
    pub fn check(&self, env: &Environment<'_>) -> Result<UploadSettings, SettingError> {
        let allow_http = self.allow_http.unwrap_or(false);
        let endpoint = match &self.endpoint {
            None => {
                return Err(refuse(
                    "endpoint",
                    "is required: https://host[:port] of the S3 service",
                ))
            }
            Some(e) => parse_endpoint(e, allow_http).map_err(|m| refuse("endpoint", m))?,
        };
        let region = self.region.as_deref().unwrap_or(DEFAULT_REGION);
        check_region(region).map_err(|m| refuse("region", m))?;
        let bucket = self
            .bucket
            .as_deref()
            .ok_or_else(|| refuse("bucket", "is required: the bucket objects go to"))?;
        check_bucket(bucket).map_err(|m| refuse("bucket", m))?;
        let (robot_id, robot_id_from) = match &self.robot_id {
            Some(r) => (r.clone(), RobotIdFrom::Setting),
            None => match machine_id(&env.machine_id) {
                Some(id) => (id, RobotIdFrom::MachineId(env.machine_id.clone())),
                None => {
                    return Err(refuse(
                        "robot_id",
                        format!(
                            "not set, and {} is missing, empty or uninitialized: set robot_id",
                            env.machine_id.display()
                        ),
                    ))
                }
            },
        };
        // A machine id is 32 characters; a longer name only eats into S3's 1024-byte keys.
        if robot_id.len() > MAX_ROBOT_ID_BYTES {
            return Err(refuse(
                "robot_id",
                format!(
                    "{} bytes long; at most {MAX_ROBOT_ID_BYTES}",
                    robot_id.len()
                ),
            ));
        }
        let template = self.key.as_deref().unwrap_or(DEFAULT_KEY_TEMPLATE);
        let key = KeyTemplate::new(template, &robot_id).map_err(|e| match e {
            super::KeyTemplateError::BadRobot(_) => match &robot_id_from {
                RobotIdFrom::Setting => refuse("robot_id", e.to_string()),
                RobotIdFrom::MachineId(p) => refuse(
                    "robot_id",
                    format!("not set, and {} holds no usable id: {e}", p.display()),
                ),
            },
            other => refuse("key", other.to_string()),
        })?;
        let ca_file = match &self.ca_file {
            None => None,
            Some(p) => {
                check_ca_file(p).map_err(|m| refuse("ca_file", m))?;
                Some(p.clone())
            }
        };
        let max_rate = self
            .max_rate
            .as_ref()
            .map(rate)
            .transpose()
            .map_err(|m| refuse("max_rate", m))?;
        let part_size = match &self.part_size {
            None => super::DEFAULT_PART_SIZE,
            Some(q) => q.bytes().map_err(|m| refuse("part_size", m))?,
        };
        if !(MIN_PART_SIZE..=MAX_PART_SIZE).contains(&part_size) {
            return Err(refuse(
                "part_size",
                format!(
                    "{part_size} bytes is outside 5 MiB..=5 GiB (S3's part sizes; AWS refuses \
                     smaller parts with EntityTooSmall)"
                ),
            ));
        }
        let concurrency = self.concurrency.unwrap_or(DEFAULT_CONCURRENCY as u64);
        if !(1..=MAX_CONCURRENCY).contains(&concurrency) {
            return Err(refuse(
                "concurrency",
                format!("{concurrency} is outside 1..={MAX_CONCURRENCY} (parts in flight)"),
            ));
        }
        if let Some(p) = &self.credentials_file {
            if !p.is_absolute() {
                return Err(refuse(
                    "credentials_file",
                    format!("{}: must be an absolute path", p.display()),
                ));
            }
        }
        Ok(UploadSettings {
            enabled: self.enabled.unwrap_or(true),
            endpoint,
            region: region.to_string(),
            bucket: bucket.to_string(),
            path_style: self.path_style.unwrap_or(false),
            ca_file,
            key,
            robot_id,
            robot_id_from,
            tuning: Tuning {
                part_size,
                concurrency: concurrency as usize,
                max_rate,
                delete_after_upload: self.delete_after_upload.unwrap_or(false),
            },
            credentials_file: self.credentials_file.clone(),
        })
    }
}

/// `max_rate` in bytes per second: a size, with `/s` allowed ("2MiB/s" reads as what it
/// means); 0 is refused (it would never send anything).
fn rate(q: &Quantity) -> Result<u64, String> {
    let q = match q {
        Quantity::Text(t) => {
            let t = t.trim();
            Quantity::Text(t.strip_suffix("/s").unwrap_or(t).to_string())
        }
        n => n.clone(),
    };
    match q.bytes()? {
        0 => Err("0 bytes/s would never send anything; leave max_rate out for no limit".into()),
        n => Ok(n),
    }
}

/// Keys that would hold a secret: refused in `[upload]` with where credentials go instead
/// (serde's "unknown field" would not say it). Lowercase `key`.
pub fn is_secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    [
        "secret",
        "password",
        "passwd",
        "access_key",
        "session_token",
    ]
    .iter()
    .any(|s| k.contains(s))
        || matches!(k.as_str(), "token" | "credentials")
}

/// Where credentials go, for the message refusing a secret in the config.
pub const WHERE_CREDENTIALS_GO: &str = "credentials never go in ringbag.toml: use systemd's \
     LoadCredential=s3:FILE, a file named by upload.credentials_file (mode 0600), or \
     AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY";

/// Keys that would turn TLS verification off: there is no such key.
pub fn is_insecure_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    k.contains("insecure") || k.contains("verify") || k.contains("skip_tls")
}

/// Why a key that would weaken TLS is refused.
pub const TLS_ALWAYS_VERIFIED: &str =
    "TLS is always verified; for a private certificate authority set ca_file";

/// `https://host[:port]` (or `http://` under the policy) → its normalised text. The text is
/// never echoed: a user-info part may hold a password, a query a signature.
pub fn parse_endpoint(text: &str, allow_http: bool) -> Result<String, String> {
    if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("holds whitespace or a control character".into());
    }
    let (scheme, rest) = match text.split_once("://") {
        Some((s, r)) if s.eq_ignore_ascii_case("https") => ("https", r),
        Some((s, r)) if s.eq_ignore_ascii_case("http") => ("http", r),
        _ => {
            return Err("must start with https:// (or http:// to a loopback host)".into());
        }
    };
    if rest.contains('@') {
        return Err(format!(
            "holds a user name or password; {WHERE_CREDENTIALS_GO}"
        ));
    }
    if rest.contains('#') {
        return Err("has a fragment (#...); give only scheme://host[:port]".into());
    }
    if rest.contains('?') {
        return Err("has a query (?...); give only scheme://host[:port]".into());
    }
    // One trailing '/' is how many people write a base URL; anything after it is a path.
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.contains('/') {
        return Err(
            "has a path; give only scheme://host[:port] (the bucket is the `bucket` key)".into(),
        );
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let Some((addr, after)) = v6.split_once(']') else {
            return Err("an IPv6 address needs its closing ']'".into());
        };
        if addr.parse::<Ipv6Addr>().is_err() {
            return Err(format!("`[{addr}]` is not an IPv6 address"));
        }
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or("text after the IPv6 address's ']' that is not :port")?,
            ),
        };
        (format!("[{}]", addr.to_ascii_lowercase()), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_ascii_lowercase(), Some(p)),
            None => (authority.to_ascii_lowercase(), None),
        }
    };
    if host.is_empty() {
        return Err("has no host".into());
    }
    if !host.starts_with('[') {
        let labels_ok = host.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
        if !labels_ok || host.len() > 253 {
            return Err(format!(
                "host `{host}`: a DNS name (letters, digits, '-', dots between labels) or an IP \
                 address (IPv6 in brackets)"
            ));
        }
    }
    let port = match port {
        None => None,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => Some(n),
            _ => return Err(format!("port `{p}` is not a number in 1..=65535")),
        },
    };
    if scheme == "http" && !allow_http && !is_loopback(&host) {
        return Err(format!(
            "plain http:// to {host}, which is not loopback: data and signatures would cross \
             the network unencrypted; use https://, or set allow_http = true"
        ));
    }
    Ok(match port {
        Some(p) => format!("{scheme}://{host}:{p}"),
        None => format!("{scheme}://{host}"),
    })
}

/// `localhost`, 127.0.0.0/8, `[::1]` (and `[::ffff:127.x.y.z]`): traffic that never leaves
/// the machine.
fn is_loopback(host: &str) -> bool {
    if host == "localhost" {
        return true;
    }
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<IpAddr>() {
        Ok(IpAddr::V4(a)) => a.is_loopback(),
        Ok(IpAddr::V6(a)) => {
            a.is_loopback() || a.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
        Err(_) => false,
    }
}

/// A region goes into every signature's scope (`date/region/s3/aws4_request`).
fn check_region(r: &str) -> Result<(), String> {
    if r.is_empty() || r.len() > 64 {
        return Err("must be 1 to 64 characters (e.g. us-east-1, or garage)".into());
    }
    if !r
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(format!(
            "`{r}`: use letters, digits, '-' and '_' (e.g. us-east-1)"
        ));
    }
    Ok(())
}

/// S3's bucket naming rules: 3 to 63 characters of lowercase letters, digits, '.' and '-',
/// starting and ending with a letter or digit, no "..", not an IP address.
pub fn check_bucket(b: &str) -> Result<(), String> {
    let rules = "3 to 63 lowercase letters, digits, '.' and '-', starting and ending with a \
                 letter or digit";
    if !(3..=63).contains(&b.len()) {
        return Err(format!(
            "`{b}`: {} characters; a bucket name has {rules}",
            b.len()
        ));
    }
    if !b
        .bytes()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'.' || c == b'-')
    {
        return Err(format!("`{b}`: a bucket name has {rules}"));
    }
    let edge_ok = |c: Option<u8>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if !edge_ok(b.bytes().next()) || !edge_ok(b.bytes().last()) {
        return Err(format!("`{b}`: a bucket name has {rules}"));
    }
    if b.contains("..") {
        return Err(format!("`{b}`: two periods in a row"));
    }
    if b.parse::<std::net::Ipv4Addr>().is_ok() {
        return Err(format!("`{b}`: a bucket name may not be an IP address"));
    }
    Ok(())
}

/// The trimmed content of the machine id file, if it holds one. systemd writes
/// `uninitialized` there early in a first boot: not an id.
fn machine_id(path: &Path) -> Option<String> {
    let text = crate::config::read_small_regular_file(path, 4096).ok()?;
    let id = text.trim();
    (!id.is_empty() && id != "uninitialized").then(|| id.to_string())
}

/// A readable regular file holding at least one PEM certificate.
fn check_ca_file(p: &Path) -> Result<(), String> {
    use crate::config::SmallFileError;
    if !p.is_absolute() {
        return Err(format!("{}: must be an absolute path", p.display()));
    }
    let text = crate::config::read_small_regular_file(p, MAX_CA_BYTES).map_err(|e| match e {
        SmallFileError::Io(io) => format!("{}: cannot read it: {io}", p.display()),
        other => format!("{}: {other}", p.display()),
    })?;
    if !text.contains("-----BEGIN CERTIFICATE-----") || !text.contains("-----END CERTIFICATE-----")
    {
        return Err(format!(
            "{}: holds no PEM certificate (-----BEGIN CERTIFICATE----- ... -----END \
             CERTIFICATE-----)",
            p.display()
        ));
    }
    Ok(())
}

/// Where credentials were found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialSource {
    /// `$CREDENTIALS_DIRECTORY/s3`, at this path.
    Systemd(PathBuf),
    /// `credentials_file`.
    File(PathBuf),
    /// `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`.
    Environment,
}

impl fmt::Display for CredentialSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CredentialSource::Systemd(p) => {
                write!(f, "$CREDENTIALS_DIRECTORY/s3 ({})", p.display())
            }
            CredentialSource::File(p) => write!(f, "credentials_file {}", p.display()),
            CredentialSource::Environment => {
                f.write_str("the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)")
            }
        }
    }
}

/// Why no credentials could be had. Never holds a secret: only the source and the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialsError {
    #[error("credentials from {from}: {problem}")]
    Bad {
        from: CredentialSource,
        problem: String,
    },
    #[error(
        "no credentials: CREDENTIALS_DIRECTORY {directory}, no upload.credentials_file, and \
         AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY are not set"
    )]
    None { directory: String },
}

/// Credentials and where they came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedCredentials {
    pub credentials: Credentials,
    pub from: CredentialSource,
}

/// Everything an uploader needs: the target with its credentials, the key template and the
/// tuning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedUpload {
    pub target: Target,
    pub key: KeyTemplate,
    pub tuning: Tuning,
    pub robot_id: String,
    pub credentials_from: CredentialSource,
}

impl ResolvedUpload {
    /// `to https://s3.example.com/bucket as orin-07, credentials from ...`.
    pub fn summary(&self) -> String {
        format!(
            "to {}/{} as {}, credentials from {}",
            self.target.endpoint, self.target.bucket, self.robot_id, self.credentials_from
        )
    }
}

impl UploadSettings {
    /// Find the credentials (systemd's, the file's, the environment's, in that order) and
    /// build the target.
    pub fn resolve(&self, env: &Environment<'_>) -> Result<ResolvedUpload, CredentialsError> {
        let found = resolve_credentials(self.credentials_file.as_deref(), env)?;
        Ok(ResolvedUpload {
            target: Target {
                endpoint: self.endpoint.clone(),
                region: self.region.clone(),
                bucket: self.bucket.clone(),
                path_style: self.path_style,
                ca_file: self.ca_file.clone(),
                credentials: found.credentials,
            },
            key: self.key.clone(),
            tuning: self.tuning,
            robot_id: self.robot_id.clone(),
            credentials_from: found.from,
        })
    }
}

/// Credentials in precedence order: `$CREDENTIALS_DIRECTORY/s3` if that file exists, else
/// `credentials_file` if set, else the environment. A source that exists but is wrong is an
/// error, never skipped for the next one: the operator meant it.
pub fn resolve_credentials(
    credentials_file: Option<&Path>,
    env: &Environment<'_>,
) -> Result<ResolvedCredentials, CredentialsError> {
    let directory = (env.var)("CREDENTIALS_DIRECTORY");
    if let Some(dir) = &directory {
        let path = Path::new(dir).join(SYSTEMD_CREDENTIAL);
        if path.symlink_metadata().is_ok() {
            let from = CredentialSource::Systemd(path.clone());
            // systemd wrote it (mode 0400, our user, on a private ramfs): trusted as given.
            let bad = |problem: String| CredentialsError::Bad {
                from: from.clone(),
                problem,
            };
            let text = crate::config::read_small_regular_file(&path, MAX_CREDENTIALS_BYTES)
                .map_err(|e| bad(e.to_string()))?;
            let credentials = parse_credentials(&text).map_err(bad)?;
            return Ok(ResolvedCredentials { credentials, from });
        }
    }
    if let Some(path) = credentials_file {
        let from = CredentialSource::File(path.to_path_buf());
        let bad = |problem: String| CredentialsError::Bad {
            from: from.clone(),
            problem,
        };
        let text = read_private_file(path, env.euid).map_err(bad)?;
        let credentials = parse_credentials(&text).map_err(bad)?;
        return Ok(ResolvedCredentials { credentials, from });
    }
    let var = |name: &str| -> Result<Option<String>, CredentialsError> {
        match (env.var)(name) {
            None => Ok(None),
            Some(v) if v.is_empty() => Ok(None),
            Some(v) => v
                .into_string()
                .map(Some)
                .map_err(|_| CredentialsError::Bad {
                    from: CredentialSource::Environment,
                    problem: format!("{name} is not UTF-8"),
                }),
        }
    };
    let id = var("AWS_ACCESS_KEY_ID")?;
    let secret = var("AWS_SECRET_ACCESS_KEY")?;
    let token = var("AWS_SESSION_TOKEN")?;
    let bad = |problem: String| CredentialsError::Bad {
        from: CredentialSource::Environment,
        problem,
    };
    match (id, secret) {
        (Some(id), Some(secret)) => {
            for (name, v) in [
                ("AWS_ACCESS_KEY_ID", Some(&id)),
                ("AWS_SECRET_ACCESS_KEY", Some(&secret)),
                ("AWS_SESSION_TOKEN", token.as_ref()),
            ] {
                if let Some(v) = v {
                    check_credential_text(name, v).map_err(bad)?;
                }
            }
            Ok(ResolvedCredentials {
                credentials: Credentials {
                    access_key_id: id,
                    secret_access_key: secret,
                    session_token: token,
                },
                from: CredentialSource::Environment,
            })
        }
        (Some(_), None) => Err(bad(
            "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not".into(),
        )),
        (None, Some(_)) => Err(bad(
            "AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not".into(),
        )),
        (None, None) => Err(CredentialsError::None {
            directory: match directory {
                Some(d) => format!("{} has no `s3`", Path::new(&d).display()),
                None => "is not set".into(),
            },
        }),
    }
}

/// A credential goes into a header: printable ASCII without spaces. The value is never shown.
fn check_credential_text(name: &str, v: &str) -> Result<(), String> {
    if v.is_empty() {
        return Err(format!("{name} is empty"));
    }
    if !v.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "{name} holds a space or a character that is not printable ASCII"
        ));
    }
    Ok(())
}

/// A file of secrets the operator names: not a symbolic link (its mode and owner would be the
/// link's target's, which is elsewhere), a regular file, owned by us or root, and readable by
/// nobody else (mode 0600 or stricter), as ssh requires of a private key.
fn read_private_file(path: &Path, euid: u32) -> Result<String, String> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new()
        .read(true)
        // NONBLOCK: a FIFO there must not hang the check; NOFOLLOW: see above.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                "is a symbolic link; name the file itself (its mode and owner are checked)".into()
            } else {
                format!("cannot open it: {e}")
            }
        })?;
    let m = f.metadata().map_err(|e| format!("cannot stat it: {e}"))?;
    if !m.is_file() {
        return Err(format!(
            "is {}, not a regular file",
            crate::bag::fsguard::kind(&m.file_type())
        ));
    }
    let mode = m.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "mode {mode:04o} lets group or others read it; chmod 600 it (0600 or stricter)"
        ));
    }
    if m.uid() != euid && m.uid() != 0 {
        return Err(format!(
            "owned by uid {}, neither this user (uid {euid}) nor root",
            m.uid()
        ));
    }
    if m.len() > MAX_CREDENTIALS_BYTES {
        return Err(format!(
            "larger than {MAX_CREDENTIALS_BYTES} bytes; not a credentials file"
        ));
    }
    let mut bytes = Vec::new();
    f.take(MAX_CREDENTIALS_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read it: {e}"))?;
    if bytes.len() as u64 > MAX_CREDENTIALS_BYTES {
        return Err(format!(
            "larger than {MAX_CREDENTIALS_BYTES} bytes; not a credentials file"
        ));
    }
    String::from_utf8(bytes).map_err(|_| "not UTF-8 text".into())
}

/// The AWS shared-credentials format: `name = value` lines, `#`/`;` comments, sections.
///
/// Only the keys before any section and those of `[default]` are read; other profiles are
/// skipped, as AWS's tools do without `AWS_PROFILE`, so a laptop's `~/.aws/credentials` works
/// with `ringbag upload`. Unknown names are skipped too (never shown: a malformed line may be
/// a secret). Errors give line numbers, never text from a line.
pub fn parse_credentials(text: &str) -> Result<Credentials, String> {
    let mut id = None;
    let mut secret = None;
    let mut token = None;
    let mut in_default = true;
    let mut others = 0usize;
    // Editors on Windows start a file with a byte-order mark and end lines with CRLF.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    for (n, line) in text.lines().enumerate() {
        let n = n + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(section) = line.strip_prefix('[') {
            let Some(name) = section.strip_suffix(']') else {
                return Err(format!(
                    "line {n}: a section header without its closing ']'"
                ));
            };
            let name = name.trim();
            in_default = name == "default";
            if !in_default {
                // Counted, not named: errors show nothing read from the file.
                others += 1;
            }
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            return Err(format!("line {n}: not `name = value`"));
        };
        if !in_default {
            continue;
        }
        let slot = match name.trim().to_ascii_lowercase().as_str() {
            "aws_access_key_id" => &mut id,
            "aws_secret_access_key" => &mut secret,
            "aws_session_token" => &mut token,
            _ => continue,
        };
        if slot.is_some() {
            return Err(format!("line {n}: {} is set twice", name.trim()));
        }
        *slot = Some(value.trim().to_string());
    }
    let (id, secret) = match (id, secret) {
        (Some(i), Some(s)) => (i, s),
        (i, _) => {
            let missing = if i.is_none() {
                "aws_access_key_id"
            } else {
                "aws_secret_access_key"
            };
            let elsewhere = match others {
                0 => String::new(),
                n => format!(
                    " (only [default] and keys before any section are read; {n} other \
                     section{} skipped)",
                    if n == 1 { "" } else { "s" }
                ),
            };
            return Err(format!("{missing} is missing{elsewhere}"));
        }
    };
    check_credential_text("aws_access_key_id", &id)?;
    check_credential_text("aws_secret_access_key", &secret)?;
    if let Some(t) = &token {
        check_credential_text("aws_session_token", t)?;
    }
    Ok(Credentials {
        access_key_id: id,
        secret_access_key: secret,
        session_token: token,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const SECRET: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
    const TOKEN: &str = "FwoGZXIvYXdzEXAMPLETOKEN";

    fn raw() -> RawUpload {
        RawUpload {
            endpoint: Some("https://s3.example.com".into()),
            bucket: Some("fleet-bags".into()),
            robot_id: Some("orin-07".into()),
            ..Default::default()
        }
    }

    /// `raw()` with one change.
    fn with(change: impl FnOnce(&mut RawUpload)) -> RawUpload {
        let mut r = raw();
        change(&mut r);
        r
    }

    fn no_machine_id() -> PathBuf {
        PathBuf::from("/nonexistent/ringbag-test/machine-id")
    }

    fn check(r: &RawUpload) -> Result<UploadSettings, SettingError> {
        r.check(&Environment::from_vars(&[], &no_machine_id()))
    }

    fn refused(r: RawUpload) -> String {
        check(&r).unwrap_err().to_string()
    }

    fn private_file(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    fn creds_text(id: &str) -> String {
        format!("# fleet\n[default]\naws_access_key_id = {id}\naws_secret_access_key = {SECRET}\n")
    }

    const BUCKET_RULES: &str = "a bucket name has 3 to 63 lowercase letters, digits, '.' and \
                                '-', starting and ending with a letter or digit";

    #[test]
    fn defaults_are_the_documented_ones() {
        let s = check(&raw()).unwrap();
        assert!(s.enabled);
        assert_eq!(s.endpoint, "https://s3.example.com");
        assert_eq!(s.region, "us-east-1");
        assert!(!s.path_style);
        assert_eq!(s.ca_file, None);
        assert_eq!(s.credentials_file, None);
        assert_eq!(s.key.render("b", "b_0.db3"), "ringbag/orin-07/b/b_0.db3");
        let want = Tuning {
            part_size: 16 << 20,
            concurrency: 2,
            max_rate: None,
            delete_after_upload: false,
        };
        assert_eq!(s.tuning, want);
        assert!(!check(&with(|r| r.enabled = Some(false))).unwrap().enabled);
    }

    #[test]
    fn endpoints_are_normalised_and_anything_but_scheme_host_port_refused() {
        for (text, want) in [
            ("https://S3.Example.com", "https://s3.example.com"),
            (
                "HTTPS://s3.example.com:9000/",
                "https://s3.example.com:9000",
            ),
            ("http://127.0.0.1:3900", "http://127.0.0.1:3900"),
            ("http://127.8.9.10", "http://127.8.9.10"),
            ("http://localhost:3900", "http://localhost:3900"),
            ("http://[::1]:3900", "http://[::1]:3900"),
            ("http://[::ffff:127.0.0.1]:1", "http://[::ffff:127.0.0.1]:1"),
            ("https://[2001:db8::1]", "https://[2001:db8::1]"),
        ] {
            assert_eq!(parse_endpoint(text, false).as_deref(), Ok(want), "{text}");
        }
        let scheme = "must start with https:// (or http:// to a loopback host)";
        let port = |p: &str| format!("port `{p}` is not a number in 1..=65535");
        let plain = |h: &str| {
            format!(
                "plain http:// to {h}, which is not loopback: data and signatures would cross \
                 the network unencrypted; use https://, or set allow_http = true"
            )
        };
        for (text, why) in [
            ("s3.example.com", scheme.to_string()),
            ("ftp://s3.example.com", scheme.to_string()),
            (
                "https://s3.example.com/bucket",
                "has a path; give only scheme://host[:port] (the bucket is the `bucket` key)"
                    .into(),
            ),
            (
                "https://s3.example.com?x=1",
                "has a query (?...); give only scheme://host[:port]".into(),
            ),
            (
                "https://s3.example.com#f",
                "has a fragment (#...); give only scheme://host[:port]".into(),
            ),
            ("https://", "has no host".into()),
            ("https://:443", "has no host".into()),
            ("https://s3.example.com:0", port("0")),
            ("https://s3.example.com:65536", port("65536")),
            ("https://s3.example.com:+1", port("+1")),
            ("https://s3.example.com:", port("")),
            (
                "https://s3 example.com",
                "holds whitespace or a control character".into(),
            ),
            (
                "https://[::1",
                "an IPv6 address needs its closing ']'".into(),
            ),
            ("https://[zz::1]", "`[zz::1]` is not an IPv6 address".into()),
            (
                "https://[::1]x",
                "text after the IPv6 address's ']' that is not :port".into(),
            ),
            (
                "https://s3_x.example.com",
                "host `s3_x.example.com`: a DNS name (letters, digits, '-', dots between \
                 labels) or an IP address (IPv6 in brackets)"
                    .into(),
            ),
            ("http://s3.example.com", plain("s3.example.com")),
            ("http://10.0.0.5:9000", plain("10.0.0.5")),
            ("http://[2001:db8::1]", plain("[2001:db8::1]")),
            (
                "http://localhost.example.com",
                plain("localhost.example.com"),
            ),
        ] {
            assert_eq!(parse_endpoint(text, false), Err(why), "{text}");
        }
        assert_eq!(
            parse_endpoint("http://10.0.0.5:9000", true).as_deref(),
            Ok("http://10.0.0.5:9000")
        );
    }

    #[test]
    fn an_endpoint_with_a_password_is_refused_without_showing_it() {
        let e = parse_endpoint("https://AKIDEXAMPLE:hunter2@s3.example.com", false).unwrap_err();
        assert_eq!(
            e,
            format!("holds a user name or password; {WHERE_CREDENTIALS_GO}")
        );
        assert!(!e.contains("hunter2") && !e.contains("AKIDEXAMPLE"), "{e}");
        let e = refused(with(|r| {
            r.endpoint = Some("https://s3.example.com/?X-Amz-Signature=abc123".into())
        }));
        assert!(e.starts_with("endpoint: ") && !e.contains("abc123"), "{e}");
    }

    #[test]
    fn required_keys_and_bounds_are_refused_with_the_key_and_reason() {
        let part = |n: u64| {
            format!(
                "part_size: {n} bytes is outside 5 MiB..=5 GiB (S3's part sizes; AWS refuses \
                 smaller parts with EntityTooSmall)"
            )
        };
        let cases: Vec<(RawUpload, String)> =
            vec![
            (
                with(|r| r.endpoint = None),
                "endpoint: is required: https://host[:port] of the S3 service".into(),
            ),
            (
                with(|r| r.bucket = None),
                "bucket: is required: the bucket objects go to".into(),
            ),
            (
                with(|r| r.bucket = Some("ab".into())),
                format!("bucket: `ab`: 2 characters; {BUCKET_RULES}"),
            ),
            (
                with(|r| r.bucket = Some("a".repeat(64))),
                format!("bucket: `{}`: 64 characters; {BUCKET_RULES}", "a".repeat(64)),
            ),
            (
                with(|r| r.bucket = Some("Fleet".into())),
                format!("bucket: `Fleet`: {BUCKET_RULES}"),
            ),
            (
                with(|r| r.bucket = Some("fleet_bags".into())),
                format!("bucket: `fleet_bags`: {BUCKET_RULES}"),
            ),
            (
                with(|r| r.bucket = Some("-fleet".into())),
                format!("bucket: `-fleet`: {BUCKET_RULES}"),
            ),
            (
                with(|r| r.bucket = Some("fleet.".into())),
                format!("bucket: `fleet.`: {BUCKET_RULES}"),
            ),
            (
                with(|r| r.bucket = Some("a..b".into())),
                "bucket: `a..b`: two periods in a row".into(),
            ),
            (
                with(|r| r.bucket = Some("192.168.1.1".into())),
                "bucket: `192.168.1.1`: a bucket name may not be an IP address".into(),
            ),
            (
                with(|r| r.region = Some(String::new())),
                "region: must be 1 to 64 characters (e.g. us-east-1, or garage)".into(),
            ),
            (
                with(|r| r.region = Some("us/east".into())),
                "region: `us/east`: use letters, digits, '-' and '_' (e.g. us-east-1)".into(),
            ),
            (
                with(|r| r.max_rate = Some(Quantity::Number(0))),
                "max_rate: 0 bytes/s would never send anything; leave max_rate out for no limit"
                    .into(),
            ),
            (
                with(|r| r.max_rate = Some(Quantity::Text("0MiB/s".into()))),
                "max_rate: 0 bytes/s would never send anything; leave max_rate out for no limit"
                    .into(),
            ),
            (
                with(|r| r.max_rate = Some(Quantity::Text("fast".into()))),
                "max_rate: `fast`: unknown size unit `fast` (use bytes, KiB, MiB, GiB, KB, MB or \
                 GB)"
                .into(),
            ),
            (
                with(|r| r.part_size = Some(Quantity::Text("4MiB".into()))),
                part(4 << 20),
            ),
            (
                with(|r| r.part_size = Some(Quantity::Number((5 << 20) - 1))),
                part((5 << 20) - 1),
            ),
            (
                with(|r| r.part_size = Some(Quantity::Number((5 << 30) + 1))),
                part((5 << 30) + 1),
            ),
            (
                with(|r| r.concurrency = Some(0)),
                "concurrency: 0 is outside 1..=16 (parts in flight)".into(),
            ),
            (
                with(|r| r.concurrency = Some(17)),
                "concurrency: 17 is outside 1..=16 (parts in flight)".into(),
            ),
            (
                with(|r| r.credentials_file = Some("s3.credentials".into())),
                "credentials_file: s3.credentials: must be an absolute path".into(),
            ),
            (
                with(|r| r.ca_file = Some("ca.pem".into())),
                "ca_file: ca.pem: must be an absolute path".into(),
            ),
            (
                with(|r| r.key = Some("{bag}/{file}/{robt}".into())),
                "key: unknown placeholder {robt}; use {robot}, {bag} and {file}".into(),
            ),
            (
                with(|r| r.key = Some("x/{file}".into())),
                "key: must contain {bag}, or files of different bags would overwrite each other"
                    .into(),
            ),
            (
                with(|r| r.robot_id = Some("r".repeat(129))),
                "robot_id: 129 bytes long; at most 128".into(),
            ),
            (
                with(|r| r.key = Some(format!("{}/{{bag}}/{{file}}", "k".repeat(600)))),
                "key: keys would be up to 1112 bytes long for 255-byte bag and file names; S3 \
                 allows 1024"
                    .into(),
            ),
            (
                with(|r| r.robot_id = Some("orin 07".into())),
                "robot_id: robot id \"orin 07\": use letters, digits, '.', '_' and '-' only"
                    .into(),
            ),
        ];
        for (r, want) in cases {
            assert_eq!(refused(r.clone()), want, "{r:?}");
        }
    }

    #[test]
    fn part_size_bounds_are_inclusive_and_rates_take_units() {
        for (q, want) in [
            (Quantity::Text("5MiB".into()), 5 << 20),
            (Quantity::Text("5GiB".into()), 5 << 30),
            (Quantity::Number(8 << 20), 8 << 20),
        ] {
            let s = check(&with(|r| r.part_size = Some(q))).unwrap();
            assert_eq!(s.tuning.part_size, want);
        }
        for (q, want) in [
            (Quantity::Text("2MiB".into()), 2 << 20),
            (Quantity::Text("2MiB/s".into()), 2 << 20),
            (Quantity::Number(1000), 1000),
        ] {
            let s = check(&with(|r| r.max_rate = Some(q))).unwrap();
            assert_eq!(s.tuning.max_rate, Some(want));
        }
        let s = check(&with(|r| {
            r.concurrency = Some(16);
            r.delete_after_upload = Some(true);
            r.path_style = Some(true);
        }))
        .unwrap();
        assert_eq!(s.tuning.concurrency, 16);
        assert!(s.tuning.delete_after_upload && s.path_style);
        assert_eq!(
            check(&with(|r| r.concurrency = Some(1)))
                .unwrap()
                .tuning
                .concurrency,
            1
        );
    }

    #[test]
    fn the_robot_id_falls_back_to_the_machine_id_and_names_both_when_neither_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let mid = dir.path().join("machine-id");
        std::fs::write(&mid, "0123456789abcdef0123456789abcdef\n").unwrap();
        let env = Environment::from_vars(&[], &mid);
        let unset = || with(|r| r.robot_id = None);
        let s = unset().check(&env).unwrap();
        assert_eq!(s.robot_id, "0123456789abcdef0123456789abcdef");
        assert_eq!(s.robot_id_from, RobotIdFrom::MachineId(mid.clone()));
        assert_eq!(
            s.key.render("b", "f"),
            "ringbag/0123456789abcdef0123456789abcdef/b/f"
        );
        // The setting wins over the file.
        let s = raw().check(&env).unwrap();
        assert_eq!(
            (s.robot_id.as_str(), s.robot_id_from),
            ("orin-07", RobotIdFrom::Setting)
        );
        for content in [None, Some(""), Some("  \n"), Some("uninitialized\n")] {
            match content {
                Some(c) => std::fs::write(&mid, c).unwrap(),
                None => std::fs::remove_file(&mid).unwrap(),
            }
            assert_eq!(
                unset().check(&env).unwrap_err().to_string(),
                format!(
                    "robot_id: not set, and {} is missing, empty or uninitialized: set robot_id",
                    mid.display()
                ),
                "{content:?}"
            );
        }
        std::fs::write(&mid, "not/an id\n").unwrap();
        assert_eq!(
            unset().check(&env).unwrap_err().to_string(),
            format!(
                "robot_id: not set, and {} holds no usable id: robot id \"not/an id\": use \
                 letters, digits, '.', '_' and '-' only",
                mid.display()
            )
        );
    }

    #[test]
    fn a_ca_file_must_be_a_readable_file_with_a_pem_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("ca.pem");
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        std::fs::write(&good, pem).unwrap();
        let s = check(&with(|r| r.ca_file = Some(good.clone()))).unwrap();
        assert_eq!(s.ca_file.as_deref(), Some(good.as_path()));
        let key = dir.path().join("key.pem");
        std::fs::write(&key, pem.replace("CERTIFICATE", "PRIVATE KEY")).unwrap();
        let missing = dir.path().join("missing.pem");
        for (p, want) in [
            (
                key.clone(),
                format!(
                    "ca_file: {}: holds no PEM certificate (-----BEGIN CERTIFICATE----- ... \
                     -----END CERTIFICATE-----)",
                    key.display()
                ),
            ),
            (
                missing.clone(),
                format!(
                    "ca_file: {}: cannot read it: No such file or directory (os error 2)",
                    missing.display()
                ),
            ),
            (
                dir.path().to_path_buf(),
                format!(
                    "ca_file: {}: is a directory, not a regular file; not read",
                    dir.path().display()
                ),
            ),
        ] {
            assert_eq!(refused(with(|r| r.ca_file = Some(p))), want);
        }
    }

    #[test]
    fn credentials_come_from_systemd_then_the_file_then_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let creds_dir = dir.path().join("creds");
        std::fs::create_dir(&creds_dir).unwrap();
        // Mode 0444 would be refused for credentials_file; systemd's file is trusted as given.
        private_file(&creds_dir, "s3", &creds_text("FROMSYSTEMD"), 0o444);
        let file = private_file(dir.path(), "s3.credentials", &creds_text("FROMFILE"), 0o600);
        let cd = creds_dir.to_str().unwrap();
        let all = [
            ("CREDENTIALS_DIRECTORY", cd),
            ("AWS_ACCESS_KEY_ID", "FROMENV"),
            ("AWS_SECRET_ACCESS_KEY", SECRET),
        ];
        let got = |vars: &[(&str, &str)], file: Option<&Path>| {
            let env = Environment::from_vars(vars, &no_machine_id());
            resolve_credentials(file, &env).map(|r| (r.credentials.access_key_id, r.from))
        };
        let systemd = CredentialSource::Systemd(creds_dir.join("s3"));
        assert_eq!(got(&all, Some(&file)), Ok(("FROMSYSTEMD".into(), systemd)));
        let from_file = CredentialSource::File(file.clone());
        assert_eq!(
            got(&all[1..], Some(&file)),
            Ok(("FROMFILE".into(), from_file.clone()))
        );
        assert_eq!(
            got(&all[1..], None),
            Ok(("FROMENV".into(), CredentialSource::Environment))
        );
        // A credentials directory without `s3` (systemd may load others) is passed over.
        let empty = dir.path().join("other-creds");
        std::fs::create_dir(&empty).unwrap();
        let vars = [
            ("CREDENTIALS_DIRECTORY", empty.to_str().unwrap()),
            all[1],
            all[2],
        ];
        assert_eq!(got(&vars, Some(&file)), Ok(("FROMFILE".into(), from_file)));
        // A configured source that is wrong is an error, not a reason to use the next one.
        let bad = private_file(dir.path(), "loose", &creds_text("X"), 0o644);
        assert!(matches!(
            got(&all[1..], Some(&bad)),
            Err(CredentialsError::Bad {
                from: CredentialSource::File(_),
                ..
            })
        ));
        std::fs::write(creds_dir.join("s3"), "aws_access_key_id = A\n").unwrap();
        assert_eq!(
            resolve_credentials(Some(&file), &Environment::from_vars(&all, &no_machine_id()))
                .unwrap_err()
                .to_string(),
            format!(
                "credentials from $CREDENTIALS_DIRECTORY/s3 ({}): aws_secret_access_key is \
                 missing",
                creds_dir.join("s3").display()
            )
        );
        // Nothing anywhere: one line naming every place looked at.
        let env = Environment::from_vars(&vars[..1], &no_machine_id());
        assert_eq!(
            resolve_credentials(None, &env).unwrap_err().to_string(),
            format!(
                "no credentials: CREDENTIALS_DIRECTORY {} has no `s3`, no \
                 upload.credentials_file, and AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY are not \
                 set",
                empty.display()
            )
        );
        let env = Environment::from_vars(&[], &no_machine_id());
        assert_eq!(
            resolve_credentials(None, &env).unwrap_err().to_string(),
            "no credentials: CREDENTIALS_DIRECTORY is not set, no upload.credentials_file, and \
             AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY are not set"
        );
        // Half a key pair in the environment is named.
        let env = Environment::from_vars(&all[1..2], &no_machine_id());
        assert_eq!(
            resolve_credentials(None, &env).unwrap_err().to_string(),
            "credentials from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY): \
             AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not"
        );
        // A session token comes along.
        let vars = [all[1], all[2], ("AWS_SESSION_TOKEN", TOKEN)];
        let env = Environment::from_vars(&vars, &no_machine_id());
        let c = resolve_credentials(None, &env).unwrap().credentials;
        assert_eq!(c.session_token.as_deref(), Some(TOKEN));
    }

    #[test]
    fn a_credentials_file_readable_by_others_a_link_or_a_foreign_owner_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let env = Environment::from_vars(&[], &no_machine_id());
        let loose = private_file(dir.path(), "loose", &creds_text("ID"), 0o644);
        let group = private_file(dir.path(), "group", &creds_text("ID"), 0o640);
        let strict = private_file(dir.path(), "strict", &creds_text("ID"), 0o400);
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&strict, &link).unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let err = |p: &Path, env: &Environment| {
            resolve_credentials(Some(p), env).unwrap_err().to_string()
        };
        let from = |p: &Path| format!("credentials from credentials_file {}: ", p.display());
        let mode = |m: &str| {
            format!("mode {m} lets group or others read it; chmod 600 it (0600 or stricter)")
        };
        assert_eq!(err(&loose, &env), from(&loose) + &mode("0644"));
        assert_eq!(err(&group, &env), from(&group) + &mode("0640"));
        assert_eq!(
            err(&link, &env),
            from(&link)
                + "is a symbolic link; name the file itself (its mode and owner are checked)"
        );
        assert_eq!(
            err(&fifo, &env),
            from(&fifo) + "is a FIFO, not a regular file"
        );
        // 0400 is stricter than 0600: fine.
        assert!(resolve_credentials(Some(&strict), &env).is_ok());
        // Owned by another user than the one reading it: refused (root's files are accepted;
        // this test cannot make one unless it runs as root).
        let me = nix::unistd::geteuid().as_raw();
        let other = Environment {
            euid: me + 1,
            ..Environment::from_vars(&[], &no_machine_id())
        };
        if me != 0 {
            assert_eq!(
                err(&strict, &other),
                from(&strict)
                    + &format!(
                        "owned by uid {me}, neither this user (uid {}) nor root",
                        me + 1
                    )
            );
        }
    }

    #[test]
    fn the_credentials_format_is_aws_shared_credentials_with_default_only() {
        let c = parse_credentials(
            "; comment\n# another\n\n  aws_access_key_id=AKID  \nAWS_SECRET_ACCESS_KEY = \
             s3cr3t/+=\naws_session_token = tok\n[work]\naws_access_key_id = WORK\n",
        )
        .unwrap();
        assert_eq!(c.access_key_id, "AKID");
        assert_eq!(c.secret_access_key, "s3cr3t/+=");
        assert_eq!(c.session_token.as_deref(), Some("tok"));
        let c = parse_credentials(
            "[work]\naws_access_key_id = W\naws_secret_access_key = WS\n[default]\n\
             aws_access_key_id = D\naws_secret_access_key = DS\n",
        )
        .unwrap();
        assert_eq!(
            (c.access_key_id.as_str(), c.secret_access_key.as_str()),
            ("D", "DS")
        );
        let c = parse_credentials(
            "\u{feff}[default]\r\naws_access_key_id = W\r\naws_secret_access_key = WS\r\n",
        )
        .unwrap();
        assert_eq!(
            (c.access_key_id, c.secret_access_key),
            ("W".into(), "WS".into())
        );
        for (text, want) in [
            (
                "aws_access_key_id = A\n",
                "aws_secret_access_key is missing",
            ),
            (
                "aws_secret_access_key = S\n",
                "aws_access_key_id is missing",
            ),
            (
                "[work]\naws_access_key_id = A\naws_secret_access_key = S\n[ci]\n",
                "aws_access_key_id is missing (only [default] and keys before any section are \
                 read; 2 other sections skipped)",
            ),
            (
                "aws_access_key_id = \naws_secret_access_key = S\n",
                "aws_access_key_id is empty",
            ),
            (
                "aws_access_key_id = A\naws_secret_access_key = a b\n",
                "aws_secret_access_key holds a space or a character that is not printable ASCII",
            ),
            (
                "aws_access_key_id = A\nAKIDLINEWITHOUTEQUALS\n",
                "line 2: not `name = value`",
            ),
            (
                "[default\n",
                "line 1: a section header without its closing ']'",
            ),
            (
                "aws_access_key_id = A\naws_access_key_id = B\n",
                "line 2: aws_access_key_id is set twice",
            ),
        ] {
            assert_eq!(parse_credentials(text).unwrap_err(), want, "{text}");
        }
    }

    #[test]
    fn a_secret_never_appears_in_an_error_or_in_debug_output() {
        let dir = tempfile::tempdir().unwrap();
        let mut shown = Vec::new();
        let pair = |s: &str| format!("aws_access_key_id = A\naws_secret_access_key = {s}\n");
        // Every way a file holding the secret can be wrong.
        for (name, text, mode) in [
            ("loose", creds_text("AKIDSHOWN"), 0o644),
            (
                "nokey",
                format!("aws_secret_access_key = {SECRET}\n"),
                0o600,
            ),
            ("noeq", format!("aws_access_key_id = A\n{SECRET}\n"), 0o600),
            ("twice", pair(SECRET) + &pair(SECRET), 0o600),
            ("space", pair(&format!("{SECRET} x")), 0o600),
            (
                "token",
                pair("S") + &format!("aws_session_token = {TOKEN}\u{7}\n"),
                0o600,
            ),
            ("section", format!("[{SECRET}]\nfoo = 1\n"), 0o600),
            ("eq", format!("{SECRET}=\n"), 0o600),
        ] {
            let p = private_file(dir.path(), name, &text, mode);
            let env = Environment::from_vars(&[], &no_machine_id());
            let e = resolve_credentials(Some(&p), &env).unwrap_err();
            shown.push(e.to_string());
            shown.push(format!("{e:?}"));
        }
        let env_cases: [&[(&str, &str)]; 3] = [
            &[("AWS_SECRET_ACCESS_KEY", SECRET)],
            &[
                ("AWS_ACCESS_KEY_ID", "A"),
                ("AWS_SECRET_ACCESS_KEY", "bad secret"),
            ],
            &[
                ("AWS_ACCESS_KEY_ID", "A"),
                ("AWS_SECRET_ACCESS_KEY", SECRET),
                ("AWS_SESSION_TOKEN", "tok en"),
            ],
        ];
        for vars in env_cases {
            let env = Environment::from_vars(vars, &no_machine_id());
            let e = resolve_credentials(None, &env).unwrap_err();
            shown.push(e.to_string());
            shown.push(format!("{e:?}"));
        }
        // And the good case's Debug and summary, all the way up.
        let text = format!("{}aws_session_token = {TOKEN}\n", creds_text("AKIDGOOD"));
        let good = private_file(dir.path(), "good", &text, 0o600);
        let env = Environment::from_vars(&[], &no_machine_id());
        let s = check(&with(|r| r.credentials_file = Some(good))).unwrap();
        let r = s.resolve(&env).unwrap();
        shown.push(format!("{s:?}"));
        shown.push(format!("{r:?}"));
        shown.push(r.summary());
        assert!(
            shown.iter().any(|s| s.contains("AKIDGOOD")),
            "the key id is shown"
        );
        for s in &shown {
            for secret in [SECRET, "wJalr", "bad secret", TOKEN, "tok en"] {
                assert!(!s.contains(secret), "{s}");
            }
        }
    }

    #[test]
    fn the_summary_names_endpoint_bucket_robot_and_source() {
        let vars = [
            ("AWS_ACCESS_KEY_ID", "AKID"),
            ("AWS_SECRET_ACCESS_KEY", SECRET),
        ];
        let env = Environment::from_vars(&vars, &no_machine_id());
        let r = check(&raw()).unwrap().resolve(&env).unwrap();
        assert_eq!(
            r.summary(),
            "to https://s3.example.com/fleet-bags as orin-07, credentials from the environment \
             (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
        );
        assert_eq!(r.target.credentials.secret_access_key, SECRET);
        assert_eq!(r.target.region, "us-east-1");
    }

    #[test]
    fn secret_and_tls_skipping_key_names_are_recognised() {
        for k in [
            "access_key",
            "secret_key",
            "aws_secret_access_key",
            "aws_access_key_id",
            "session_token",
            "password",
            "token",
            "Secret",
        ] {
            assert!(is_secret_key(k), "{k}");
        }
        for k in KEYS {
            assert!(!is_secret_key(k) && !is_insecure_key(k), "{k}");
        }
        for k in ["insecure", "tls_verify", "verify_tls", "skip_tls_verify"] {
            assert!(is_insecure_key(k), "{k}");
        }
    }

    #[test]
    fn keys_lists_every_field_of_the_table() {
        // Each listed key, given a value of no type it takes, fails on the type, not as
        // unknown; a key not in KEYS is unknown.
        for k in KEYS {
            let e = toml::from_str::<RawUpload>(&format!("{k} = [[]]\n")).unwrap_err();
            assert!(!e.message().contains("unknown field"), "{k}: {e}");
        }
        let e = toml::from_str::<RawUpload>("endpiont = 1\n").unwrap_err();
        assert!(e.message().contains("unknown field"), "{e}");
        let fields = format!("{:?}", RawUpload::default());
        assert_eq!(fields.matches(": None").count(), KEYS.len(), "{fields}");
    }
}
