//! Fleet offload: closed splits and snapshots to S3-compatible object storage (issue 24).
//!
//! The types here are shared by the configuration (`[upload]` in ringbag.toml, `ringbag
//! upload`'s flags) and the uploader: where objects go ([`Target`]), under which names
//! ([`KeyTemplate`]), and how fast ([`Tuning`]).

pub mod settings;

use std::fmt;
use std::path::PathBuf;

pub mod agent;
pub mod backoff;
pub mod client;
pub mod engine;
pub mod error;
pub mod journal;
pub mod md5;
pub mod parts;
pub mod rate;
mod xml;

pub use engine::{plan_root, BagOutcome, FileOutcome, PlannedBag, Uploader};
pub use error::{ErrorClass, UploadError};

/// The default object key template.
pub const DEFAULT_KEY_TEMPLATE: &str = "ringbag/{robot}/{bag}/{file}";
/// The default multipart part size: 16 MiB.
pub const DEFAULT_PART_SIZE: u64 = 16 * 1024 * 1024;
/// The default number of parts in flight.
pub const DEFAULT_CONCURRENCY: usize = 2;
/// S3's longest object key, in bytes of UTF-8.
pub const MAX_KEY_BYTES: usize = 1024;
/// The longest name a bag directory or a file in it can have (NAME_MAX).
const MAX_NAME_BYTES: usize = 255;

/// An access key. Never logged: `Debug` shows the key id only, never the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    /// For temporary credentials (STS); sent as `x-amz-security-token`.
    pub session_token: Option<String>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// Where objects go. Built from `[upload]` or from `ringbag upload`'s flags, after the
/// endpoint policy was checked (plain http only to loopback or with `allow_http`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `https://host[:port]` or `http://127.0.0.1:port`, without a path.
    pub endpoint: String,
    pub region: String,
    pub bucket: String,
    /// Path-style addressing (`endpoint/bucket/key`) rather than virtual-host style
    /// (`bucket.endpoint/key`). MinIO, Garage and Ceph on an IP address need it.
    pub path_style: bool,
    /// Extra CA certificates (PEM) to trust beside the system's, for a private endpoint.
    pub ca_file: Option<PathBuf>,
    pub credentials: Credentials,
}

/// How uploads run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// Bytes per multipart part; files larger than this go multipart.
    pub part_size: u64,
    /// Parts in flight at once.
    pub concurrency: usize,
    /// Bytes per second over all transfers (a token bucket); `None` is unlimited.
    pub max_rate: Option<u64>,
    /// Delete a file as soon as it is verified in the bucket.
    pub delete_after_upload: bool,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            part_size: DEFAULT_PART_SIZE,
            concurrency: DEFAULT_CONCURRENCY,
            max_rate: None,
            delete_after_upload: false,
        }
    }
}

/// The object key of a file: a template over `{robot}`, `{bag}` (the bag directory's name)
/// and `{file}` (the file's name in it). Deterministic, so a retry overwrites, never
/// duplicates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyTemplate {
    template: String,
    robot: String,
}

/// Why a key template is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyTemplateError {
    #[error("must contain {{file}}, or every file of a bag would get the same key")]
    NoFile,
    #[error("must contain {{bag}}, or files of different bags would overwrite each other")]
    NoBag,
    #[error("unknown placeholder {0}; use {{robot}}, {{bag}} and {{file}}")]
    Unknown(String),
    #[error("must not start with '/'")]
    Absolute,
    #[error("robot id {0:?}: use letters, digits, '.', '_' and '-' only")]
    BadRobot(String),
    #[error("holds a control character")]
    Control,
    #[error(
        "has an empty, '.' or '..' path segment; tools that normalise paths would change the key"
    )]
    Segment,
    #[error("keys would be up to {0} bytes long for 255-byte bag and file names; S3 allows 1024")]
    TooLong(usize),
}

impl KeyTemplate {
    /// Check `template` and fix the robot id it fills in.
    pub fn new(template: &str, robot: &str) -> Result<Self, KeyTemplateError> {
        if robot.is_empty()
            || !robot
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
            || robot == "."
            || robot == ".."
        {
            return Err(KeyTemplateError::BadRobot(robot.to_string()));
        }
        if template.starts_with('/') {
            return Err(KeyTemplateError::Absolute);
        }
        if template.chars().any(char::is_control) {
            return Err(KeyTemplateError::Control);
        }
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            let Some(close) = rest[open..].find('}') else {
                return Err(KeyTemplateError::Unknown(rest[open..].to_string()));
            };
            let name = &rest[open..open + close + 1];
            if !matches!(name, "{robot}" | "{bag}" | "{file}") {
                return Err(KeyTemplateError::Unknown(name.to_string()));
            }
            rest = &rest[open + close + 1..];
        }
        if !template.contains("{file}") {
            return Err(KeyTemplateError::NoFile);
        }
        if !template.contains("{bag}") {
            return Err(KeyTemplateError::NoBag);
        }
        // "a//b", "a/./b", "a/../b" are distinct S3 keys that many clients normalise into
        // one (or refuse); a trailing '/' would make the key look like a folder.
        if template
            .split('/')
            .any(|seg| seg.is_empty() || seg == "." || seg == "..")
        {
            return Err(KeyTemplateError::Segment);
        }
        let t = KeyTemplate {
            template: template.to_string(),
            robot: robot.to_string(),
        };
        let longest = "x".repeat(MAX_NAME_BYTES);
        let n = t.render(&longest, &longest).len();
        if n > MAX_KEY_BYTES {
            return Err(KeyTemplateError::TooLong(n));
        }
        Ok(t)
    }

    /// The fixed start of every key (robot filled in, up to the first `{bag}` or `{file}`):
    /// the prefix under which all of this robot's uploads live.
    pub fn prefix(&self) -> String {
        let cut = [self.template.find("{bag}"), self.template.find("{file}")]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(self.template.len());
        self.template[..cut].replace("{robot}", &self.robot)
    }

    /// The object key of `file` in the bag directory named `bag`. One pass over the template:
    /// a placeholder's text inside a name (a bag called `x{file}`) stays as it is.
    pub fn render(&self, bag: &str, file: &str) -> String {
        let mut out = String::with_capacity(self.template.len() + bag.len() + file.len());
        let mut rest = self.template.as_str();
        while let Some(open) = rest.find('{') {
            out.push_str(&rest[..open]);
            rest = &rest[open..];
            let found = [
                ("{robot}", self.robot.as_str()),
                ("{bag}", bag),
                ("{file}", file),
            ]
            .into_iter()
            .find_map(|(name, value)| rest.strip_prefix(name).map(|after| (value, after)));
            match found {
                Some((value, after)) => {
                    out.push_str(value);
                    rest = after;
                }
                // `new` accepted only the three placeholders; a lone '{' stays text.
                None => {
                    out.push('{');
                    rest = &rest[1..];
                }
            }
        }
        out.push_str(rest);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_template_names_robot_bag_and_file() {
        let t = KeyTemplate::new(DEFAULT_KEY_TEMPLATE, "orin-07").unwrap();
        assert_eq!(
            t.render(
                "rosbag2_2026_12_04-10_00_00",
                "rosbag2_2026_12_04-10_00_00_3.db3"
            ),
            "ringbag/orin-07/rosbag2_2026_12_04-10_00_00/rosbag2_2026_12_04-10_00_00_3.db3"
        );
    }

    #[test]
    fn templates_that_would_collide_or_are_misspelt_are_refused() {
        assert_eq!(
            KeyTemplate::new("x/{bag}", "r"),
            Err(KeyTemplateError::NoFile)
        );
        assert_eq!(
            KeyTemplate::new("x/{file}", "r"),
            Err(KeyTemplateError::NoBag)
        );
        assert_eq!(
            KeyTemplate::new("{robt}/{bag}/{file}", "r"),
            Err(KeyTemplateError::Unknown("{robt}".into()))
        );
        assert_eq!(
            KeyTemplate::new("/{bag}/{file}", "r"),
            Err(KeyTemplateError::Absolute)
        );
        assert!(matches!(
            KeyTemplate::new(DEFAULT_KEY_TEMPLATE, "a/b"),
            Err(KeyTemplateError::BadRobot(_))
        ));
    }

    #[test]
    fn a_placeholder_inside_a_name_is_not_substituted_again() {
        let t = KeyTemplate::new("{robot}/{bag}/{file}", "r").unwrap();
        assert_eq!(
            t.render("a{file}{robot}", "f{bag}"),
            "r/a{file}{robot}/f{bag}"
        );
    }

    #[test]
    fn keys_that_could_exceed_s3s_limit_or_be_normalised_away_are_refused() {
        // 8 + 1 + 255 + 1 + 255 = 520 bytes of template around the robot: a 504-byte robot
        // fits 1024 exactly, one more does not.
        assert!(KeyTemplate::new("ringbag/{robot}/{bag}/{file}", &"r".repeat(504)).is_ok());
        assert_eq!(
            KeyTemplate::new("ringbag/{robot}/{bag}/{file}", &"r".repeat(505)),
            Err(KeyTemplateError::TooLong(1025))
        );
        assert_eq!(
            KeyTemplate::new("{bag}/{file}/{bag}/{file}/{bag}", "r"),
            Err(KeyTemplateError::TooLong(1279))
        );
        for bad in [
            "a//{bag}/{file}",
            "a/./{bag}/{file}",
            "../{bag}/{file}",
            "{bag}/{file}/",
        ] {
            assert_eq!(
                KeyTemplate::new(bad, "r"),
                Err(KeyTemplateError::Segment),
                "{bad}"
            );
        }
        assert_eq!(
            KeyTemplate::new("a\n/{bag}/{file}", "r"),
            Err(KeyTemplateError::Control)
        );
        assert_eq!(
            KeyTemplate::new("{bag}/{file", "r"),
            Err(KeyTemplateError::Unknown("{file".into()))
        );
    }

    #[test]
    fn credentials_never_show_their_secret() {
        let c = Credentials {
            access_key_id: "GK123".into(),
            secret_access_key: "s3cr3t".into(),
            session_token: Some("tok3n".into()),
        };
        let shown = format!("{c:?}");
        assert!(shown.contains("GK123"));
        assert!(
            !shown.contains("s3cr3t") && !shown.contains("tok3n"),
            "{shown}"
        );
    }
}
