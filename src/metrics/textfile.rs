//! `metrics_textfile`: the exposition written for node_exporter's textfile collector.
//!
//! Replaced whole by a rename, so the collector never reads a half-written file (it would
//! fail the whole scrape). The temporary file's name does not end in `.prom`: the collector
//! would otherwise read it too. No fsync: after a power cut a stale or missing file only
//! means no metrics until the next interval, and fsyncs every few seconds would cost the
//! recording's disk more than the metrics are worth.

use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
#[error("metrics_textfile {path}: {action}: {source}")]
pub struct TextfileError {
    pub path: PathBuf,
    pub action: &'static str,
    #[source]
    pub source: std::io::Error,
}

/// Write `text` to `path` atomically (a temporary file in the same directory, renamed).
pub fn write(path: &Path, text: &str) -> Result<(), TextfileError> {
    let err = |action| {
        move |source| TextfileError {
            path: path.to_path_buf(),
            action,
            source,
        }
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp).map_err(err("cannot create its temporary file"))?;
        f.write_all(text.as_bytes()).map_err(err("cannot write"))?;
        std::fs::rename(&tmp, path).map_err(err("cannot rename into place"))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_replaced_whole_and_no_temporary_file_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ringbag.prom");
        write(&path, "ringbag_up 1\n").unwrap();
        write(&path, "ringbag_up 1\nringbag_x 2\n").unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "ringbag_up 1\nringbag_x 2\n"
        );
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("ringbag.prom")]);
    }

    #[test]
    fn a_missing_directory_is_one_error_naming_the_file() {
        let e = write(Path::new("/nonexistent/dir/ringbag.prom"), "x").unwrap_err();
        let m = e.to_string();
        assert!(
            m.starts_with("metrics_textfile /nonexistent/dir/ringbag.prom: cannot create"),
            "{m}"
        );
    }
}
