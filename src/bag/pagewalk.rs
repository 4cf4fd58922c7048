//! Salvage of rosbag2 rows from a damaged `.db3` by walking its pages directly, without SQLite.
//!
//! This is the last resort of `reindex` when the b-tree itself is broken (torn interior pages,
//! damaged header or schema page), in the manner of SQLite's own `.recover`:
//!
//! 1. Find the page geometry: from the 100-byte header, or, when that is damaged, by trying
//!    every legal page size and keeping the one under which most pages parse as b-tree pages.
//! 2. Where `sqlite_master` (page 1) is readable, walk each table's live b-tree from its root
//!    to learn which leaf pages belong to which table. Read the freelist if it is consistent.
//! 3. Scan every other page too: any table-leaf page that is neither live nor free is an
//!    orphan (e.g. below a torn interior page) and its cells are decoded as well.
//! 4. Decode each table-leaf cell, follow its overflow chain (dropping a chain that leaves the
//!    file, loops, enters a b-tree or free page, ends early or late, or ends in an all-zero
//!    page), decode the record and classify the row by its shape.
//! 5. Deduplicate by rowid, preferring rows from the live tree over orphan copies.
//!
//! Whatever the bytes, the walk does not panic and its work is bounded: every page is parsed
//! a fixed number of times and overflow reads share a budget proportional to the file size.
//!
//! ```no_run
//! # fn main() -> Result<(), ringbag::bag::pagewalk::PagewalkError> {
//! use std::ops::ControlFlow;
//! let mut bytes = 0u64;
//! let walk = ringbag::bag::pagewalk::walk(std::path::Path::new("bag_0.db3"), |msg| {
//!     bytes += msg.data.len() as u64; // e.g. INSERT it into the fresh split
//!     ControlFlow::Continue(())
//! })?;
//! println!("{} topics, {} messages lost to broken chains", walk.topics.len(),
//!          walk.report.overflow_chains_broken);
//! # Ok(()) }
//! ```
//!
//! The file must not be written while it is mapped (another process truncating it would
//! fault the mapping); salvage runs on a closed split, so nobody writes it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

/// Errors of the page walk. Damage inside the file is never an error (it is reported in
/// [`WalkReport`]); only failing to read the file at all is.
#[derive(Debug, thiserror::Error)]
pub enum PagewalkError {
    #[error("{path}: cannot open for salvage: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: cannot map for salvage: {source}")]
    Map {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A row of `topics`. `type_description_hash` is `Some` for Jazzy's 6-column table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveredTopic {
    pub id: i64,
    pub name: String,
    pub type_name: String,
    pub serialization_format: String,
    pub offered_qos_profiles: String,
    pub type_description_hash: Option<String>,
}

/// A row of `messages`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveredMessage {
    pub id: i64,
    pub topic_id: i64,
    pub timestamp: i64,
    pub data: Vec<u8>,
}

/// A row of Jazzy's `message_definitions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveredDefinition {
    pub id: i64,
    pub topic_type: String,
    pub encoding: String,
    pub encoded_message_definition: String,
    pub type_description_hash: String,
}

/// A row of the `metadata` table (rosbag2's copy of metadata.yaml).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveredMetadata {
    pub id: i64,
    pub metadata_version: i64,
    pub metadata: String,
}

/// Where the page size came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PageSizeSource {
    /// The database header was intact.
    Header,
    /// The header was damaged; the size was inferred from the pages.
    Guessed,
    /// No page size made any page parse: nothing recoverable.
    #[default]
    NotFound,
}

/// What the walk saw and what it had to drop. Counts are of pages, cells or rows.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct WalkReport {
    pub file_bytes: u64,
    pub page_size: u32,
    pub usable_size: u32,
    pub page_size_source: PageSizeSource,
    /// Whole pages in the file.
    pub pages_total: u32,
    /// Bytes after the last whole page (a torn tail); they are ignored.
    pub truncated_tail_bytes: u64,
    /// Pages whose every byte is zero (holes left by a power loss, or zeroed damage).
    pub pages_zero: u32,
    /// Pages that are neither a valid b-tree page, a free page, nor part of a recovered
    /// overflow chain: torn, zeroed, or overflow pages of rows that were dropped.
    pub pages_unaccounted: u32,
    /// Whether page 1 held a readable `sqlite_master` with a `messages` entry.
    pub schema_page_readable: bool,
    /// Links of a live b-tree that led to a missing or invalid page.
    pub tree_links_broken: u32,
    pub leaf_pages_live: u32,
    pub leaf_pages_orphan: u32,
    /// Whether the freelist was consistent (then its pages were excluded from the scan).
    pub freelist_readable: bool,
    pub freelist_pages: u32,
    /// Table-leaf cells examined.
    pub cells_seen: u64,
    /// Cells whose structure or record header did not decode.
    pub cells_undecodable: u64,
    /// Cells that decoded but are rows of no rosbag2 table (e.g. `sqlite_master`).
    pub cells_other: u64,
    /// Rows dropped because their overflow chain was broken.
    pub overflow_chains_broken: u64,
    /// Rows that had the right shape but implausible values (bad UTF-8, ids <= 0, ...).
    pub rows_implausible: u64,
    /// Orphan rows skipped because their table's live tree covers their rowid intact: stale
    /// copies, e.g. deleted rows on free pages the freelist no longer names.
    pub rows_stale: u64,
    /// Rows skipped because a row with the same rowid was already recovered.
    pub rows_duplicate: u64,
    /// Whether the overflow read budget ran out (only adversarial bytes can cause this).
    pub overflow_budget_exhausted: bool,
    /// Whether the message callback asked to stop.
    pub stopped_early: bool,
    pub messages_recovered: u64,
    pub message_bytes_recovered: u64,
    /// Recovered messages whose topic id is not among the recovered topics.
    pub messages_unknown_topic: u64,
    pub topics_recovered: u64,
    pub schema_version: Option<i64>,
    pub distro: Option<String>,
}

/// The small tables of a walk; messages go to the callback.
#[derive(Debug, Clone, Default)]
pub struct Walk {
    /// Sorted by id.
    pub topics: Vec<RecoveredTopic>,
    /// Sorted by id.
    pub definitions: Vec<RecoveredDefinition>,
    /// Sorted by id.
    pub metadata: Vec<RecoveredMetadata>,
    pub report: WalkReport,
}

/// Tuning of the walk.
#[derive(Debug, Clone, Copy)]
pub struct WalkOptions {
    /// Treat an all-zero page at the end of an overflow chain as a hole and drop the row.
    /// Power loss commonly leaves zero-filled blocks, and without this a torn row would come
    /// back with a zeroed tail. The cost: a blob whose last page of bytes is entirely zero
    /// is dropped too.
    pub zero_page_is_hole: bool,
}

impl Default for WalkOptions {
    fn default() -> Self {
        WalkOptions {
            zero_page_is_hole: true,
        }
    }
}

/// Map the file at `path` and walk it with default options; see [`walk_bytes`].
pub fn walk<F>(path: &Path, on_message: F) -> Result<Walk, PagewalkError>
where
    F: FnMut(RecoveredMessage) -> ControlFlow<()>,
{
    walk_with(path, WalkOptions::default(), on_message)
}

/// Map the file at `path` and walk it; see [`walk_bytes`].
pub fn walk_with<F>(path: &Path, opts: WalkOptions, on_message: F) -> Result<Walk, PagewalkError>
where
    F: FnMut(RecoveredMessage) -> ControlFlow<()>,
{
    let file = File::open(path).map_err(|source| PagewalkError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let len = file
        .metadata()
        .map_err(|source| PagewalkError::Open {
            path: path.to_path_buf(),
            source,
        })?
        .len();
    if len == 0 {
        // Mapping an empty file fails on Linux; there is nothing to recover anyway.
        return Ok(walk_bytes(&[], opts, on_message));
    }
    // SAFETY: the mapping is read-only and salvage runs on a split nobody writes (see the
    // module docs); a concurrent truncation is the only way to invalidate it.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| PagewalkError::Map {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(walk_bytes(&map, opts, on_message))
}

/// Walk the bytes of a `.db3` file. Topics, definitions and metadata rows are returned;
/// each message is handed to `on_message` (return `ControlFlow::Break(())` to stop early),
/// live-tree rows first in rowid order, then orphan rows. Never panics.
pub fn walk_bytes<F>(bytes: &[u8], opts: WalkOptions, mut on_message: F) -> Walk
where
    F: FnMut(RecoveredMessage) -> ControlFlow<()>,
{
    let mut out = Walk::default();
    out.report.file_bytes = bytes.len() as u64;
    let Some((db, source)) = Db::open(bytes) else {
        return out;
    };
    out.report.page_size = db.page_size as u32;
    out.report.usable_size = db.usable as u32;
    out.report.page_size_source = source;
    out.report.pages_total = db.npages;
    out.report.truncated_tail_bytes = (bytes.len() % db.page_size) as u64;
    let mut walker = Walker::new(db, opts, out.report);
    walker.run(&mut on_message);
    walker.finish()
}

// ---------------------------------------------------------------------------------------
// Geometry and page parsing

const MAGIC: &[u8; 16] = b"SQLite format 3\0";
const PAGE_SIZES: [usize; 8] = [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536];

const LEAF_TABLE: u8 = 0x0D;
const INTERIOR_TABLE: u8 = 0x05;
const LEAF_INDEX: u8 = 0x0A;
const INTERIOR_INDEX: u8 = 0x02;

#[derive(Clone, Copy)]
struct Db<'a> {
    bytes: &'a [u8],
    page_size: usize,
    usable: usize,
    npages: u32,
}

fn be16(b: &[u8], at: usize) -> Option<usize> {
    let s = b.get(at..at.checked_add(2)?)?;
    Some(u16::from_be_bytes([s[0], s[1]]) as usize)
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
}

/// SQLite varint: 1..9 bytes, big-endian 7-bit groups, the 9th byte contributes 8 bits.
fn varint(b: &[u8], at: usize) -> Option<(u64, usize)> {
    let mut v: u64 = 0;
    for i in 0..9 {
        let byte = *b.get(at.checked_add(i)?)?;
        if i == 8 {
            return Some(((v << 8) | byte as u64, 9));
        }
        v = (v << 7) | (byte & 0x7f) as u64;
        if byte & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

impl<'a> Db<'a> {
    /// The header's geometry, unless another page size makes more pages parse (a flipped
    /// page-size field would otherwise hide every row).
    fn open(bytes: &'a [u8]) -> Option<(Db<'a>, PageSizeSource)> {
        let header = Self::from_header(bytes);
        let guessed = Self::guess(bytes);
        match (header, guessed) {
            (Some(h), Some((score, g))) if g.page_size != h.page_size && score > h.score() => {
                Some((g, PageSizeSource::Guessed))
            }
            (Some(h), _) => Some((h, PageSizeSource::Header)),
            (None, Some((_, g))) => Some((g, PageSizeSource::Guessed)),
            (None, None) => None,
        }
    }

    fn with_geometry(bytes: &'a [u8], page_size: usize, reserved: usize) -> Option<Db<'a>> {
        let usable = page_size.checked_sub(reserved)?;
        // SQLite's own minimum; the local-payload formulas assume it.
        if usable < 480 {
            return None;
        }
        let npages = u32::try_from(bytes.len() / page_size).unwrap_or(u32::MAX);
        Some(Db {
            bytes,
            page_size,
            usable,
            npages,
        })
    }

    fn from_header(bytes: &'a [u8]) -> Option<Db<'a>> {
        if bytes.get(..16)? != MAGIC {
            return None;
        }
        let raw = be16(bytes, 16)?;
        let page_size = if raw == 1 { 65536 } else { raw };
        if !PAGE_SIZES.contains(&page_size) {
            return None;
        }
        let reserved = *bytes.get(20)? as usize;
        Self::with_geometry(bytes, page_size, reserved)
    }

    /// Pages (after page 1) that are well-formed b-tree pages with every cell pointer inside
    /// the page.
    fn score(&self) -> usize {
        (2..=self.npages)
            .filter(|&p| {
                let page = self.page(p).unwrap_or(&[]);
                self.btree(p)
                    .is_some_and(|h| h.ncells > 0 && h.cells(page).all(|c| c.is_some()))
            })
            .count()
    }

    /// Try every legal page size (reserved bytes assumed 0, as rosbag2 writes) and keep the
    /// one under which most pages are well-formed b-tree pages. A wrong size either misses
    /// real page starts (too large) or sees cell pointers beyond its page end (too small).
    fn guess(bytes: &'a [u8]) -> Option<(usize, Db<'a>)> {
        let mut best: Option<(usize, Db<'a>)> = None;
        for &size in &PAGE_SIZES {
            let Some(db) = Self::with_geometry(bytes, size, 0) else {
                continue;
            };
            let score = db.score();
            // Ties go to the larger size: it is the one whose pages contain the others' hits.
            if score > 0 && best.as_ref().is_none_or(|(s, _)| score >= *s) {
                best = Some((score, db));
            }
        }
        best
    }

    fn page(&self, pgno: u32) -> Option<&'a [u8]> {
        if pgno == 0 || pgno > self.npages {
            return None;
        }
        let start = (pgno as usize - 1).checked_mul(self.page_size)?;
        self.bytes.get(start..start.checked_add(self.page_size)?)
    }

    /// Parse the b-tree page header of `pgno` and check it is self-consistent.
    fn btree(&self, pgno: u32) -> Option<BtreeHeader> {
        let page = self.page(pgno)?;
        let hdr = if pgno == 1 { 100 } else { 0 };
        let kind = *page.get(hdr)?;
        let interior = match kind {
            LEAF_TABLE | LEAF_INDEX => false,
            INTERIOR_TABLE | INTERIOR_INDEX => true,
            _ => return None,
        };
        let hdr_len = if interior { 12 } else { 8 };
        let first_freeblock = be16(page, hdr + 1)?;
        let ncells = be16(page, hdr + 3)?;
        let content = match be16(page, hdr + 5)? {
            0 => 65536,
            c => c,
        };
        let ptr_start = hdr + hdr_len;
        let ptr_end = ptr_start.checked_add(ncells * 2)?;
        if ptr_end > self.usable {
            return None;
        }
        if ncells > 0 && (content < ptr_end || content > self.usable) {
            return None;
        }
        if first_freeblock != 0 && (first_freeblock < ptr_end || first_freeblock + 4 > self.usable)
        {
            return None;
        }
        let right_child = if interior {
            Some(be32(page, hdr + 8)?)
        } else {
            None
        };
        Some(BtreeHeader {
            kind,
            ncells,
            ptr_start,
            ptr_end,
            usable: self.usable,
            right_child,
        })
    }
}

struct BtreeHeader {
    kind: u8,
    ncells: usize,
    ptr_start: usize,
    ptr_end: usize,
    usable: usize,
    right_child: Option<u32>,
}

impl BtreeHeader {
    /// Cell offsets; `None` for a pointer outside the cell content area.
    fn cells<'p>(&'p self, page: &'p [u8]) -> impl Iterator<Item = Option<usize>> + 'p {
        (0..self.ncells).map(move |i| {
            let pc = be16(page, self.ptr_start + 2 * i)?;
            (pc >= self.ptr_end && pc < self.usable).then_some(pc)
        })
    }
}

/// A decoded table-leaf cell, before its overflow chain is followed.
struct LeafCell<'a> {
    rowid: i64,
    payload_len: usize,
    local: &'a [u8],
    first_overflow: Option<u32>,
}

impl Db<'_> {
    /// Bytes of a payload of `p` bytes stored on a table-leaf page (SQLite file format 1.6).
    fn local_size(&self, p: usize) -> usize {
        let u = self.usable;
        let x = u - 35;
        if p <= x {
            return p;
        }
        let m = ((u - 12) * 32 / 255) - 23;
        let k = m + ((p - m) % (u - 4));
        if k <= x {
            k
        } else {
            m
        }
    }

    fn leaf_cell<'p>(&self, page: &'p [u8], pc: usize) -> Option<LeafCell<'p>> {
        let page = page.get(..self.usable)?;
        let (p, n1) = varint(page, pc)?;
        let (rowid, n2) = varint(page, pc + n1)?;
        // A payload cannot exceed the file; this also bounds every later allocation.
        let p = usize::try_from(p).ok()?;
        if p as u64 > self.npages as u64 * self.usable as u64 {
            return None;
        }
        let start = pc + n1 + n2;
        let local_len = self.local_size(p);
        let local = page.get(start..start.checked_add(local_len)?)?;
        let first_overflow = if local_len < p {
            Some(be32(page, start + local_len)?)
        } else {
            None
        };
        Some(LeafCell {
            rowid: rowid as i64,
            payload_len: p,
            local,
            first_overflow,
        })
    }
}

// ---------------------------------------------------------------------------------------
// Records

/// Up to this many columns are decoded; rosbag2 rows have at most 6.
const MAX_COLS: usize = 8;

#[derive(Clone, Copy)]
struct RecordHeader {
    len: usize,
    ncols: usize,
    types: [u64; MAX_COLS],
}

fn serial_size(t: u64) -> Option<usize> {
    Some(match t {
        0 | 8 | 9 => 0,
        1 => 1,
        2 => 2,
        3 => 3,
        4 => 4,
        5 => 6,
        6 | 7 => 8,
        10 | 11 => return None,
        n => usize::try_from((n - 12) / 2).ok()?,
    })
}

fn is_int(t: u64) -> bool {
    matches!(t, 1..=6 | 8 | 9)
}
fn is_text(t: u64) -> bool {
    t >= 13 && t % 2 == 1
}
fn is_blob(t: u64) -> bool {
    t >= 12 && t.is_multiple_of(2)
}

/// Parse the record header from the payload's first bytes and check that header plus body
/// add up to exactly the payload length.
fn record_header(prefix: &[u8], payload_len: usize) -> Option<RecordHeader> {
    let (len, n) = varint(prefix, 0)?;
    let len = usize::try_from(len).ok()?;
    if len > prefix.len() || len > payload_len || len < n {
        return None;
    }
    let mut h = RecordHeader {
        len,
        ncols: 0,
        types: [0; MAX_COLS],
    };
    let mut at = n;
    let mut body = 0usize;
    while at < len {
        let (t, k) = varint(&prefix[..len], at)?;
        at += k;
        if h.ncols == MAX_COLS {
            return None;
        }
        h.types[h.ncols] = t;
        h.ncols += 1;
        body = body.checked_add(serial_size(t)?)?;
    }
    (at == len && len.checked_add(body)? == payload_len).then_some(h)
}

fn int_value(t: u64, b: &[u8]) -> Option<i64> {
    let n = serial_size(t)?;
    let s = b.get(..n)?;
    Some(match t {
        8 => 0,
        9 => 1,
        _ => {
            // Sign-extend a big-endian two's-complement integer of n bytes.
            let mut v: i64 = if s.first().is_some_and(|&x| x & 0x80 != 0) {
                -1
            } else {
                0
            };
            for &x in s {
                v = (v << 8) | x as i64;
            }
            v
        }
    })
}

/// Column values of a whole payload, as byte ranges (ints decoded).
enum Col {
    Null,
    Int(i64),
    Bytes(usize, usize),
}

fn columns(h: &RecordHeader, payload: &[u8]) -> Option<Vec<Col>> {
    let mut at = h.len;
    let mut out = Vec::with_capacity(h.ncols);
    for &t in &h.types[..h.ncols] {
        let n = serial_size(t)?;
        let end = at.checked_add(n)?;
        let bytes = payload.get(at..end)?;
        out.push(match t {
            0 => Col::Null,
            7 => return None, // no rosbag2 column is a REAL
            _ if is_int(t) => Col::Int(int_value(t, bytes)?),
            _ => Col::Bytes(at, end),
        });
        at = end;
    }
    Some(out)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Message,
    /// NULL then 4 or 5 TEXT: a topic, or (5 columns) a message definition.
    Texts,
    Schema,
    Metadata,
    Other,
}

fn shape(h: &RecordHeader) -> Shape {
    let t = &h.types[..h.ncols];
    match t {
        [0, a, b, c] if is_int(*a) && is_int(*b) && is_blob(*c) => Shape::Message,
        [0, rest @ ..]
            if (rest.len() == 4 || rest.len() == 5) && rest.iter().all(|&x| is_text(x)) =>
        {
            Shape::Texts
        }
        [0, a] if is_text(*a) => Shape::Schema,
        [0, a, b] if is_int(*a) && is_text(*b) => Shape::Metadata,
        _ => Shape::Other,
    }
}

/// Which rosbag2 table a live b-tree belongs to, from `sqlite_master`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Table {
    Messages,
    Topics,
    Definitions,
    Schema,
    Metadata,
    Unknown,
}

impl Table {
    fn from_name(name: &[u8]) -> Table {
        match name {
            b"messages" => Table::Messages,
            b"topics" => Table::Topics,
            b"message_definitions" => Table::Definitions,
            b"schema" => Table::Schema,
            b"metadata" => Table::Metadata,
            _ => Table::Unknown,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Deduplication

/// Set of rowids as merged inclusive ranges: recovered rowids are nearly contiguous, so this
/// stays tiny where a hash set of a multi-GB bag's ids would not.
#[derive(Default)]
struct IdSet {
    ranges: BTreeMap<i64, i64>,
}

impl IdSet {
    fn contains(&self, x: i64) -> bool {
        self.ranges
            .range(..=x)
            .next_back()
            .is_some_and(|(_, &end)| x <= end)
    }

    /// Returns false when `x` was already present.
    fn insert(&mut self, x: i64) -> bool {
        if self.contains(x) {
            return false;
        }
        let mut start = x;
        let mut end = x;
        if let Some(prev) = x.checked_sub(1) {
            if let Some((&s, &e)) = self.ranges.range(..=prev).next_back() {
                if e == prev {
                    start = s;
                }
            }
        }
        if let Some(next) = x.checked_add(1) {
            if let Some(e) = self.ranges.remove(&next) {
                end = e;
            }
        }
        self.ranges.insert(start, end);
        true
    }
}

// ---------------------------------------------------------------------------------------
// The walk

/// Rowids `lo < id <= hi`; `None` is unbounded.
#[derive(Debug, Clone, Copy)]
struct Span {
    lo: Option<i64>,
    hi: Option<i64>,
}

impl Span {
    const ALL: Span = Span { lo: None, hi: None };
    fn contains(&self, x: i64) -> bool {
        self.lo.is_none_or(|l| x > l) && self.hi.is_none_or(|h| x <= h)
    }
}

struct Leaf {
    pgno: u32,
    owner: Option<Table>,
    /// The rowids its parent keys allow; a cell outside them was damaged (e.g. a flipped
    /// rowid varint) and is dropped. Unbounded for orphans.
    span: Span,
}

struct Walker<'a> {
    db: Db<'a>,
    opts: WalkOptions,
    report: WalkReport,
    /// Pages of live b-trees (all kinds), and the freelist when it was consistent. Neither
    /// may appear in an overflow chain, and neither is scanned as an orphan.
    btree_pages: HashSet<u32>,
    free_pages: HashSet<u32>,
    /// Table leaves in processing order: live trees first (in key order), then orphans.
    leaves: Vec<Leaf>,
    overflow_used: HashSet<u32>,
    overflow_budget: u64,
    topics: BTreeMap<i64, RecoveredTopic>,
    definitions: BTreeMap<i64, RecoveredDefinition>,
    metadata: BTreeMap<i64, RecoveredMetadata>,
    message_ids: IdSet,
    /// Per table whose root is known: rowid ranges of its lost subtrees.
    gaps: HashMap<Table, Vec<Span>>,
}

impl<'a> Walker<'a> {
    fn new(db: Db<'a>, opts: WalkOptions, report: WalkReport) -> Self {
        Walker {
            db,
            opts,
            report,
            btree_pages: HashSet::new(),
            free_pages: HashSet::new(),
            leaves: Vec::new(),
            overflow_used: HashSet::new(),
            // A sound file reads each overflow page once; stale copies may add a few more
            // reads. Beyond this only crafted bytes (many cells sharing long chains) go.
            overflow_budget: 8 * db.npages as u64 + 4096,
            topics: BTreeMap::new(),
            definitions: BTreeMap::new(),
            metadata: BTreeMap::new(),
            message_ids: IdSet::default(),
            gaps: HashMap::new(),
        }
    }

    fn run(&mut self, on_message: &mut dyn FnMut(RecoveredMessage) -> ControlFlow<()>) {
        let roots = self.read_master();
        for (root, table) in roots {
            self.walk_tree(root, table);
        }
        self.read_freelist();
        self.find_orphans();
        self.count_pages();
        self.collect_small_rows();
        self.collect_messages(on_message);
        // Overflow pages only become known while rows are assembled.
        self.report.pages_unaccounted = self
            .report
            .pages_unaccounted
            .saturating_sub(self.overflow_used.len() as u32);
    }

    fn finish(self) -> Walk {
        let mut report = self.report;
        report.topics_recovered = self.topics.len() as u64;
        Walk {
            topics: self.topics.into_values().collect(),
            definitions: self.definitions.into_values().collect(),
            metadata: self.metadata.into_values().collect(),
            report,
        }
    }

    /// Read the freelist so stale rows on free pages are not resurrected. Trunk pages are
    /// trusted one by one up to the first inconsistent one (a truncated or torn list still
    /// names genuinely free pages before the damage); a trunk naming a live b-tree page is
    /// inconsistent, so live rows can never be hidden this way.
    fn read_freelist(&mut self) {
        let Some(header) = self.db.bytes.get(..100) else {
            return;
        };
        if self.report.page_size_source != PageSizeSource::Header {
            return;
        }
        let (Some(mut trunk), Some(count)) = (be32(header, 32), be32(header, 36)) else {
            return;
        };
        let mut pages = HashSet::new();
        let mut complete = false;
        let cap = (self.db.usable / 4).saturating_sub(2);
        loop {
            if trunk == 0 {
                complete = true;
                break;
            }
            if trunk == 1 || self.btree_pages.contains(&trunk) || pages.contains(&trunk) {
                break;
            }
            let Some(page) = self.db.page(trunk) else {
                break;
            };
            let (Some(next), Some(n)) = (be32(page, 0), be32(page, 4)) else {
                break;
            };
            let n = n as usize;
            if n > cap {
                break;
            }
            let leaves: Vec<u32> = (0..n).filter_map(|i| be32(page, 8 + 4 * i)).collect();
            let consistent = leaves.iter().all(|&l| {
                l >= 2 && l != trunk && !self.btree_pages.contains(&l) && !pages.contains(&l)
            });
            if !consistent {
                break;
            }
            pages.insert(trunk);
            // Entries past the end of a truncated file are simply gone.
            pages.extend(leaves.into_iter().filter(|&l| l <= self.db.npages));
            trunk = next;
        }
        self.report.freelist_readable = complete && pages.len() as u64 == count as u64;
        self.report.freelist_pages = pages.len() as u32;
        self.free_pages = pages;
    }

    /// Root pages of the rosbag2 tables and indexes, from the rows of `sqlite_master`
    /// reachable from page 1.
    fn read_master(&mut self) -> Vec<(u32, Table)> {
        let mut roots = Vec::new();
        let mut stack = vec![1u32];
        let mut seen = HashSet::new();
        while let Some(pgno) = stack.pop() {
            if !seen.insert(pgno) {
                continue;
            }
            let Some(h) = self.db.btree(pgno) else {
                continue;
            };
            let Some(page) = self.db.page(pgno) else {
                continue;
            };
            if h.kind == INTERIOR_TABLE {
                stack.extend(self.interior_children(page, &h));
                continue;
            }
            if h.kind != LEAF_TABLE {
                continue;
            }
            for pc in h.cells(page).flatten() {
                if let Some((root, table)) = self.master_row(page, pc) {
                    roots.push((root, table));
                }
            }
        }
        self.report.schema_page_readable = roots.iter().any(|&(_, t)| t == Table::Messages);
        // sqlite_master's own pages are b-tree pages too.
        self.btree_pages
            .extend(seen.iter().filter(|&&p| self.db.btree(p).is_some()));
        roots
    }

    /// A `sqlite_master` row: (type, name, tbl_name, rootpage, sql).
    fn master_row(&mut self, page: &[u8], pc: usize) -> Option<(u32, Table)> {
        let cell = self.db.leaf_cell(page, pc)?;
        let payload = self.payload(&cell, false).ok()?;
        let h = record_header(&payload, cell.payload_len)?;
        let t = &h.types[..h.ncols];
        if t.len() != 5 || !is_text(t[0]) || !is_text(t[1]) || !is_int(t[3]) {
            return None;
        }
        let cols = columns(&h, &payload)?;
        let (Col::Bytes(a, b), Col::Bytes(c, d), Col::Int(root)) =
            (cols.first()?, cols.get(1)?, cols.get(3)?)
        else {
            return None;
        };
        let kind = payload.get(*a..*b)?;
        let name = payload.get(*c..*d)?;
        let root = u32::try_from(*root).ok().filter(|&r| r >= 2)?;
        match kind {
            b"table" => Some((root, Table::from_name(name))),
            // Index pages matter only so overflow chains cannot run into them.
            b"index" => Some((root, Table::Unknown)),
            _ => None,
        }
    }

    fn interior_children(&self, page: &[u8], h: &BtreeHeader) -> Vec<u32> {
        let mut kids: Vec<u32> = h
            .cells(page)
            .flatten()
            .filter_map(|pc| be32(page, pc))
            .collect();
        kids.extend(h.right_child);
        kids
    }

    /// Walk one live b-tree depth-first in key order, recording its pages and table leaves.
    /// For a table, each link that leads nowhere valid records the rowid range it covered
    /// (from the interior keys): only orphan rows inside such a gap can belong to the table;
    /// an orphan row elsewhere is a stale copy (e.g. a deleted row on an unlisted free page).
    fn walk_tree(&mut self, root: u32, table: Table) {
        let mut gaps = Vec::new();
        let mut stack = vec![(root, Span::ALL)];
        let mut expect_index: Option<bool> = None;
        while let Some((pgno, span)) = stack.pop() {
            let h = match self.db.btree(pgno) {
                Some(h) if !self.btree_pages.contains(&pgno) => h,
                _ => {
                    self.report.tree_links_broken += 1;
                    gaps.push(span);
                    continue;
                }
            };
            // One tree holds one kind of page; a child of the other kind is a torn link.
            let is_index = matches!(h.kind, LEAF_INDEX | INTERIOR_INDEX);
            if *expect_index.get_or_insert(is_index) != is_index {
                self.report.tree_links_broken += 1;
                gaps.push(span);
                continue;
            }
            let Some(page) = self.db.page(pgno) else {
                continue;
            };
            self.btree_pages.insert(pgno);
            match h.kind {
                INTERIOR_INDEX => {
                    let mut kids = self.interior_children(page, &h);
                    kids.reverse();
                    stack.extend(kids.into_iter().map(|k| (k, Span::ALL)));
                }
                INTERIOR_TABLE => {
                    let mut kids = Vec::with_capacity(h.ncells + 1);
                    let mut lo = span.lo;
                    let mut broken_since: Option<Option<i64>> = None;
                    for pc in h.cells(page) {
                        let link = pc
                            .and_then(|pc| Some((be32(page, pc)?, varint(page, pc + 4)?.0 as i64)));
                        match link {
                            Some((child, key))
                                if lo.is_none_or(|l| key > l)
                                    && span.hi.is_none_or(|h| key <= h) =>
                            {
                                if let Some(from) = broken_since.take() {
                                    gaps.push(Span {
                                        lo: from,
                                        hi: Some(key),
                                    });
                                }
                                kids.push((child, Span { lo, hi: Some(key) }));
                                lo = Some(key);
                            }
                            _ => {
                                self.report.tree_links_broken += 1;
                                broken_since.get_or_insert(lo);
                            }
                        }
                    }
                    if let Some(from) = broken_since {
                        gaps.push(Span {
                            lo: from,
                            hi: span.hi,
                        });
                    }
                    if let Some(right) = h.right_child {
                        kids.push((right, Span { lo, hi: span.hi }));
                    }
                    kids.reverse();
                    stack.extend(kids);
                }
                LEAF_TABLE => {
                    self.leaves.push(Leaf {
                        pgno,
                        owner: Some(table),
                        span,
                    });
                    self.report.leaf_pages_live += 1;
                    // Rows past the rightmost leaf are not contradicted by the tree: a torn
                    // append can leave new leaves whose parent update never reached disk.
                    if span.hi.is_none() {
                        let last = h
                            .cells(page)
                            .flatten()
                            .filter_map(|pc| self.db.leaf_cell(page, pc).map(|c| c.rowid))
                            .max();
                        gaps.push(Span {
                            lo: last.or(span.lo),
                            hi: None,
                        });
                    }
                }
                _ => {}
            }
        }
        if table != Table::Unknown {
            self.gaps.entry(table).or_default().extend(gaps);
        }
    }

    /// An orphan row outside its table's lost ranges is counted and skipped.
    fn is_stale(&mut self, owner: Option<Table>, table: Table, rowid: i64) -> bool {
        let stale = owner.is_none() && !self.orphan_fits(table, rowid);
        if stale {
            self.report.rows_stale += 1;
        }
        stale
    }

    /// Whether an orphan row of `table` may be genuine: its table's tree is unknown, or the
    /// rowid falls in a range whose subtree was lost.
    fn orphan_fits(&self, table: Table, rowid: i64) -> bool {
        self.gaps
            .get(&table)
            .is_none_or(|gaps| gaps.iter().any(|g| g.contains(rowid)))
    }

    fn find_orphans(&mut self) {
        for pgno in 2..=self.db.npages {
            if self.btree_pages.contains(&pgno) || self.free_pages.contains(&pgno) {
                continue;
            }
            if self.db.btree(pgno).is_some_and(|h| h.kind == LEAF_TABLE) {
                self.leaves.push(Leaf {
                    pgno,
                    owner: None,
                    span: Span::ALL,
                });
                self.report.leaf_pages_orphan += 1;
            }
        }
    }

    fn count_pages(&mut self) {
        let mut accounted = 0u32;
        for pgno in 1..=self.db.npages {
            let Some(page) = self.db.page(pgno) else {
                continue;
            };
            if page.iter().all(|&b| b == 0) {
                self.report.pages_zero += 1;
            }
            if self.free_pages.contains(&pgno) || self.db.btree(pgno).is_some() {
                accounted += 1;
            }
        }
        self.report.pages_unaccounted = self.db.npages - accounted;
    }

    /// The whole payload of a cell: borrowed when local, assembled from its overflow chain
    /// otherwise. The chain is validated completely before anything is copied.
    fn payload<'p>(
        &mut self,
        cell: &LeafCell<'p>,
        count_broken: bool,
    ) -> Result<std::borrow::Cow<'p, [u8]>, ()> {
        let Some(first) = cell.first_overflow else {
            return Ok(std::borrow::Cow::Borrowed(cell.local));
        };
        let per_page = self.db.usable - 4;
        let rest = cell.payload_len - cell.local.len();
        let n = rest.div_ceil(per_page);
        // Grown as needed: a garbage cell may claim a huge chain and fail on its first page.
        let mut chain = Vec::new();
        let mut seen = HashSet::new();
        let mut pgno = first;
        for i in 0..n {
            let ok = self.overflow_budget > 0
                && !self.btree_pages.contains(&pgno)
                && !self.free_pages.contains(&pgno)
                && pgno != 1
                && seen.insert(pgno);
            if self.overflow_budget == 0 {
                self.report.overflow_budget_exhausted = true;
            }
            self.overflow_budget = self.overflow_budget.saturating_sub(1);
            let page = if ok { self.db.page(pgno) } else { None };
            let next = page.and_then(|p| be32(p, 0));
            let last = i + 1 == n;
            let good = match (page, next) {
                (Some(p), Some(next)) if last => {
                    next == 0
                        && !(self.opts.zero_page_is_hole
                            && p[..self.db.usable].iter().all(|&b| b == 0))
                }
                (Some(_), Some(next)) => next != 0,
                _ => false,
            };
            if !good {
                if count_broken {
                    self.report.overflow_chains_broken += 1;
                }
                return Err(());
            }
            chain.push(pgno);
            pgno = next.unwrap_or(0);
        }
        let mut out = Vec::with_capacity(cell.payload_len);
        out.extend_from_slice(cell.local);
        for pg in chain {
            let page = self.db.page(pg).ok_or(())?;
            let take = per_page.min(cell.payload_len - out.len());
            out.extend_from_slice(page.get(4..4 + take).ok_or(())?);
            self.overflow_used.insert(pg);
        }
        Ok(std::borrow::Cow::Owned(out))
    }

    /// First pass: every table-leaf cell is counted and classified; rows of the small
    /// tables are decoded and kept. Messages wait for the second pass.
    fn collect_small_rows(&mut self) {
        let leaves = std::mem::take(&mut self.leaves);
        for leaf in &leaves {
            let (Some(h), Some(page)) = (self.db.btree(leaf.pgno), self.db.page(leaf.pgno)) else {
                continue;
            };
            for pc in h.cells(page) {
                self.report.cells_seen += 1;
                let Some((cell, rh)) = pc.and_then(|pc| self.decode(leaf, page, pc)) else {
                    self.report.cells_undecodable += 1;
                    continue;
                };
                match shape(&rh) {
                    Shape::Message => {}
                    Shape::Other => self.report.cells_other += 1,
                    s => self.small_row(s, leaf.owner, &cell, &rh),
                }
            }
        }
        self.leaves = leaves;
    }

    fn decode<'p>(
        &self,
        leaf: &Leaf,
        page: &'p [u8],
        pc: usize,
    ) -> Option<(LeafCell<'p>, RecordHeader)> {
        let cell = self.db.leaf_cell(page, pc)?;
        if !leaf.span.contains(cell.rowid) {
            return None;
        }
        let rh = record_header(cell.local, cell.payload_len)?;
        Some((cell, rh))
    }

    fn small_row(
        &mut self,
        s: Shape,
        owner: Option<Table>,
        cell: &LeafCell<'_>,
        rh: &RecordHeader,
    ) {
        let Ok(payload) = self.payload(cell, true) else {
            return;
        };
        let Some(cols) = columns(rh, &payload) else {
            self.report.cells_undecodable += 1;
            return;
        };
        let text = |i: usize| -> Option<String> {
            match cols.get(i)? {
                Col::Bytes(a, b) => String::from_utf8(payload.get(*a..*b)?.to_vec()).ok(),
                _ => None,
            }
        };
        let id = cell.rowid;
        let fresh = match s {
            Shape::Texts => {
                let texts: Option<Vec<String>> = (1..rh.ncols).map(text).collect();
                let Some(mut t) = texts.filter(|_| id > 0) else {
                    self.report.rows_implausible += 1;
                    return;
                };
                // Jazzy topics have 6 columns; 5 is a Humble topic or a message definition,
                // told apart by the owning table or else by the topic name's leading '/'.
                let is_topic = match owner {
                    Some(Table::Topics) => true,
                    Some(Table::Definitions) => false,
                    _ => t.len() == 5 || t[0].starts_with('/'),
                };
                let table = if is_topic {
                    Table::Topics
                } else {
                    Table::Definitions
                };
                if self.is_stale(owner, table, id) {
                    return;
                }
                if is_topic {
                    if !t[0].starts_with('/') || t[1].is_empty() || t[2].is_empty() {
                        self.report.rows_implausible += 1;
                        return;
                    }
                    let hash = (t.len() == 5).then(|| t.pop().unwrap_or_default());
                    let mut it = t.into_iter();
                    let mut next = || it.next().unwrap_or_default();
                    let topic = RecoveredTopic {
                        id,
                        name: next(),
                        type_name: next(),
                        serialization_format: next(),
                        offered_qos_profiles: next(),
                        type_description_hash: hash,
                    };
                    insert_first(&mut self.topics, id, topic)
                } else {
                    let mut it = t.into_iter();
                    let mut next = || it.next().unwrap_or_default();
                    let def = RecoveredDefinition {
                        id,
                        topic_type: next(),
                        encoding: next(),
                        encoded_message_definition: next(),
                        type_description_hash: next(),
                    };
                    insert_first(&mut self.definitions, id, def)
                }
            }
            Shape::Schema if self.is_stale(owner, Table::Schema, id) => return,
            Shape::Metadata if self.is_stale(owner, Table::Metadata, id) => return,
            Shape::Schema => match text(1) {
                Some(d)
                    if (1..=1000).contains(&id)
                        && !d.is_empty()
                        && d.len() <= 32
                        && d.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') =>
                {
                    let fresh = self.report.schema_version.is_none();
                    if fresh {
                        self.report.schema_version = Some(id);
                        self.report.distro = Some(d);
                    }
                    fresh
                }
                _ => {
                    self.report.rows_implausible += 1;
                    return;
                }
            },
            Shape::Metadata => match (cols.get(1), text(2)) {
                (Some(Col::Int(v)), Some(m)) if id > 0 && *v > 0 => insert_first(
                    &mut self.metadata,
                    id,
                    RecoveredMetadata {
                        id,
                        metadata_version: *v,
                        metadata: m,
                    },
                ),
                _ => {
                    self.report.rows_implausible += 1;
                    return;
                }
            },
            Shape::Message | Shape::Other => return,
        };
        if !fresh {
            self.report.rows_duplicate += 1;
        }
    }

    /// Second pass: message rows, live tree first, each handed to the callback once.
    fn collect_messages(
        &mut self,
        on_message: &mut dyn FnMut(RecoveredMessage) -> ControlFlow<()>,
    ) {
        let leaves = std::mem::take(&mut self.leaves);
        'pages: for leaf in &leaves {
            let (Some(h), Some(page)) = (self.db.btree(leaf.pgno), self.db.page(leaf.pgno)) else {
                continue;
            };
            for pc in h.cells(page).flatten() {
                let Some((cell, rh)) = self.decode(leaf, page, pc) else {
                    continue;
                };
                if shape(&rh) != Shape::Message {
                    continue;
                }
                let Some(msg) = self.message(leaf.owner, &cell, &rh) else {
                    continue;
                };
                if !self.message_ids.insert(msg.id) {
                    self.report.rows_duplicate += 1;
                    continue;
                }
                self.report.messages_recovered += 1;
                self.report.message_bytes_recovered += msg.data.len() as u64;
                if !self.topics.contains_key(&msg.topic_id) {
                    self.report.messages_unknown_topic += 1;
                }
                if on_message(msg).is_break() {
                    self.report.stopped_early = true;
                    break 'pages;
                }
            }
        }
        self.leaves = leaves;
    }

    fn message(
        &mut self,
        owner: Option<Table>,
        cell: &LeafCell<'_>,
        rh: &RecordHeader,
    ) -> Option<RecoveredMessage> {
        if self.is_stale(owner, Table::Messages, cell.rowid) {
            return None;
        }
        // Skip the copy of a row that is already recovered (a stale duplicate).
        if self.message_ids.contains(cell.rowid) {
            self.report.rows_duplicate += 1;
            return None;
        }
        let payload = self.payload(cell, true).ok()?;
        let Some(cols) = columns(rh, &payload) else {
            self.report.cells_undecodable += 1;
            return None;
        };
        match (cols.get(1), cols.get(2), cols.get(3)) {
            (Some(Col::Int(topic_id)), Some(Col::Int(timestamp)), Some(Col::Bytes(a, _)))
                if cell.rowid > 0 && *topic_id > 0 && *timestamp >= 0 =>
            {
                // The blob is the record's tail: drop the head in place instead of copying.
                let data = match payload {
                    std::borrow::Cow::Owned(mut v) => {
                        v.drain(..*a);
                        v
                    }
                    std::borrow::Cow::Borrowed(b) => b.get(*a..)?.to_vec(),
                };
                Some(RecoveredMessage {
                    id: cell.rowid,
                    topic_id: *topic_id,
                    timestamp: *timestamp,
                    data,
                })
            }
            _ => {
                self.report.rows_implausible += 1;
                None
            }
        }
    }
}

/// Insert unless the id is taken; returns whether it was inserted.
fn insert_first<T>(map: &mut BTreeMap<i64, T>, id: i64, v: T) -> bool {
    match map.entry(id) {
        std::collections::btree_map::Entry::Vacant(e) => {
            e.insert(v);
            true
        }
        std::collections::btree_map::Entry::Occupied(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_decodes_one_and_nine_byte_forms() {
        assert_eq!(varint(&[0x05], 0), Some((5, 1)));
        assert_eq!(varint(&[0x81, 0x00], 0), Some((128, 2)));
        assert_eq!(varint(&[0xff; 9], 0), Some((u64::MAX, 9)));
        assert_eq!(varint(&[0x81], 0), None);
    }

    #[test]
    fn id_set_merges_adjacent_ranges() {
        let mut s = IdSet::default();
        for x in [1, 3, 2, 10, 5, 4] {
            assert!(s.insert(x));
        }
        assert!(!s.insert(3));
        assert_eq!(s.ranges.len(), 2);
        assert!(s.contains(5) && s.contains(10) && !s.contains(6) && !s.contains(0));
        assert!(s.insert(i64::MIN) && s.insert(i64::MAX));
    }

    #[test]
    fn local_size_matches_sqlite_for_4096_byte_pages() {
        let db = Db {
            bytes: &[],
            page_size: 4096,
            usable: 4096,
            npages: 0,
        };
        assert_eq!(db.local_size(4061), 4061);
        // M = (4084*32/255)-23 = 489; P=4062: K = 489 + (3573 % 4092) = 4062 > X -> M.
        assert_eq!(db.local_size(4062), 489);
        // P = 489 + 4092 + 100: K = 489 + 100 = 589.
        assert_eq!(db.local_size(489 + 4092 + 100), 589);
    }

    #[test]
    fn garbage_and_tiny_inputs_recover_nothing() {
        for bytes in [vec![], vec![0u8; 50], vec![0xAB; 10_000]] {
            let w = walk_bytes(
                &bytes,
                WalkOptions::default(),
                |_| ControlFlow::Continue(()),
            );
            assert!(w.topics.is_empty());
            assert_eq!(w.report.messages_recovered, 0);
        }
    }
}
