//! The S3 calls fleet offload needs, signed by rusty-s3 (presigned URLs, SigV4) and sent by
//! ureq over rustls. One [`S3Client`] per [`Target`]; it is `Sync`, so parts in flight share
//! it (and its pool of connections).
//!
//! Presigned URLs carry a signature in their query: they never appear in an error or a log
//! line. Errors are classified by [`super::error::classify`].

use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::{Duration, SystemTime};

use rusty_s3::{Bucket, S3Action, UrlStyle};
use ureq::tls::{Certificate, PemItem, RootCerts, TlsConfig};

use super::error::{classify, Op, S3ErrorBody};
use super::parts::{bare_etag, base64};
use super::rate::{BodyReader, TokenBucket};
use super::{Target, UploadError};

/// How long a presigned URL stays valid. It is checked when a request starts, so a slow
/// (rate-limited) part only needs it to be valid at its first byte.
const SIGN_FOR: Duration = Duration::from_secs(3600);
/// Timeouts: to connect, and for the server to answer or a socket read/write to progress.
/// A stalled link fails within these and is retried with backoff, never hangs.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Error bodies and listings are small; more than this is not an S3 answer.
const MAX_ANSWER: u64 = 16 << 20;

/// What HEAD says about an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    pub size: u64,
    /// Without quotes, lower case.
    pub etag: String,
}

/// A part the server holds for a multipart upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerPart {
    pub number: u32,
    /// Without quotes, lower case.
    pub etag: String,
    pub size: u64,
}

/// A multipart upload in progress, from ListMultipartUploads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InProgress {
    pub key: String,
    pub upload_id: String,
    /// Unix seconds, when the server says.
    pub initiated: Option<i64>,
}

/// A body to send and how: its bytes (one part, held in memory), their MD5 for
/// `Content-MD5`, the shared bandwidth cap, cancellation and the counter of bytes sent.
pub struct Body<'a> {
    pub bytes: &'a [u8],
    pub md5: [u8; 16],
    pub bucket: Option<&'a TokenBucket>,
    pub cancel: &'a AtomicBool,
    pub sent: &'a AtomicU64,
    /// Also counted as bytes go (the uploader's running total).
    pub total: Option<&'a AtomicU64>,
}

pub struct S3Client {
    bucket: Bucket,
    credentials: rusty_s3::Credentials,
    agent: ureq::Agent,
    endpoint: String,
}

impl std::fmt::Debug for S3Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Client")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket.name())
            .finish_non_exhaustive()
    }
}

impl S3Client {
    /// A client for `target`, with up to `connections` pooled connections. Reads `ca_file`.
    pub fn new(target: &Target, connections: usize) -> Result<S3Client, UploadError> {
        let setup = |detail: String| UploadError::Setup { detail };
        let url: url::Url = target
            .endpoint
            .parse()
            .map_err(|e| setup(format!("endpoint {}: {e}", target.endpoint)))?;
        let style = if target.path_style {
            UrlStyle::Path
        } else {
            UrlStyle::VirtualHost
        };
        let bucket = Bucket::new(url, style, target.bucket.clone(), target.region.clone())
            .map_err(|e| {
                let hint = if target.path_style {
                    ""
                } else {
                    " (virtual-host addressing puts the bucket in a DNS name: use path-style for an IP address)"
                };
                setup(format!(
                    "endpoint {} with bucket {}: {e}{hint}",
                    target.endpoint, target.bucket
                ))
            })?;
        let c = &target.credentials;
        let credentials = match &c.session_token {
            Some(t) => rusty_s3::Credentials::new_with_token(
                c.access_key_id.clone(),
                c.secret_access_key.clone(),
                t.clone(),
            ),
            None => {
                rusty_s3::Credentials::new(c.access_key_id.clone(), c.secret_access_key.clone())
            }
        };
        // Mozilla's roots, plus the CA file's: a private CA must not cut off public ones.
        let mut certs: Vec<Certificate<'static>> = webpki_root_certs::TLS_SERVER_ROOT_CERTS
            .iter()
            .map(|c| Certificate::from_der(c.as_ref()))
            .collect();
        if let Some(path) = &target.ca_file {
            let pem = std::fs::read(path)
                .map_err(|e| setup(format!("ca_file {}: {e}", path.display())))?;
            let before = certs.len();
            for item in ureq::tls::parse_pem(&pem) {
                match item {
                    Ok(PemItem::Certificate(c)) => certs.push(c.to_owned()),
                    Ok(_) => {}
                    Err(e) => return Err(setup(format!("ca_file {}: {e}", path.display()))),
                }
            }
            if certs.len() == before {
                return Err(setup(format!(
                    "ca_file {}: no PEM certificate in it",
                    path.display()
                )));
            }
        }
        let tls = TlsConfig::builder()
            .root_certs(RootCerts::new_with_certs(&certs))
            .unversioned_rustls_crypto_provider(std::sync::Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .build();
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .tls_config(tls)
            .timeout_resolve(Some(CONNECT_TIMEOUT))
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .timeout_send_request(Some(IDLE_TIMEOUT))
            .timeout_per_write(Some(IDLE_TIMEOUT))
            .timeout_per_read(Some(IDLE_TIMEOUT))
            .timeout_recv_response(Some(IDLE_TIMEOUT))
            .max_redirects(0)
            .max_idle_connections_per_host(connections.max(1) + 1)
            .user_agent(concat!("ringbag/", env!("CARGO_PKG_VERSION")))
            .build();
        Ok(S3Client {
            bucket,
            credentials,
            agent: config.into(),
            endpoint: target.endpoint.clone(),
        })
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn bucket_name(&self) -> &str {
        self.bucket.name()
    }

    fn op<'a>(&'a self, key: &'a str, name: &'static str) -> Op<'a> {
        Op {
            endpoint: &self.endpoint,
            bucket: self.bucket.name(),
            key,
            name,
        }
    }

    /// Map a transport error to ours, in our words (ureq's may name the URL).
    fn transport(&self, e: ureq::Error, cancel: Option<&AtomicBool>) -> UploadError {
        if cancel.is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed)) {
            return UploadError::Cancelled;
        }
        let endpoint = self.endpoint.clone();
        let network = |detail: String| UploadError::Network {
            endpoint: endpoint.clone(),
            detail,
        };
        match e {
            ureq::Error::HostNotFound => UploadError::Dns { endpoint },
            ureq::Error::Io(io)
                if io
                    .get_ref()
                    .is_some_and(|inner| inner.is::<rustls::Error>()) =>
            {
                UploadError::Tls {
                    endpoint,
                    detail: io.to_string(),
                }
            }
            ureq::Error::Io(io) => {
                use std::io::ErrorKind as K;
                let what = match io.kind() {
                    K::ConnectionRefused => "connection refused".to_string(),
                    K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe => {
                        "connection reset".to_string()
                    }
                    K::TimedOut | K::WouldBlock => "timed out".to_string(),
                    K::UnexpectedEof => "connection closed by the server".to_string(),
                    _ if io.to_string().contains(super::rate::CANCELLED) => {
                        return UploadError::Cancelled
                    }
                    // std's resolver failure (getaddrinfo) arrives as a plain io error.
                    _ if io.to_string().contains("failed to lookup address") => {
                        return UploadError::Dns { endpoint }
                    }
                    _ => format!("network error: {io}"),
                };
                network(what)
            }
            ureq::Error::Timeout(t) => network(format!("timed out ({t})")),
            ureq::Error::ConnectionFailed => network("connection failed".into()),
            ureq::Error::Protocol(p) => network(format!("HTTP protocol error: {p}")),
            ureq::Error::Tls(s) => UploadError::Tls {
                endpoint,
                detail: s.to_string(),
            },
            ureq::Error::Rustls(r) => UploadError::Tls {
                endpoint,
                detail: r.to_string(),
            },
            ureq::Error::Pem(p) => UploadError::Tls {
                endpoint,
                detail: p.to_string(),
            },
            ureq::Error::BadUri(_) | ureq::Error::Http(_) => UploadError::Setup {
                detail: format!("{endpoint}: cannot build a request for this endpoint"),
            },
            other => {
                let text = other.to_string();
                // Never echo anything that could be a presigned URL.
                if text.contains("X-Amz-") {
                    network("request failed".into())
                } else {
                    network(text)
                }
            }
        }
    }

    /// Send one request; returns status, ETag header and body text of any answer.
    fn call(
        &self,
        op: Op<'_>,
        method: &str,
        url: &url::Url,
        body: Option<&Body<'_>>,
        extra_body: Option<&str>,
    ) -> Result<Answer, UploadError> {
        let url = url.as_str();
        let cancel = body.map(|b| b.cancel);
        let result = match method {
            "GET" => self.agent.get(url).call(),
            "HEAD" => self.agent.head(url).call(),
            "DELETE" => self.agent.delete(url).call(),
            "POST" => match extra_body {
                Some(b) => self
                    .agent
                    .post(url)
                    .header("content-type", "application/xml")
                    .send(b),
                None => self.agent.post(url).send_empty(),
            },
            _ => match body {
                Some(b) => {
                    let mut reader = BodyReader {
                        inner: b.bytes,
                        bucket: b.bucket,
                        cancel: b.cancel,
                        sent: b.sent,
                        total: b.total,
                    };
                    self.agent
                        .put(url)
                        .header("content-length", b.bytes.len().to_string())
                        .header("content-md5", base64(&b.md5))
                        .send(ureq::SendBody::from_reader(&mut reader))
                }
                None => self.agent.put(url).send_empty(),
            },
        };
        let mut resp = result.map_err(|e| self.transport(e, cancel))?;
        let status = resp.status().as_u16();
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let etag = header("etag");
        let length = header("content-length").and_then(|v| v.parse::<u64>().ok());
        let text = if method == "HEAD" {
            String::new()
        } else {
            resp.body_mut()
                .with_config()
                .limit(MAX_ANSWER)
                .read_to_string()
                .map_err(|e| self.transport(e, cancel))?
        };
        let _ = op;
        Ok(Answer {
            status,
            etag,
            length,
            text,
        })
    }

    fn fail(&self, op: Op<'_>, a: &Answer) -> UploadError {
        classify(op, a.status, &S3ErrorBody::parse(&a.text))
    }

    /// The bare ETag of a PUT's answer: a non-200 answer is classified as the failure it
    /// is; a 200 without an ETag is a server we cannot verify against.
    fn etag_of(&self, op: Op<'_>, a: &Answer) -> Result<String, UploadError> {
        if a.status != 200 {
            return Err(self.fail(op, a));
        }
        a.etag
            .as_deref()
            .map(bare_etag)
            .ok_or_else(|| UploadError::BadResponse {
                key: op.key.into(),
                op: op.name,
                detail: "no ETag".into(),
            })
    }

    /// PutObject of a whole (small) file with its Content-MD5; returns the ETag.
    pub fn put_object(&self, key: &str, body: &Body<'_>) -> Result<String, UploadError> {
        let op = self.op(key, "PutObject");
        let url = self
            .bucket
            .put_object(Some(&self.credentials), key)
            .sign(SIGN_FOR);
        let a = self.call(op, "PUT", &url, Some(body), None)?;
        self.etag_of(op, &a)
    }

    pub fn create_multipart(&self, key: &str) -> Result<String, UploadError> {
        let op = self.op(key, "CreateMultipartUpload");
        let url = self
            .bucket
            .create_multipart_upload(Some(&self.credentials), key)
            .sign(SIGN_FOR);
        let a = self.call(op, "POST", &url, None, None)?;
        if a.status != 200 {
            return Err(self.fail(op, &a));
        }
        rusty_s3::actions::CreateMultipartUpload::parse_response(&a.text)
            .map(|r| r.upload_id().to_string())
            .map_err(|e| UploadError::BadResponse {
                key: key.into(),
                op: op.name,
                detail: e.to_string(),
            })
    }

    /// UploadPart with its Content-MD5; returns the ETag (bare).
    pub fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        number: u32,
        body: &Body<'_>,
    ) -> Result<String, UploadError> {
        let op = self.op(key, "UploadPart");
        let n = u16::try_from(number).map_err(|_| UploadError::BadResponse {
            key: key.into(),
            op: op.name,
            detail: format!("part number {number} out of range"),
        })?;
        let url = self
            .bucket
            .upload_part(Some(&self.credentials), key, n, upload_id)
            .sign(SIGN_FOR);
        let a = self.call(op, "PUT", &url, Some(body), None)?;
        self.etag_of(op, &a)
    }

    /// The parts the server holds for `upload_id` (every page); `None` when the server no
    /// longer knows the upload (completed, aborted, or expired by a lifecycle rule).
    pub fn list_parts(
        &self,
        key: &str,
        upload_id: &str,
    ) -> Result<Option<Vec<ServerPart>>, UploadError> {
        let op = self.op(key, "ListParts");
        let mut parts = Vec::new();
        let mut marker: Option<u16> = None;
        loop {
            let mut action = self
                .bucket
                .list_parts(Some(&self.credentials), key, upload_id);
            if let Some(m) = marker {
                action.set_part_number_marker(m);
            }
            let url = action.sign(SIGN_FOR);
            let a = self.call(op, "GET", &url, None, None)?;
            if a.status == 404 {
                let b = S3ErrorBody::parse(&a.text);
                if b.code == "NoSuchUpload" {
                    return Ok(None);
                }
                return Err(classify(op, a.status, &b));
            }
            if a.status != 200 {
                return Err(self.fail(op, &a));
            }
            let r = rusty_s3::actions::ListParts::parse_response(&a.text).map_err(|e| {
                UploadError::BadResponse {
                    key: key.into(),
                    op: op.name,
                    detail: e.to_string(),
                }
            })?;
            parts.extend(r.parts.iter().map(|p| ServerPart {
                number: p.number as u32,
                etag: bare_etag(&p.etag),
                size: p.size,
            }));
            match r.next_part_number_marker {
                Some(m) if marker.is_none_or(|old| m > old) => marker = Some(m),
                Some(_) => {
                    return Err(UploadError::BadResponse {
                        key: key.into(),
                        op: op.name,
                        detail: "the part listing does not advance".into(),
                    })
                }
                None => break,
            }
        }
        Ok(Some(parts))
    }

    /// CompleteMultipartUpload with the parts' ETags in order; returns the object's ETag.
    pub fn complete(
        &self,
        key: &str,
        upload_id: &str,
        etags: &[String],
    ) -> Result<String, UploadError> {
        let op = self.op(key, "CompleteMultipartUpload");
        let action = self.bucket.complete_multipart_upload(
            Some(&self.credentials),
            key,
            upload_id,
            etags.iter().map(String::as_str),
        );
        let url = action.sign(SIGN_FOR);
        let body = action.body();
        let a = self.call(op, "POST", &url, None, Some(&body))?;
        // S3 may answer 200 and put the error in the body (after whitespace keep-alives).
        if a.status != 200 || a.text.contains("<Error>") {
            return Err(self.fail(op, &a));
        }
        Ok(super::xml::text(&a.text, "ETag")
            .map(|e| bare_etag(&e))
            .unwrap_or_default())
    }

    /// AbortMultipartUpload; an upload the server no longer knows counts as aborted.
    pub fn abort(&self, key: &str, upload_id: &str) -> Result<(), UploadError> {
        let op = self.op(key, "AbortMultipartUpload");
        let url = self
            .bucket
            .abort_multipart_upload(Some(&self.credentials), key, upload_id)
            .sign(SIGN_FOR);
        let a = self.call(op, "DELETE", &url, None, None)?;
        match a.status {
            200 | 204 => Ok(()),
            404 if S3ErrorBody::parse(&a.text).code == "NoSuchUpload" => Ok(()),
            _ => Err(self.fail(op, &a)),
        }
    }

    /// ListMultipartUploads under `prefix`, every page. rusty-s3 has no action for it, so a
    /// GetObject action on the bucket's own URL (key "") carries its query: the same
    /// signed GET of `/bucket/?uploads&prefix=…`.
    pub fn list_uploads(&self, prefix: &str) -> Result<Vec<InProgress>, UploadError> {
        let op = self.op(prefix, "ListMultipartUploads");
        let mut out = Vec::new();
        let mut key_marker = String::new();
        let mut id_marker = String::new();
        for _page in 0..10_000 {
            let mut action = self.bucket.get_object(Some(&self.credentials), "");
            let q = action.query_mut();
            if !key_marker.is_empty() {
                q.insert("key-marker", key_marker.clone());
            }
            q.insert("prefix", prefix.to_string());
            if !id_marker.is_empty() {
                q.insert("upload-id-marker", id_marker.clone());
            }
            q.insert("uploads", "");
            let url = action.sign(SIGN_FOR);
            let a = self.call(op, "GET", &url, None, None)?;
            if a.status != 200 {
                return Err(self.fail(op, &a));
            }
            for u in super::xml::blocks(&a.text, "Upload") {
                let (Some(key), Some(upload_id)) =
                    (super::xml::text(u, "Key"), super::xml::text(u, "UploadId"))
                else {
                    continue;
                };
                let initiated =
                    super::xml::text(u, "Initiated").and_then(|t| super::error::parse_s3_time(&t));
                out.push(InProgress {
                    key,
                    upload_id,
                    initiated,
                });
            }
            let truncated = super::xml::text(&a.text, "IsTruncated").as_deref() == Some("true");
            if !truncated {
                return Ok(out);
            }
            let next_key = super::xml::text(&a.text, "NextKeyMarker").unwrap_or_default();
            let next_id = super::xml::text(&a.text, "NextUploadIdMarker").unwrap_or_default();
            if next_key.is_empty() || (next_key == key_marker && next_id == id_marker) {
                return Err(UploadError::BadResponse {
                    key: prefix.into(),
                    op: op.name,
                    detail: "the upload listing does not advance".into(),
                });
            }
            key_marker = next_key;
            id_marker = next_id;
        }
        Ok(out)
    }

    /// HEAD: size and ETag of `key`, or `None` when there is no such object.
    pub fn head(&self, key: &str) -> Result<Option<ObjectInfo>, UploadError> {
        let op = self.op(key, "HeadObject");
        let url = self
            .bucket
            .head_object(Some(&self.credentials), key)
            .sign(SIGN_FOR);
        let a = self.call(op, "HEAD", &url, None, None)?;
        match a.status {
            200 => Ok(Some(ObjectInfo {
                size: a.length.unwrap_or(0),
                etag: a.etag.map(|e| bare_etag(&e)).unwrap_or_default(),
            })),
            404 => Ok(None),
            _ => Err(self.fail(op, &a)),
        }
    }

    /// GET a whole object (tests and tools; not for large objects).
    pub fn get(&self, key: &str) -> Result<Vec<u8>, UploadError> {
        let op = self.op(key, "GetObject");
        let url = self
            .bucket
            .get_object(Some(&self.credentials), key)
            .sign(SIGN_FOR);
        let resp = self
            .agent
            .get(url.as_str())
            .call()
            .map_err(|e| self.transport(e, None))?;
        let status = resp.status().as_u16();
        let mut bytes = Vec::new();
        resp.into_body()
            .into_reader()
            .read_to_end(&mut bytes)
            .map_err(|e| self.transport(ureq::Error::Io(e), None))?;
        if status != 200 {
            let a = Answer {
                status,
                etag: None,
                length: None,
                text: String::from_utf8_lossy(&bytes).into_owned(),
            };
            return Err(self.fail(op, &a));
        }
        Ok(bytes)
    }

    /// A cheap request that proves the endpoint, the credentials and the bucket work
    /// (ListMultipartUploads under a key prefix no object has).
    pub fn probe(&self) -> Result<(), UploadError> {
        self.list_uploads("ringbag-probe/").map(|_| ())
    }
}

struct Answer {
    status: u16,
    etag: Option<String>,
    length: Option<u64>,
    text: String,
}

/// Unix seconds of `t`.
pub fn unix_s(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}
