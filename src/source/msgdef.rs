//! Message definitions as rosbag2 Jazzy stores them in the `message_definitions` table, so that
//! bags are self-describing: Foxglove, `rosbags` and `ros2 bag play` on a machine without the
//! interface packages decode them from the bag alone.
//!
//! This follows rosbag2_cpp's `LocalMessageDefinitionSource` (Jazzy, 0.26) byte for byte:
//! - the root type's `.msg` text verbatim, then every nested type not seen yet, depth first,
//!   in sorted order per file, each after a newline, 80 `=`, a newline and `MSG: <name>` with
//!   the name exactly as the referring file writes it (`builtin_interfaces/Time`);
//! - when any `.msg` of the tree is missing, the whole tree again from `.idl` files (nested
//!   types from `#include <pkg/msg/Type.idl>`), every part after the separator and
//!   `IDL: <name>`, the root included; encoding `ros2idl`;
//! - when that fails too, or the name is not `pkg/Type` / `pkg/msg/Type`, encoding `unknown`
//!   with an empty text (rosbag2's `empty_message_definition_for`);
//! - nesting deeper than [`MAX_RECURSION_DEPTH`] levels is an error (rosbag2 throws; we store
//!   `unknown`);
//! - `pkg/srv/Type` names take rosbag2's service path (`SRV: ` header first), for service event
//!   topics.
//!
//! Where the files come from is behind [`DefinitionFiles`]: the installed packages on
//! `AMENT_PREFIX_PATH` ([`AmentPrefixPath`], for live topics) or the .msg files embedded for the
//! synthetic source ([`EmbeddedFiles`]). There is one composition for both, so the synthetic
//! bags and live bags describe a type with the same bytes.
//!
//! No ROS dependency: compiled in every build, so CI tests it without ROS.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use crate::bag::MessageDefinition;

/// rosbag2's `ROSBAG2_CPP_LOCAL_MESSAGE_DEFINITION_SOURCE_MAX_RECURSION_DEPTH`: the root and
/// at most 49 levels of nested types below it.
pub const MAX_RECURSION_DEPTH: i32 = 50;

/// The first line of rosbag2's delimiter: exactly 80 `=`.
const SEPARATOR: &str =
    "================================================================================\n";

/// Which interface file of a type: `share/<pkg>/msg/<Type>.msg`, `share/<pkg>/msg/<Type>.idl`
/// or `share/<pkg>/srv/<Type>.srv`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    Msg,
    Idl,
    Srv,
}

impl FileKind {
    /// The directory under `share/<pkg>/` (an .idl of a message lives beside its .msg).
    pub fn dir(self) -> &'static str {
        match self {
            FileKind::Msg | FileKind::Idl => "msg",
            FileKind::Srv => "srv",
        }
    }

    pub fn extension(self) -> &'static str {
        match self {
            FileKind::Msg => "msg",
            FileKind::Idl => "idl",
            FileKind::Srv => "srv",
        }
    }

    fn header(self) -> &'static str {
        match self {
            FileKind::Msg => "MSG: ",
            FileKind::Idl => "IDL: ",
            FileKind::Srv => "SRV: ",
        }
    }
}

/// A source of interface definition files.
pub trait DefinitionFiles {
    /// The text of `package`'s interface file `name` (a bare type name, `String`) of `kind`,
    /// or `None` when there is none. Unreadable files are `None` too (rosbag2 treats a file it
    /// cannot open as missing); implementations log why.
    fn find(&self, package: &str, kind: FileKind, name: &str) -> Option<String>;
}

impl<T: DefinitionFiles + ?Sized> DefinitionFiles for &T {
    fn find(&self, package: &str, kind: FileKind, name: &str) -> Option<String> {
        (**self).find(package, kind, name)
    }
}

/// The `encoding` column of `message_definitions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Ros2Msg,
    Ros2Idl,
    Unknown,
}

impl Encoding {
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Ros2Msg => "ros2msg",
            Encoding::Ros2Idl => "ros2idl",
            Encoding::Unknown => "unknown",
        }
    }
}

/// A composed definition: the `encoding` and `encoded_message_definition` columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FullText {
    pub encoding: Encoding,
    pub text: String,
}

impl FullText {
    /// What rosbag2 stores when it finds no definition.
    pub fn unknown() -> Self {
        FullText {
            encoding: Encoding::Unknown,
            text: String::new(),
        }
    }
}

/// Why no definition could be composed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DefinitionError {
    #[error("no .{} file for {type_name}", kind.extension())]
    NotFound { type_name: String, kind: FileKind },
    #[error("type name {type_name:?} is not pkg/Type, pkg/msg/Type or pkg/srv/Type")]
    NotUnderstood { type_name: String },
    #[error("the definition of {root} nests deeper than {MAX_RECURSION_DEPTH} levels")]
    TooDeep { root: String },
}

/// The definition rosbag2 Jazzy would store for `type_name` (`pkg/msg/Type`; `pkg/Type` and
/// `pkg/srv/Type` are understood too), from `files`.
pub fn full_text(
    type_name: &str,
    files: &impl DefinitionFiles,
) -> Result<FullText, DefinitionError> {
    let mut composer = Composer {
        files,
        root: type_name,
        seen: HashSet::new(),
    };
    if type_name.contains("/srv/") {
        return composer.service();
    }
    match composer.append(type_name, FileKind::Msg, MAX_RECURSION_DEPTH) {
        Ok(text) => Ok(FullText {
            encoding: Encoding::Ros2Msg,
            text,
        }),
        // A missing .msg anywhere in the tree: rosbag2 redoes the whole tree from .idl files.
        Err(DefinitionError::NotFound {
            type_name: missing, ..
        }) => {
            log::debug!("{type_name}: no .msg definition for {missing}, falling back to IDL");
            let mut text = delimiter(type_name, FileKind::Idl);
            text += &composer.append(type_name, FileKind::Idl, MAX_RECURSION_DEPTH)?;
            Ok(FullText {
                encoding: Encoding::Ros2Idl,
                text,
            })
        }
        Err(e) => Err(e),
    }
}

/// The `message_definitions` row for `type_name`: [`full_text`], or, like rosbag2, encoding
/// `unknown` with an empty text when no definition is found (logged at warn, once per call:
/// use [`DefinitionCache`] to build each type once per recording).
/// `type_description_hash` is the caller's: the publisher's endpoint info on Jazzy, empty where
/// the distro has none.
pub fn local_definition(
    type_name: &str,
    type_description_hash: &str,
    files: &impl DefinitionFiles,
) -> MessageDefinition {
    row(type_name, type_description_hash, resolve(type_name, files))
}

fn resolve(type_name: &str, files: &impl DefinitionFiles) -> FullText {
    full_text(type_name, files).unwrap_or_else(|e| {
        log::warn!(
            "{type_name}: no message definition ({e}); stored as encoding 'unknown' with an \
             empty text, as rosbag2 does"
        );
        FullText::unknown()
    })
}

fn row(type_name: &str, type_description_hash: &str, full: FullText) -> MessageDefinition {
    MessageDefinition {
        topic_type: type_name.to_string(),
        encoding: full.encoding.as_str().to_string(),
        encoded_message_definition: full.text,
        type_description_hash: type_description_hash.to_string(),
    }
}

/// rosbag2's two-line delimiter before a nested definition.
fn delimiter(name: &str, kind: FileKind) -> String {
    format!("{SEPARATOR}{}{name}\n", kind.header())
}

/// One composition: rosbag2's `get_full_text` with its `seen_deps` set.
struct Composer<'a, F: ?Sized> {
    files: &'a F,
    root: &'a str,
    /// Names already written, per kind, as written in the referring files: `pkg/Type` and
    /// `pkg/msg/Type` are different entries, as in rosbag2. The root is not in it.
    seen: HashSet<(String, FileKind)>,
}

impl<F: DefinitionFiles + ?Sized> Composer<'_, F> {
    /// rosbag2's `append_recursive`: the file of `name`, then its unseen dependencies.
    fn append(
        &mut self,
        name: &str,
        kind: FileKind,
        depth: i32,
    ) -> Result<String, DefinitionError> {
        if depth <= 0 {
            return Err(DefinitionError::TooDeep {
                root: self.root.to_string(),
            });
        }
        let (mut out, deps) = self.load(name, kind)?;
        for dep in deps {
            if self.seen.insert((dep.clone(), kind)) {
                out.push('\n');
                out += &delimiter(&dep, kind);
                out += &self.append(&dep, kind, depth - 1)?;
            }
        }
        Ok(out)
    }

    /// The text of `name`'s file and the types it refers to.
    fn load(
        &self,
        name: &str,
        kind: FileKind,
    ) -> Result<(String, BTreeSet<String>), DefinitionError> {
        let (package, ty) =
            split_type_name(name).ok_or_else(|| DefinitionError::NotUnderstood {
                type_name: name.to_string(),
            })?;
        let text = self
            .files
            .find(package, kind, ty)
            .ok_or_else(|| DefinitionError::NotFound {
                type_name: name.to_string(),
                kind,
            })?;
        let deps = dependencies(kind, &text, package);
        Ok((text, deps))
    }

    /// rosbag2's service branch: `SRV: ` header and the .srv text first, then each
    /// dependency from its .msg, or its .idl when the .msg is missing. The encoding is that
    /// of the last dependency written, `unknown` when there is none (rosbag2's quirk, kept so
    /// the rows match).
    fn service(&mut self) -> Result<FullText, DefinitionError> {
        let root = self.root;
        let mut encoding = Encoding::Unknown;
        self.seen.insert((root.to_string(), FileKind::Srv));
        let mut text = delimiter(root, FileKind::Srv);
        let (srv, deps) = self.load(root, FileKind::Srv)?;
        text += &srv;
        for dep in deps {
            if !self.seen.insert((dep.clone(), FileKind::Msg)) {
                continue;
            }
            // rosbag2 writes the MSG delimiter before trying, and keeps it when that fails.
            text.push('\n');
            text += &delimiter(&dep, FileKind::Msg);
            match self.append(&dep, FileKind::Msg, MAX_RECURSION_DEPTH) {
                Ok(part) => {
                    text += &part;
                    encoding = Encoding::Ros2Msg;
                }
                Err(DefinitionError::NotFound { .. }) => {
                    if self.seen.insert((dep.clone(), FileKind::Idl)) {
                        text.push('\n');
                        text += &delimiter(&dep, FileKind::Idl);
                        text += &self.append(&dep, FileKind::Idl, MAX_RECURSION_DEPTH)?;
                        encoding = Encoding::Ros2Idl;
                    }
                }
                Err(DefinitionError::NotUnderstood { .. }) => encoding = Encoding::Unknown,
                Err(e @ DefinitionError::TooDeep { .. }) => return Err(e),
            }
        }
        Ok(FullText { encoding, text })
    }
}

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

fn is_word_or_slash(b: u8) -> bool {
    is_word(b) || b == b'/'
}

/// `\s` of rosbag2's std::regex (the C locale's isspace).
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// `(package, Type)` of `pkg/Type`, `pkg/msg/Type` or `pkg/srv/Type` (rosbag2's
/// `^([a-zA-Z0-9_]+)/(?:msg/|srv/)?([a-zA-Z0-9_]+)$`).
fn split_type_name(name: &str) -> Option<(&str, &str)> {
    let word = |s: &str| !s.is_empty() && s.bytes().all(is_word);
    let parts: Vec<&str> = name.split('/').collect();
    let (package, ty) = match parts.as_slice() {
        [package, ty] => (*package, *ty),
        [package, "msg" | "srv", ty] => (*package, *ty),
        _ => return None,
    };
    (word(package) && word(ty)).then_some((package, ty))
}

/// The types a file refers to, as rosbag2's `parse_definition_dependencies` finds them.
fn dependencies(kind: FileKind, text: &str, package: &str) -> BTreeSet<String> {
    match kind {
        FileKind::Msg => msg_dependencies(text, package),
        FileKind::Idl => idl_dependencies(text),
        FileKind::Srv => {
            let deps = msg_dependencies(text, package);
            if deps.is_empty() {
                idl_dependencies(text)
            } else {
                deps
            }
        }
    }
}

const PRIMITIVE_TYPES: &[&str] = &[
    "bool", "byte", "char", "float32", "float64", "int8", "uint8", "int16", "uint16", "int32",
    "uint32", "int64", "uint64", "string",
];

/// Positions where a line's text may start, for a regex search beginning at `from`: the text
/// start (`^`, only on the first search, as std::regex without `multiline`) and after each `\n`.
fn line_starts(bytes: &[u8], from: usize) -> impl Iterator<Item = usize> + '_ {
    let first = (from == 0).then_some(0);
    let after_newlines = bytes[from..]
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .map(move |(i, _)| from + i + 1);
    first.into_iter().chain(after_newlines)
}

/// Field types of a .msg (or .srv) text that are messages, qualified with `package` when
/// written bare, sorted (rosbag2 collects them in a `std::set`).
///
/// This is rosbag2's search with `(?:^|\n)\s*([a-zA-Z0-9_/]+)(?:\[[^\]]*\])?\s+`, matches not
/// overlapping, done by hand to keep its exact edge cases: the trailing `\s+` also eats the
/// newline after a line holding a lone type, which hides the next line from the search.
fn msg_dependencies(text: &str, package: &str) -> BTreeSet<String> {
    let b = text.as_bytes();
    let mut deps = BTreeSet::new();
    let mut from = 0;
    'search: loop {
        // Line starts inside whitespace that a failed attempt already skipped fail the same
        // way; passing over them keeps the scan linear.
        let mut failed_upto: Option<usize> = None;
        for start in line_starts(b, from) {
            if failed_upto.is_some_and(|end| start <= end) {
                continue;
            }
            let mut i = start;
            while i < b.len() && is_space(b[i]) {
                i += 1;
            }
            failed_upto = Some(i);
            let ty_start = i;
            while i < b.len() && is_word_or_slash(b[i]) {
                i += 1;
            }
            if i == ty_start {
                continue;
            }
            let ty = &text[ty_start..i];
            // Optional `[...]`: it counts only when whitespace follows its `]`.
            if b.get(i) == Some(&b'[') {
                match b[i..].iter().position(|&c| c == b']') {
                    Some(close) => i += close + 1,
                    None => continue,
                }
            }
            if !b.get(i).is_some_and(|&c| is_space(c)) {
                continue;
            }
            while i < b.len() && is_space(b[i]) {
                i += 1;
            }
            if !PRIMITIVE_TYPES.contains(&ty) {
                if ty.contains('/') {
                    deps.insert(ty.to_string());
                } else {
                    deps.insert(format!("{package}/{ty}"));
                }
            }
            from = i;
            continue 'search;
        }
        break;
    }
    deps
}

/// Types an .idl text includes, as rosbag2 finds them with
/// `(?:^|\n)#include\s+(?:"|<)([a-zA-Z0-9_/]+)\.idl(?:"|>)`: `pkg/msg/Type`, sorted.
fn idl_dependencies(text: &str) -> BTreeSet<String> {
    let b = text.as_bytes();
    let mut deps = BTreeSet::new();
    for start in line_starts(b, 0) {
        let Some(rest) = b[start..].strip_prefix(b"#include") else {
            continue;
        };
        let spaces = rest.iter().take_while(|&&c| is_space(c)).count();
        if spaces == 0 {
            continue;
        }
        let rest = &rest[spaces..];
        let Some((&open, rest)) = rest.split_first() else {
            continue;
        };
        if open != b'"' && open != b'<' {
            continue;
        }
        let len = rest.iter().take_while(|&&c| is_word_or_slash(c)).count();
        let after = &rest[len..];
        if len > 0 && (after.starts_with(b".idl\"") || after.starts_with(b".idl>")) {
            // ASCII by construction, so the bytes are valid UTF-8.
            deps.insert(String::from_utf8_lossy(&rest[..len]).into_owned());
        }
        // A match ends before the line's `\n`, so every line start stays a candidate.
    }
    deps
}

/// Installed interface files, found as rosbag2 finds them through ament_index: a package
/// belongs to the first prefix holding `share/ament_index/resource_index/packages/<pkg>`, and
/// its files are `share/<pkg>/msg/<Type>.msg` (or `.idl`) under that prefix only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AmentPrefixPath {
    prefixes: Vec<PathBuf>,
}

impl AmentPrefixPath {
    /// Search `prefixes` in order (empty and non-directory entries are skipped at lookup, as
    /// ament_index does).
    pub fn new(prefixes: impl IntoIterator<Item = PathBuf>) -> Self {
        AmentPrefixPath {
            prefixes: prefixes.into_iter().collect(),
        }
    }

    /// Parse a path list in `AMENT_PREFIX_PATH` syntax (`:`-separated on Unix).
    pub fn from_path_list(list: &OsStr) -> Self {
        Self::new(std::env::split_paths(list))
    }

    /// The prefixes of this process's `AMENT_PREFIX_PATH`.
    ///
    /// This reads the environment on purpose: rosbag2's local definition source finds packages
    /// through ament_index, which reads `AMENT_PREFIX_PATH`. A sourced ROS environment sets
    /// it, and it names the same installed packages whose type support the recorder
    /// subscribes with, so the stored text describes the types actually recorded. Unset or
    /// empty, nothing is found and every type is stored as `unknown` (logged at warn).
    pub fn from_env() -> Self {
        match std::env::var_os("AMENT_PREFIX_PATH") {
            Some(list) if !list.is_empty() => Self::from_path_list(&list),
            _ => {
                log::warn!(
                    "AMENT_PREFIX_PATH is not set: message definitions will be stored as \
                     'unknown' (source the ROS environment to record them)"
                );
                Self::default()
            }
        }
    }

    pub fn prefixes(&self) -> &[PathBuf] {
        &self.prefixes
    }

    /// ament_index's `get_package_prefix`: the first existing prefix with the package marker.
    fn package_prefix(&self, package: &str) -> Option<&Path> {
        self.prefixes
            .iter()
            .filter(|p| !p.as_os_str().is_empty() && p.is_dir())
            .map(PathBuf::as_path)
            .find(|p| {
                // ament_index opens the marker with an ifstream: openable is enough.
                std::fs::File::open(
                    p.join("share/ament_index/resource_index/packages")
                        .join(package),
                )
                .is_ok()
            })
    }
}

impl DefinitionFiles for AmentPrefixPath {
    fn find(&self, package: &str, kind: FileKind, name: &str) -> Option<String> {
        let Some(prefix) = self.package_prefix(package) else {
            log::debug!("package '{package}' not found in AMENT_PREFIX_PATH");
            return None;
        };
        let path = prefix
            .join("share")
            .join(package)
            .join(kind.dir())
            .join(format!("{name}.{}", kind.extension()));
        match std::fs::read(&path) {
            // The text column is TEXT; a stray non-UTF-8 byte (in a comment, say) must not
            // cost the whole definition.
            Ok(bytes) => Some(String::from_utf8_lossy(&bytes).into_owned()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                log::warn!("{}: cannot read: {e}", path.display());
                None
            }
        }
    }
}

/// The .msg files embedded for the synthetic source (no ROS installation needed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EmbeddedFiles;

impl DefinitionFiles for EmbeddedFiles {
    fn find(&self, package: &str, kind: FileKind, name: &str) -> Option<String> {
        if kind != FileKind::Msg {
            return None;
        }
        MSG_FILES
            .iter()
            .find(|(n, _)| n.split_once('/') == Some((package, name)))
            .map(|(_, text)| text.to_string())
    }
}

/// Builds each type's definition once per recording, and reads each file once: the ROS source
/// asks for a type when it subscribes (never on the message path), and many types share
/// `std_msgs/Header` and `builtin_interfaces/Time`.
#[derive(Debug)]
pub struct DefinitionCache<F> {
    files: FileMemo<F>,
    by_type: HashMap<String, FullText>,
}

impl<F: DefinitionFiles> DefinitionCache<F> {
    pub fn new(files: F) -> Self {
        DefinitionCache {
            files: FileMemo {
                inner: files,
                texts: RefCell::new(HashMap::new()),
            },
            by_type: HashMap::new(),
        }
    }

    /// The `message_definitions` row for `type_name`, as [`local_definition`] builds it,
    /// composed on the first call for the type (a missing definition is logged then, once).
    pub fn definition(
        &mut self,
        type_name: &str,
        type_description_hash: &str,
    ) -> MessageDefinition {
        let full = match self.by_type.get(type_name) {
            Some(full) => full.clone(),
            None => {
                let full = resolve(type_name, &self.files);
                self.by_type.insert(type_name.to_string(), full.clone());
                full
            }
        };
        row(type_name, type_description_hash, full)
    }

    /// The underlying file source.
    pub fn files(&self) -> &F {
        &self.files.inner
    }
}

/// Remembers every file lookup, found or not.
#[derive(Debug)]
struct FileMemo<F> {
    inner: F,
    texts: RefCell<HashMap<(String, FileKind, String), Option<String>>>,
}

impl<F: DefinitionFiles> DefinitionFiles for FileMemo<F> {
    fn find(&self, package: &str, kind: FileKind, name: &str) -> Option<String> {
        let key = (package.to_string(), kind, name.to_string());
        if let Some(text) = self.texts.borrow().get(&key) {
            return text.clone();
        }
        let text = self.inner.find(package, kind, name);
        self.texts.borrow_mut().insert(key, text.clone());
        text
    }
}

// The raw strings below are byte-exact copies of the .msg files; do not re-indent them.
/// `(package/Type, text)` of each .msg file, verbatim from the ROS 2 Jazzy branches of
/// ros2/common_interfaces, ros2/rcl_interfaces and ros2/geometry2 (interface data).
const MSG_FILES: &[(&str, &str)] = &[
    (
        "std_msgs/String",
        r#"# This was originally provided as an example message.
# It is deprecated as of Foxy
# It is recommended to create your own semantically meaningful message.
# However if you would like to continue using this please use the equivalent in example_msgs.

string data
"#,
    ),
    (
        "std_msgs/Header",
        r#"# Standard metadata for higher-level stamped data types.
# This is generally used to communicate timestamped data
# in a particular coordinate frame.

# Two-integer timestamp that is expressed as seconds and nanoseconds.
builtin_interfaces/Time stamp

# Transform frame with which this data is associated.
string frame_id
"#,
    ),
    (
        "builtin_interfaces/Time",
        r#"# This message communicates ROS Time defined here:
# https://design.ros2.org/articles/clock_and_time.html

# The seconds component, valid over all int32 values.
int32 sec

# The nanoseconds component, valid in the range [0, 1e9).
uint32 nanosec
"#,
    ),
    (
        "geometry_msgs/Quaternion",
        r#"# This represents an orientation in free space in quaternion form.

float64 x 0
float64 y 0
float64 z 0
float64 w 1
"#,
    ),
    (
        "geometry_msgs/Vector3",
        r#"# This represents a vector in free space.

# This is semantically different than a point.
# A vector is always anchored at the origin.
# When a transform is applied to a vector, only the rotational component is applied.

float64 x
float64 y
float64 z
"#,
    ),
    (
        "geometry_msgs/Transform",
        r#"# This represents the transform between two coordinate frames in free space.

Vector3 translation
Quaternion rotation
"#,
    ),
    (
        "geometry_msgs/TransformStamped",
        r#"# This expresses a transform from coordinate frame header.frame_id
# to the coordinate frame child_frame_id at the time of header.stamp
#
# This message is mostly used by the
# <a href="https://docs.ros.org/en/rolling/p/tf2/">tf2</a> package.
# See its documentation for more information.
#
# The child_frame_id is necessary in addition to the frame_id
# in the Header to communicate the full reference for the transform
# in a self contained message.

# The frame id in the header is used as the reference frame of this transform.
std_msgs/Header header

# The frame id of the child frame to which this transform points.
string child_frame_id

# Translation and rotation in 3-dimensions of child_frame_id from header.frame_id.
Transform transform
"#,
    ),
    (
        "sensor_msgs/Imu",
        r#"# This is a message to hold data from an IMU (Inertial Measurement Unit)
#
# Accelerations should be in m/s^2 (not in g's), and rotational velocity should be in rad/sec
#
# If the covariance of the measurement is known, it should be filled in (if all you know is the
# variance of each measurement, e.g. from the datasheet, just put those along the diagonal)
# A covariance matrix of all zeros will be interpreted as "covariance unknown", and to use the
# data a covariance will have to be assumed or gotten from some other source
#
# If you have no estimate for one of the data elements (e.g. your IMU doesn't produce an
# orientation estimate), please set element 0 of the associated covariance matrix to -1
# If you are interpreting this message, please check for a value of -1 in the first element of each
# covariance matrix, and disregard the associated estimate.

std_msgs/Header header

geometry_msgs/Quaternion orientation
float64[9] orientation_covariance # Row major about x, y, z axes

geometry_msgs/Vector3 angular_velocity
float64[9] angular_velocity_covariance # Row major about x, y, z axes

geometry_msgs/Vector3 linear_acceleration
float64[9] linear_acceleration_covariance # Row major x, y z
"#,
    ),
    (
        "sensor_msgs/Image",
        r#"# This message contains an uncompressed image
# (0, 0) is at top-left corner of image

std_msgs/Header header # Header timestamp should be acquisition time of image
                             # Header frame_id should be optical frame of camera
                             # origin of frame should be optical center of cameara
                             # +x should point to the right in the image
                             # +y should point down in the image
                             # +z should point into to plane of the image
                             # If the frame_id here and the frame_id of the CameraInfo
                             # message associated with the image conflict
                             # the behavior is undefined

uint32 height                # image height, that is, number of rows
uint32 width                 # image width, that is, number of columns

# The legal values for encoding are in file include/sensor_msgs/image_encodings.hpp
# If you want to standardize a new string format, join
# ros-users@lists.ros.org and send an email proposing a new encoding.

string encoding       # Encoding of pixels -- channel meaning, ordering, size
                      # taken from the list of strings in include/sensor_msgs/image_encodings.hpp

uint8 is_bigendian    # is this data bigendian?
uint32 step           # Full row length in bytes
uint8[] data          # actual matrix data, size is (step * rows)
"#,
    ),
    (
        "sensor_msgs/PointCloud2",
        r#"# This message holds a collection of N-dimensional points, which may
# contain additional information such as normals, intensity, etc. The
# point data is stored as a binary blob, its layout described by the
# contents of the "fields" array.
#
# The point cloud data may be organized 2d (image-like) or 1d (unordered).
# Point clouds organized as 2d images may be produced by camera depth sensors
# such as stereo or time-of-flight.

# Time of sensor data acquisition, and the coordinate frame ID (for 3d points).
std_msgs/Header header

# 2D structure of the point cloud. If the cloud is unordered, height is
# 1 and width is the length of the point cloud.
uint32 height
uint32 width

# Describes the channels and their layout in the binary data blob.
PointField[] fields

bool    is_bigendian # Is this data bigendian?
uint32  point_step   # Length of a point in bytes
uint32  row_step     # Length of a row in bytes
uint8[] data         # Actual point data, size is (row_step*height)

bool is_dense        # True if there are no invalid points
"#,
    ),
    (
        "sensor_msgs/PointField",
        r#"# This message holds the description of one point entry in the
# PointCloud2 message format.
uint8 INT8    = 1
uint8 UINT8   = 2
uint8 INT16   = 3
uint8 UINT16  = 4
uint8 INT32   = 5
uint8 UINT32  = 6
uint8 FLOAT32 = 7
uint8 FLOAT64 = 8

# Common PointField names are x, y, z, intensity, rgb, rgba
string name      # Name of field
uint32 offset    # Offset from start of point struct
uint8  datatype  # Datatype enumeration, see above
uint32 count     # How many elements in the field
"#,
    ),
    (
        "tf2_msgs/TFMessage",
        r#"geometry_msgs/TransformStamped[] transforms
"#,
    ),
];

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// In-memory files: `("pkg/Type", kind) -> text`.
    #[derive(Default)]
    struct Files(HashMap<(String, FileKind), String>);

    impl Files {
        fn with(mut self, name: &str, kind: FileKind, text: &str) -> Self {
            self.0.insert((name.to_string(), kind), text.to_string());
            self
        }
    }

    impl DefinitionFiles for Files {
        fn find(&self, package: &str, kind: FileKind, name: &str) -> Option<String> {
            self.0.get(&(format!("{package}/{name}"), kind)).cloned()
        }
    }

    fn sep(header: &str) -> String {
        format!("\n{}\n{header}\n", "=".repeat(80))
    }

    fn embedded(name: &str) -> &'static str {
        MSG_FILES.iter().find(|(n, _)| *n == name).unwrap().1
    }

    #[test]
    fn dependencies_skip_comments_primitives_and_constants_and_qualify_bare_names() {
        let text = "# geometry_msgs/Pose not_a_field\nuint8 INT8 = 1\nfloat64[9] cov # x\n\
                    std_msgs/Header header\nPointField[] fields\n  Vector3 v\n\
                    string<=10 bounded\nTime[<=3] times\n";
        let deps: Vec<String> = msg_dependencies(text, "sensor_msgs").into_iter().collect();
        assert_eq!(
            deps,
            [
                "sensor_msgs/PointField",
                "sensor_msgs/Time",
                "sensor_msgs/Vector3",
                "std_msgs/Header"
            ]
        );
    }

    #[test]
    fn dependencies_keep_rosbag2_regex_edge_cases() {
        // A lone type's trailing `\s+` eats the newline, hiding the next line from the search.
        let deps = msg_dependencies("Lone\nHidden h\nSeen s\n", "p");
        assert_eq!(deps.into_iter().collect::<Vec<_>>(), ["p/Lone", "p/Seen"]);
        // `[...]` counts only when closed and followed by whitespace; the file's last token
        // needs trailing whitespace too.
        let deps = msg_dependencies("Open[ x\nClosed[]x\nLast l\nEnd", "p");
        assert_eq!(deps.into_iter().collect::<Vec<_>>(), ["p/Last"]);
        let idl = "#include \"a/msg/B.idl\"\n  #include <a/msg/Indented.idl>\n\
                   #include <c/msg/D.idl>\n#include<e/msg/NoSpace.idl>\n#include <f/msg/G.h>\n";
        let deps: Vec<String> = idl_dependencies(idl).into_iter().collect();
        assert_eq!(deps, ["a/msg/B", "c/msg/D"]);
    }

    #[test]
    fn nested_types_follow_depth_first_in_sorted_order_each_once() {
        let files = Files::default()
            .with("p/A", FileKind::Msg, "p/C c\nB b\nq/msg/D d\n")
            .with("p/B", FileKind::Msg, "C c\nq/msg/D d\n")
            .with("p/C", FileKind::Msg, "int32 x\n")
            .with("q/D", FileKind::Msg, "float64 y\n");
        let full = full_text("p/msg/A", &files).unwrap();
        assert_eq!(full.encoding, Encoding::Ros2Msg);
        // Sorted per file: p/B < p/C < q/msg/D; B's own C and D come first, under B.
        let expected = "p/C c\nB b\nq/msg/D d\n".to_string()
            + &sep("MSG: p/B")
            + "C c\nq/msg/D d\n"
            + &sep("MSG: p/C")
            + "int32 x\n"
            + &sep("MSG: q/msg/D")
            + "float64 y\n";
        assert_eq!(full.text, expected);
    }

    #[test]
    fn names_with_and_without_msg_are_the_same_root_but_distinct_nested_entries() {
        let files = Files::default()
            .with("p/A", FileKind::Msg, "p/B one\np/msg/B two\n")
            .with("p/B", FileKind::Msg, "bool b\n");
        let with = full_text("p/msg/A", &files).unwrap();
        assert_eq!(with, full_text("p/A", &files).unwrap());
        // rosbag2 dedups by the name as written, so B is there twice, under both names.
        let expected = "p/B one\np/msg/B two\n".to_string()
            + &sep("MSG: p/B")
            + "bool b\n"
            + &sep("MSG: p/msg/B")
            + "bool b\n";
        assert_eq!(with.text, expected);
        for bad in ["p", "p/action/A", "a/b/c/d", "p/msg/", "p-x/A", ""] {
            assert_eq!(
                full_text(bad, &files),
                Err(DefinitionError::NotUnderstood {
                    type_name: bad.to_string()
                }),
                "{bad}"
            );
            let row = local_definition(bad, "h", &files);
            assert_eq!(
                (
                    row.encoding.as_str(),
                    row.encoded_message_definition.as_str()
                ),
                ("unknown", "")
            );
        }
    }

    #[test]
    fn an_idl_only_type_is_stored_as_ros2idl_with_every_part_headed() {
        let a_idl =
            "#include \"p/msg/B.idl\"\nmodule p { module msg { struct A { p::msg::B b; }; }; };\n";
        let b_idl = "module p { module msg { struct B { int32 x; }; }; };\n";
        let files =
            Files::default()
                .with("p/A", FileKind::Idl, a_idl)
                .with("p/B", FileKind::Idl, b_idl);
        let full = full_text("p/msg/A", &files).unwrap();
        assert_eq!(full.encoding, Encoding::Ros2Idl);
        let expected = format!("{SEPARATOR}IDL: p/msg/A\n{a_idl}") + &sep("IDL: p/msg/B") + b_idl;
        assert_eq!(full.text, expected);
        let row = local_definition("p/msg/A", "RIHS01_x", &files);
        assert_eq!(row.encoding, "ros2idl");
        assert_eq!(row.encoded_message_definition, expected);
        assert_eq!(row.type_description_hash, "RIHS01_x");
        assert_eq!(row.topic_type, "p/msg/A");
    }

    #[test]
    fn a_missing_nested_msg_redoes_the_tree_from_idl_or_stores_unknown() {
        let files = Files::default().with("p/A", FileKind::Msg, "p/B b\n").with(
            "p/A",
            FileKind::Idl,
            "#include <p/msg/B.idl>\nA\n",
        );
        // B has neither file: the IDL fallback fails too.
        assert_eq!(
            full_text("p/msg/A", &files),
            Err(DefinitionError::NotFound {
                type_name: "p/msg/B".to_string(),
                kind: FileKind::Idl
            })
        );
        let row = local_definition("p/msg/A", "", &files);
        assert_eq!(
            (
                row.encoding.as_str(),
                row.encoded_message_definition.as_str()
            ),
            ("unknown", "")
        );
        // With B's .idl present the whole tree is IDL, though A's .msg exists.
        let files = files.with("p/B", FileKind::Idl, "B\n");
        let full = full_text("p/msg/A", &files).unwrap();
        assert_eq!(full.encoding, Encoding::Ros2Idl);
        assert_eq!(
            full.text,
            format!("{SEPARATOR}IDL: p/msg/A\n#include <p/msg/B.idl>\nA\n")
                + &sep("IDL: p/msg/B")
                + "B\n"
        );
    }

    #[test]
    fn nesting_stops_at_rosbag2s_recursion_limit() {
        // T0 -> T1 -> ... -> T{n-1}: n levels, the root included.
        let chain = |n: usize| {
            (0..n).fold(Files::default(), |files, i| {
                let text = if i + 1 < n {
                    format!("p/T{} next\n", i + 1)
                } else {
                    "int8 end\n".to_string()
                };
                files.with(&format!("p/T{i}"), FileKind::Msg, &text)
            })
        };
        let levels = MAX_RECURSION_DEPTH as usize;
        let full = full_text("p/msg/T0", &chain(levels)).unwrap();
        assert_eq!(full.text.matches("MSG: ").count(), levels - 1);
        assert_eq!(
            full_text("p/msg/T0", &chain(levels + 1)),
            Err(DefinitionError::TooDeep {
                root: "p/msg/T0".to_string()
            })
        );
        // A cycle ends at the first repeat instead (the seen set), well within the limit.
        let cycle = Files::default().with("p/A", FileKind::Msg, "p/B b\n").with(
            "p/B",
            FileKind::Msg,
            "p/A a\n",
        );
        let expected =
            "p/B b\n".to_string() + &sep("MSG: p/B") + "p/A a\n" + &sep("MSG: p/A") + "p/B b\n";
        assert_eq!(full_text("p/msg/A", &cycle).unwrap().text, expected);
    }

    #[test]
    fn a_service_gets_rosbag2s_srv_layout() {
        let files = Files::default()
            .with("s/Get", FileKind::Srv, "string key\n---\np/B value\n")
            .with("p/B", FileKind::Msg, "bool b\n")
            .with("s/Empty", FileKind::Srv, "---\n");
        let full = full_text("s/srv/Get", &files).unwrap();
        assert_eq!(full.encoding, Encoding::Ros2Msg);
        assert_eq!(
            full.text,
            format!("{SEPARATOR}SRV: s/srv/Get\nstring key\n---\np/B value\n")
                + &sep("MSG: p/B")
                + "bool b\n"
        );
        // No nested type: rosbag2 leaves the encoding unknown but keeps the text.
        let empty = full_text("s/srv/Empty", &files).unwrap();
        assert_eq!(empty.encoding, Encoding::Unknown);
        assert_eq!(empty.text, format!("{SEPARATOR}SRV: s/srv/Empty\n---\n"));
    }

    #[test]
    fn every_embedded_dependency_resolves() {
        for (name, text) in MSG_FILES {
            let package = name.split('/').next().unwrap_or_default();
            for dep in msg_dependencies(text, package) {
                assert!(
                    MSG_FILES.iter().any(|(n, _)| *n == dep),
                    "{name} needs {dep}"
                );
            }
            let full = full_text(name, &EmbeddedFiles).unwrap();
            assert_eq!(full.encoding, Encoding::Ros2Msg, "{name}");
        }
    }

    /// Counts lookups that reach the underlying files.
    struct Counting<'a>(&'a Files, &'a Cell<usize>);

    impl DefinitionFiles for Counting<'_> {
        fn find(&self, package: &str, kind: FileKind, name: &str) -> Option<String> {
            self.1.set(self.1.get() + 1);
            self.0.find(package, kind, name)
        }
    }

    #[test]
    fn the_cache_builds_each_type_once_and_reads_each_file_once() {
        let files = Files::default()
            .with("p/A", FileKind::Msg, "p/H h\n")
            .with("p/B", FileKind::Msg, "p/H h\n")
            .with("p/H", FileKind::Msg, "int32 t\n");
        let reads = Cell::new(0);
        let mut cache = DefinitionCache::new(Counting(&files, &reads));
        let a = cache.definition("p/msg/A", "hash_a");
        assert_eq!(a, local_definition("p/msg/A", "hash_a", &files));
        assert_eq!(reads.get(), 2);
        let b = cache.definition("p/msg/B", "");
        assert_eq!(
            b.encoded_message_definition,
            "p/H h\n".to_string() + &sep("MSG: p/H") + "int32 t\n"
        );
        assert_eq!(reads.get(), 3, "p/H comes from the memo");
        // Misses are remembered too: .msg then .idl of p/Missing, once.
        let missing = cache.definition("p/msg/Missing", "");
        assert_eq!(missing.encoding, "unknown");
        assert_eq!(reads.get(), 5);
        assert_eq!(
            cache.definition("p/msg/A", "other").type_description_hash,
            "other"
        );
        cache.definition("p/msg/Missing", "");
        assert_eq!(reads.get(), 5);
    }

    /// Installs `files` (`pkg/Type` .msg texts) under `prefix` as colcon/ament do: the package
    /// marker in the resource index, the file under `share/<pkg>/msg/`.
    fn install(prefix: &Path, files: &[(&str, &str)]) {
        for (name, text) in files {
            let (package, ty) = name.split_once('/').unwrap();
            let index = prefix.join("share/ament_index/resource_index/packages");
            std::fs::create_dir_all(&index).unwrap();
            std::fs::write(index.join(package), "").unwrap();
            let dir = prefix.join("share").join(package).join("msg");
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(format!("{ty}.msg")), text).unwrap();
        }
    }

    #[test]
    fn installed_definitions_are_found_through_ament_prefix_path_like_rosbag2() {
        let tmp = tempfile::tempdir().unwrap();
        let (base, overlay) = (tmp.path().join("opt/ros"), tmp.path().join("ws/install"));
        let names = [
            "std_msgs/String",
            "std_msgs/Header",
            "builtin_interfaces/Time",
            "sensor_msgs/Image",
        ];
        let texts: Vec<(&str, &str)> = names.iter().map(|n| (*n, embedded(n))).collect();
        install(&base, &texts[..3]);
        install(&overlay, &texts[3..]);
        // A stale std_msgs later on the path is shadowed: the first prefix with the package
        // marker wins. Files without a marker are not a package.
        let shadow = tmp.path().join("shadow");
        install(&shadow, &[("std_msgs/String", "string stale\n")]);
        let unmarked = tmp.path().join("unmarked/share/geometry_msgs/msg");
        std::fs::create_dir_all(&unmarked).unwrap();
        std::fs::write(unmarked.join("Point.msg"), "float64 x\n").unwrap();
        let list = std::env::join_paths([
            overlay.as_path(),
            Path::new(""),
            tmp.path().join("missing").as_path(),
            base.as_path(),
            shadow.as_path(),
            tmp.path().join("unmarked").as_path(),
        ])
        .unwrap();
        let files = AmentPrefixPath::from_path_list(&list);
        assert_eq!(files.prefixes().len(), 6);

        let string = local_definition("std_msgs/msg/String", "", &files);
        assert_eq!(string.encoding, "ros2msg");
        assert_eq!(
            string.encoded_message_definition,
            embedded("std_msgs/String")
        );
        assert_eq!(
            local_definition("geometry_msgs/msg/Point", "", &files).encoding,
            "unknown"
        );

        let image = local_definition("sensor_msgs/msg/Image", "", &files);
        assert_eq!(image.encoding, "ros2msg");
        let expected = embedded("sensor_msgs/Image").to_string()
            + &sep("MSG: std_msgs/Header")
            + embedded("std_msgs/Header")
            + &sep("MSG: builtin_interfaces/Time")
            + embedded("builtin_interfaces/Time");
        assert_eq!(image.encoded_message_definition, expected);
        // The same bytes as from the embedded files the synthetic source uses.
        assert_eq!(
            image,
            local_definition("sensor_msgs/msg/Image", "", &EmbeddedFiles)
        );

        let Some(reference) = reference_string_row() else {
            return;
        };
        assert_eq!(
            (
                string.encoding.as_str(),
                string.encoded_message_definition.as_str()
            ),
            (reference.0.as_str(), reference.1.as_str())
        );
    }

    /// `(encoding, text)` of the std_msgs/msg/String row that the real `ros2 bag record`
    /// (Jazzy) wrote in the reference bag, if the reference bags are there.
    fn reference_string_row() -> Option<(String, String)> {
        let db = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/reference-bags/jazzy/jazzy_ref/jazzy_ref_0.db3");
        if !db.is_file() {
            eprintln!("SKIPPED: no reference bag at {}", db.display());
            return None;
        }
        let conn =
            rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .unwrap();
        let row = conn
            .query_row(
                "SELECT encoding, encoded_message_definition FROM message_definitions \
                 WHERE topic_type = 'std_msgs/msg/String'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        Some(row)
    }
}

/// The hand-written scans against rosbag2's very regexes, run by the `regex` crate (its
/// leftmost-first search and non-multiline `^` agree with std::regex ECMAScript here).
#[cfg(test)]
mod regex_equivalence {
    use super::*;
    use proptest::prelude::*;
    use regex::bytes::Regex;

    fn by_regex(pattern: &str, text: &str) -> Vec<String> {
        Regex::new(pattern)
            .unwrap()
            .captures_iter(text.as_bytes())
            .map(|c| String::from_utf8(c[1].to_vec()).unwrap())
            .collect()
    }

    fn tokens(choices: &'static [&'static str]) -> impl Strategy<Value = String> {
        prop::collection::vec(prop::sample::select(choices), 0..40).prop_map(|t| t.concat())
    }

    proptest! {
        #[test]
        fn msg_scan_equals_rosbag2s_regex(text in tokens(&[
            "uint8", "Foo", "p/Bar", "q/msg/Baz", " ", " ", "\n", "\n", "\t", "\r", "\x0b",
            "[", "]", "[<=3]", "#", "x", "=", "<=", "-",
        ])) {
            let expected: BTreeSet<String> =
                by_regex(r"(?-u)(?:^|\n)\s*([a-zA-Z0-9_/]+)(?:\[[^\]]*\])?\s+", &text)
                    .into_iter()
                    .filter(|t| !PRIMITIVE_TYPES.contains(&t.as_str()))
                    .map(|t| if t.contains('/') { t } else { format!("pkg/{t}") })
                    .collect();
            prop_assert_eq!(msg_dependencies(&text, "pkg"), expected);
        }

        #[test]
        fn idl_scan_equals_rosbag2s_regex(text in tokens(&[
            "#include", " ", "\n", "\t", "\"", "<", ">", "a/msg/B", "c_d/msg/E1", ".idl",
            ".h", "x", "#",
        ])) {
            let expected: BTreeSet<String> =
                by_regex(r#"(?-u)(?:^|\n)#include\s+(?:"|<)([a-zA-Z0-9_/]+)\.idl(?:"|>)"#, &text)
                    .into_iter()
                    .collect();
            prop_assert_eq!(idl_dependencies(&text), expected);
        }
    }
}
