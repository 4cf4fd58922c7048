//! What can go wrong while uploading, classified so that callers choose a policy: retry a
//! transient failure with backoff, name a configuration error as what it is (and retry it
//! only at the cap rate, so that fixed credentials recover), give up on the rest.
//!
//! No message carries a secret or a presigned URL (its query holds a signature): errors are
//! built from our own words, the S3 error code and message, and the key.

use std::path::PathBuf;
use std::time::Duration;

/// Every value [`UploadError::kind`] gives, in the order the metrics list them.
pub const ERROR_KINDS: [&str; 8] = [
    "configuration",
    "network",
    "server",
    "refused",
    "verify",
    "file",
    "journal",
    "metadata_withheld",
];

/// How a caller should treat an [`UploadError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The network or the server had a bad moment: retry with backoff.
    Transient,
    /// The target is misconfigured (credentials, bucket, clock, TLS, DNS): retrying soon will
    /// not help; a person has to fix something.
    Configuration,
    /// This file cannot be uploaded as it is (too large, changed, unreadable).
    Permanent,
    /// The upload was cancelled through the cancellation flag.
    Cancelled,
}

#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error("{endpoint}: credentials refused ({code}: {message})")]
    CredentialsRefused {
        endpoint: String,
        code: String,
        message: String,
    },
    #[error("bucket {bucket} does not exist at {endpoint}")]
    NoSuchBucket { endpoint: String, bucket: String },
    #[error("the clock is off by {}: {endpoint} refused the request time (RequestTimeTooSkewed); set the system time (NTP/PTP)", skew_text(*.skew))]
    ClockSkewed {
        endpoint: String,
        /// Server time minus our time, when the answer says (positive: we are behind).
        skew: Option<i64>,
    },
    #[error("{endpoint}: TLS failed: {detail}")]
    Tls { endpoint: String, detail: String },
    #[error("{endpoint}: host not found (DNS)")]
    Dns { endpoint: String },
    #[error("{endpoint}: {detail}")]
    Network { endpoint: String, detail: String },
    #[error("{key}: {op}: server error {status} {code}: {message}")]
    Server {
        key: String,
        op: &'static str,
        status: u16,
        code: String,
        message: String,
    },
    #[error("{key}: {op}: refused with {status} {code}: {message}")]
    Refused {
        key: String,
        op: &'static str,
        status: u16,
        code: String,
        message: String,
    },
    #[error("{key}: {op}: unexpected answer: {detail}")]
    BadResponse {
        key: String,
        op: &'static str,
        detail: String,
    },
    #[error("{key}: the object in the bucket does not match the file ({detail})")]
    VerifyFailed { key: String, detail: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: changed while it was being uploaded", path.display())]
    FileChanged { path: PathBuf },
    #[error("{}: gone before it was uploaded", path.display())]
    FileGone { path: PathBuf },
    #[error("{}: {size} bytes is more than an S3 object may hold (5 TiB)", path.display())]
    TooLarge { path: PathBuf, size: u64 },
    #[error("{}: {detail}", path.display())]
    Journal { path: PathBuf, detail: String },
    #[error("{detail}")]
    Setup { detail: String },
    #[error("metadata.yaml withheld: {missing} split(s) of the bag are not in the bucket yet")]
    MetadataWithheld { missing: usize },
    #[error("cancelled")]
    Cancelled,
}

fn skew_text(skew: Option<i64>) -> String {
    match skew {
        Some(s) if s >= 0 => format!("{s} s (behind the server)"),
        Some(s) => format!("{} s (ahead of the server)", -s),
        None => "more than the server allows (15 min for AWS)".into(),
    }
}

impl UploadError {
    pub fn class(&self) -> ErrorClass {
        use UploadError::*;
        match self {
            CredentialsRefused { .. }
            | NoSuchBucket { .. }
            | ClockSkewed { .. }
            | Tls { .. }
            | Dns { .. }
            | Setup { .. } => ErrorClass::Configuration,
            Network { .. } | Server { .. } | BadResponse { .. } | VerifyFailed { .. } => {
                ErrorClass::Transient
            }
            // A journal that cannot be written is a full or failing disk: it may pass.
            Journal { .. } => ErrorClass::Transient,
            Refused { .. }
            | Io { .. }
            | FileChanged { .. }
            | FileGone { .. }
            | TooLarge { .. }
            // Follows a split's failure, which is reported (and retried) on its own.
            | MetadataWithheld { .. } => ErrorClass::Permanent,
            Cancelled => ErrorClass::Cancelled,
        }
    }

    /// The failure's kind for the `ringbag_upload_errors_total{kind}` counter: one of
    /// [`ERROR_KINDS`]; `None` for a cancellation (not a failure).
    pub fn kind(&self) -> Option<&'static str> {
        use UploadError::*;
        Some(match self {
            CredentialsRefused { .. }
            | NoSuchBucket { .. }
            | ClockSkewed { .. }
            | Tls { .. }
            | Dns { .. }
            | Setup { .. } => "configuration",
            Network { .. } => "network",
            Server { .. } | BadResponse { .. } => "server",
            Refused { .. } => "refused",
            VerifyFailed { .. } => "verify",
            Io { .. } | FileChanged { .. } | FileGone { .. } | TooLarge { .. } => "file",
            Journal { .. } => "journal",
            MetadataWithheld { .. } => "metadata_withheld",
            Cancelled => return None,
        })
    }

    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> UploadError {
        let path = path.into();
        move |source| UploadError::Io { path, source }
    }
}

/// An S3 error answer: status, `<Code>`, `<Message>`, and what the clock fields say.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct S3ErrorBody {
    pub code: String,
    pub message: String,
    /// `<ServerTime>` minus `<RequestTime>` in seconds, for `RequestTimeTooSkewed`.
    pub skew: Option<i64>,
}

impl S3ErrorBody {
    pub fn parse(xml: &str) -> S3ErrorBody {
        let code = super::xml::text(xml, "Code").unwrap_or_default();
        let message = super::xml::text(xml, "Message").unwrap_or_default();
        let skew = match (
            super::xml::text(xml, "ServerTime").and_then(|t| parse_s3_time(&t)),
            super::xml::text(xml, "RequestTime").and_then(|t| parse_s3_time(&t)),
        ) {
            (Some(server), Some(request)) => Some(server - request),
            _ => None,
        };
        S3ErrorBody {
            code,
            message,
            skew,
        }
    }
}

/// Seconds since the epoch of the time formats S3 uses (`2026-12-04T09:00:00.000Z`,
/// `20261204T090000Z`).
pub fn parse_s3_time(t: &str) -> Option<i64> {
    let t = t.trim();
    if let Ok(d) = chrono::DateTime::parse_from_rfc3339(t) {
        return Some(d.timestamp());
    }
    chrono::NaiveDateTime::parse_from_str(t, "%Y%m%dT%H%M%SZ")
        .ok()
        .map(|d| d.and_utc().timestamp())
}

/// Which S3 operation on which key: the context of an answer.
#[derive(Debug, Clone, Copy)]
pub struct Op<'a> {
    pub endpoint: &'a str,
    pub bucket: &'a str,
    pub key: &'a str,
    pub name: &'static str,
}

/// The error of an answer with status `status` (≥ 300) and body `body`.
pub fn classify(op: Op<'_>, status: u16, body: &S3ErrorBody) -> UploadError {
    let code = body.code.as_str();
    let message = if body.message.is_empty() {
        "(no message)".to_string()
    } else {
        body.message.clone()
    };
    match code {
        "InvalidAccessKeyId"
        | "SignatureDoesNotMatch"
        | "AccessDenied"
        | "InvalidToken"
        | "ExpiredToken"
        | "InvalidSecurity" => UploadError::CredentialsRefused {
            endpoint: op.endpoint.to_string(),
            code: code.to_string(),
            message,
        },
        "NoSuchBucket" => UploadError::NoSuchBucket {
            endpoint: op.endpoint.to_string(),
            bucket: op.bucket.to_string(),
        },
        "RequestTimeTooSkewed" => UploadError::ClockSkewed {
            endpoint: op.endpoint.to_string(),
            skew: body.skew,
        },
        _ if status == 403 && code.is_empty() => UploadError::CredentialsRefused {
            endpoint: op.endpoint.to_string(),
            code: "403".into(),
            message,
        },
        _ if status >= 500
            || status == 429
            || status == 408
            || matches!(
                code,
                "SlowDown" | "RequestTimeout" | "InternalError" | "ServiceUnavailable"
            ) =>
        {
            UploadError::Server {
                key: op.key.to_string(),
                op: op.name,
                status,
                code: code.to_string(),
                message,
            }
        }
        _ => UploadError::Refused {
            key: op.key.to_string(),
            op: op.name,
            status,
            code: code.to_string(),
            message,
        },
    }
}

/// How long since a unix time in seconds, for "older than 24 h".
pub fn age_of(unix_s: i64, now: std::time::SystemTime) -> Duration {
    let now_s = now
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    Duration::from_secs(now_s.saturating_sub(unix_s).max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_failure_has_a_kind_of_the_listed_ones_and_configuration_matches_its_class() {
        let errors = [
            UploadError::Dns {
                endpoint: "e".into(),
            },
            UploadError::Setup { detail: "d".into() },
            UploadError::Network {
                endpoint: "e".into(),
                detail: "d".into(),
            },
            UploadError::BadResponse {
                key: "k".into(),
                op: "put",
                detail: "d".into(),
            },
            UploadError::VerifyFailed {
                key: "k".into(),
                detail: "d".into(),
            },
            UploadError::FileGone { path: "/f".into() },
            UploadError::Journal {
                path: "/j".into(),
                detail: "d".into(),
            },
            UploadError::MetadataWithheld { missing: 1 },
        ];
        let kinds: Vec<_> = errors.iter().map(|e| e.kind().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "configuration",
                "configuration",
                "network",
                "server",
                "verify",
                "file",
                "journal",
                "metadata_withheld"
            ]
        );
        for e in &errors {
            assert!(ERROR_KINDS.contains(&e.kind().unwrap()));
            assert_eq!(
                e.kind() == Some("configuration"),
                e.class() == ErrorClass::Configuration,
                "{e}"
            );
        }
        assert_eq!(UploadError::Cancelled.kind(), None);
    }

    const OP: Op<'static> = Op {
        endpoint: "https://s3.example.com",
        bucket: "fleet",
        key: "ringbag/r/b/f.db3",
        name: "PutObject",
    };

    fn err(status: u16, xml: &str) -> UploadError {
        classify(OP, status, &S3ErrorBody::parse(xml))
    }

    #[test]
    fn a_skewed_clock_is_named_with_its_offset() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<Error><Code>RequestTimeTooSkewed</Code><Message>The difference between the request time and the current time is too large.</Message><RequestTime>20261204T090000Z</RequestTime><ServerTime>2026-12-04T10:00:05Z</ServerTime><MaxAllowedSkewMilliseconds>900000</MaxAllowedSkewMilliseconds></Error>"#;
        let e = err(403, xml);
        assert!(
            matches!(
                e,
                UploadError::ClockSkewed {
                    skew: Some(3605),
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(e.class(), ErrorClass::Configuration);
        let line = e.to_string();
        assert!(line.contains("the clock is off by 3605 s"), "{line}");
        assert!(!line.contains('\n'));
    }

    #[test]
    fn refused_credentials_missing_buckets_and_throttling_are_told_apart() {
        for code in [
            "InvalidAccessKeyId",
            "SignatureDoesNotMatch",
            "AccessDenied",
        ] {
            let e = err(
                403,
                &format!("<Error><Code>{code}</Code><Message>no</Message></Error>"),
            );
            assert!(e.to_string().contains("credentials refused"), "{e}");
            assert_eq!(e.class(), ErrorClass::Configuration);
        }
        let e = err(
            404,
            "<Error><Code>NoSuchBucket</Code><Message>x</Message></Error>",
        );
        assert_eq!(
            e.to_string(),
            "bucket fleet does not exist at https://s3.example.com"
        );
        assert_eq!(e.class(), ErrorClass::Configuration);
        for (status, code) in [
            (503, "SlowDown"),
            (429, ""),
            (500, "InternalError"),
            (502, ""),
        ] {
            let e = err(status, &format!("<Error><Code>{code}</Code></Error>"));
            assert_eq!(e.class(), ErrorClass::Transient, "{status} {code}: {e}");
        }
        let e = err(
            400,
            "<Error><Code>EntityTooSmall</Code><Message>small</Message></Error>",
        );
        assert_eq!(e.class(), ErrorClass::Permanent);
        assert!(e.to_string().contains("EntityTooSmall"));
        // A 403 without a body (HEAD) is still a refusal of the credentials.
        assert!(matches!(
            err(403, ""),
            UploadError::CredentialsRefused { .. }
        ));
    }

    #[test]
    fn escaped_text_in_error_xml_is_unescaped() {
        let b = S3ErrorBody::parse(
            "<Error><Code>X</Code><Message>a &lt;b&gt; &amp; &quot;c&quot;</Message></Error>",
        );
        assert_eq!(b.message, "a <b> & \"c\"");
    }
}
