//! `ringbag convert`: rewrite one or more bags into the bags an options file lists, as
//! `ros2 bag convert -i BAG -o OPTIONS.yaml` does. Several inputs are merged in timestamp
//! order; each output entry picks its own topics, time window, splits and flavour.
//!
//! Everything is checked before anything is written (the options, every input bag, every
//! output uri), so bad input leaves no half-made output behind. Messages are copied as
//! stored bytes: reading goes through [`crate::bag::reader`], writing through the same
//! [`BagWriter`] `record` uses, so an output is byte-for-byte what a recording of the same
//! messages would be. An output with `compression_mode: file` is compressed split by split
//! by the recorder's compressor (`pipeline::compress`), in its offline mode
//! ([`BagWriter::compress_offline`]): the writer waits for the queue, and a failed split fails
//! the command once every output is finished.

pub mod options;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::{Path, PathBuf};

use crate::bag::reader::{open_read_only, Bag, MessageIter, ReadFilter, ReadMessage};
use crate::bag::writer::{BagSummary, BagWriter, WriterOptions};
use crate::bag::{BagError, MessageDefinition, TopicInfo};
use crate::source::select::Decision;
pub use options::{parse_options, OutputBag};

/// Messages buffered per output before one write: one SQLite transaction per batch, as the
/// recorder's writer thread does, instead of one per message.
const BATCH_MESSAGES: usize = 1024;
/// ... or this many payload bytes, whichever comes first.
const BATCH_BYTES: u64 = 8 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// The options file or the inputs are not usable: nothing was written (exit 2).
    #[error("{0}")]
    BadInput(String),
    /// Writing failed part-way (exit 1).
    #[error(transparent)]
    Bag(#[from] BagError),
}

/// One output being written: its writer, and for each input topic index the output index
/// (`None`: not selected).
struct Out<'a> {
    spec: &'a OutputBag,
    writer: BagWriter,
    map: Vec<Vec<Option<usize>>>,
    batch: Vec<(usize, i64, Vec<u8>)>,
    batch_bytes: u64,
    /// Flush at this many payload bytes: the writer projects a split's size from its last
    /// commit plus an estimate per row, so a small batch keeps a size split close to its
    /// limit (the recorder caps its batches the same way under retention).
    batch_cap: u64,
    /// `compression_mode: message`: each row compressed before it is written, so the split
    /// size counts the compressed bytes (as the recorder does).
    zip: Option<crate::bag::compressed::MessageZip>,
}

impl Out<'_> {
    fn flush(&mut self) -> Result<(), BagError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let rows = self.batch.iter().map(|(t, ts, d)| (*t, *ts, d.as_slice()));
        match self.zip.as_mut() {
            None => self.writer.write_batch(rows)?,
            Some(z) => {
                let rows: Vec<_> = rows.collect();
                let zipped = z
                    .compress(&rows)
                    .map_err(crate::bag::BagError::io(self.writer.dir()))?;
                self.writer.write_batch(zipped)?;
            }
        }
        self.batch.clear();
        self.batch_bytes = 0;
        Ok(())
    }
}

/// Definitions of the types in a Jazzy bag's `message_definitions` tables (first row per
/// type wins); a Humble bag has none, and the writer then stores rosbag2's `unknown` row.
fn read_definitions(bag: &Bag) -> Result<Vec<MessageDefinition>, BagError> {
    let mut defs: Vec<MessageDefinition> = Vec::new();
    for s in &bag.splits {
        let conn = open_read_only(&s.path)?;
        let has: bool = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='message_definitions'",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map_err(BagError::sqlite(&s.path))?
            > 0;
        if !has {
            continue;
        }
        let mut st = conn
            .prepare("SELECT topic_type, encoding, encoded_message_definition, type_description_hash FROM message_definitions ORDER BY id")
            .map_err(BagError::sqlite(&s.path))?;
        let rows = st
            .query_map([], |r| {
                Ok(MessageDefinition {
                    topic_type: r.get(0)?,
                    encoding: r.get(1)?,
                    encoded_message_definition: r.get(2)?,
                    type_description_hash: r.get(3)?,
                })
            })
            .map_err(BagError::sqlite(&s.path))?;
        for d in rows {
            let d = d.map_err(BagError::sqlite(&s.path))?;
            if !defs.iter().any(|x| x.topic_type == d.topic_type) {
                defs.push(d);
            }
        }
    }
    Ok(defs)
}

/// Convert `inputs` into `outputs`. Returns one summary per output, in the file's order.
pub fn convert(inputs: &[PathBuf], outputs: &[OutputBag]) -> Result<Vec<BagSummary>, ConvertError> {
    let bad = |m: String| ConvertError::BadInput(m);
    if inputs.is_empty() {
        return Err(bad("no input bag: give at least one -i BAG".into()));
    }
    if outputs.is_empty() {
        return Err(bad("the options file lists no output_bags".into()));
    }
    let mut bags = Vec::new();
    let mut defs: Vec<MessageDefinition> = Vec::new();
    for p in inputs {
        // A compressed input (rosbag2's file mode) reads as any other: the reader and
        // `open_read_only` go through a private decompressed copy of each split.
        let bag = Bag::open(p).map_err(|e| bad(e.to_string()))?;
        for d in read_definitions(&bag).map_err(|e| bad(e.to_string()))? {
            if !defs.iter().any(|x| x.topic_type == d.topic_type) {
                defs.push(d);
            }
        }
        bags.push(bag);
    }
    // The same topic name with two types cannot go into one bag: refuse before writing.
    let mut all_topics: Vec<&TopicInfo> = Vec::new();
    for (b, bag) in bags.iter().enumerate() {
        for t in &bag.topics {
            if let Some(o) = all_topics.iter().find(|o| o.name == t.name) {
                if o.type_name != t.type_name {
                    return Err(bad(format!(
                        "topic {} is {} in one input and {} in {}; not converted",
                        t.name,
                        o.type_name,
                        t.type_name,
                        inputs[b].display()
                    )));
                }
            } else {
                all_topics.push(t);
            }
        }
    }
    for (i, o) in outputs.iter().enumerate() {
        if o.uri.symlink_metadata().is_ok() {
            return Err(bad(format!(
                "output bag {} already exists; not overwritten",
                o.uri.display()
            )));
        }
        if outputs[..i].iter().any(|p| same_path(&p.uri, &o.uri)) {
            return Err(bad(format!(
                "output bag {} is listed twice",
                o.uri.display()
            )));
        }
        if inputs.iter().any(|p| same_path(p, &o.uri)) {
            return Err(bad(format!(
                "output bag {} is also an input",
                o.uri.display()
            )));
        }
    }

    let mut outs = Vec::new();
    for spec in outputs {
        let mut opts = WriterOptions::new(spec.flavour);
        opts.preset = spec.preset;
        opts.max_bag_size = spec.max_bag_size;
        opts.max_bag_duration_ns = spec.max_bag_duration_ns;
        opts.custom_data = spec.custom_data.clone();
        opts.compression = spec.compression;
        let mut writer = BagWriter::create(&spec.uri, opts)?;
        if let Some(c) = spec.compression.filter(|c| c.whole_splits()) {
            // The recorder's compressor: `compression_threads` threads at nice 19 behind a
            // queue of `compression_queue_size` closed splits, which the writer waits on
            // when full (nothing is live here). A failed split fails the output at finish.
            writer.compress_offline();
            match crate::pipeline::compress::CompressPool::start(&c) {
                Some(pool) => writer.set_compression(Box::new(pool)),
                None => log::warn!(
                    "cannot start the compression threads; compressing on the writer thread"
                ),
            }
        }
        let mut map = Vec::new();
        for bag in &bags {
            let mut m = Vec::new();
            for t in &bag.topics {
                let types = [t.type_name.clone()];
                if spec.selector.decide(&t.name, &types) == Decision::Record {
                    let def = defs.iter().find(|d| d.topic_type == t.type_name).cloned();
                    m.push(Some(writer.add_topic(t.clone(), def)?));
                } else {
                    m.push(None);
                }
            }
            map.push(m);
        }
        outs.push(Out {
            spec,
            writer,
            map,
            batch: Vec::with_capacity(BATCH_MESSAGES),
            batch_bytes: 0,
            zip: match spec.compression.filter(|c| c.per_message) {
                Some(_) => Some(
                    crate::bag::compressed::MessageZip::new().map_err(BagError::io(&spec.uri))?,
                ),
                None => None,
            },
            batch_cap: match spec.max_bag_size {
                0 => BATCH_BYTES,
                n => (n / 16).min(BATCH_BYTES),
            },
        });
    }

    // The inputs' earliest and latest window bounds bound what needs reading at all.
    let lo = outputs.iter().map(|o| o.start_ns.unwrap_or(i64::MIN)).min();
    let hi = outputs.iter().map(|o| o.end_ns.unwrap_or(i64::MAX)).max();
    let filter = ReadFilter {
        topics: None,
        start_ns: lo.filter(|&v| v != i64::MIN),
        end_ns: hi.filter(|&v| v != i64::MAX),
    };
    let mut iters: Vec<MessageIter> = Vec::new();
    for bag in &bags {
        iters.push(bag.messages(&filter)?);
    }
    // k-way merge by (timestamp, input order): ties keep the inputs' order on the command line.
    let mut heads: Vec<Option<ReadMessage>> = Vec::new();
    let mut heap = BinaryHeap::new();
    for (i, it) in iters.iter_mut().enumerate() {
        let m = it.next().transpose()?;
        if let Some(m) = &m {
            heap.push(Reverse((m.timestamp, i)));
        }
        heads.push(m);
    }
    while let Some(Reverse((_, i))) = heap.pop() {
        let msg = heads[i].take().expect("a head is on the heap");
        for out in outs.iter_mut() {
            let Some(t) = out.map[i][msg.topic] else {
                continue;
            };
            if out.spec.start_ns.is_some_and(|s| msg.timestamp < s)
                || out.spec.end_ns.is_some_and(|e| msg.timestamp > e)
            {
                continue;
            }
            out.batch_bytes += msg.data.len() as u64;
            out.batch.push((t, msg.timestamp, msg.data.clone()));
            if out.batch.len() >= BATCH_MESSAGES || out.batch_bytes >= out.batch_cap {
                out.flush()?;
            }
        }
        let next = iters[i].next().transpose()?;
        if let Some(m) = &next {
            heap.push(Reverse((m.timestamp, i)));
        }
        heads[i] = next;
    }
    // Every output is finished, even after one failed (a compression that failed leaves a
    // whole bag with a plain split); the first error is the one reported.
    let mut summaries = Vec::new();
    let mut first_err = None;
    for mut out in outs {
        // After a failed flush, finish still finishes what it can (and returns that error).
        let flushed = out.flush();
        let finished = out.writer.finish();
        match flushed.and(finished) {
            Ok(s) => summaries.push(s),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        Some(e) => Err(e.into()),
        None => Ok(summaries),
    }
}

/// Whether two paths name the same place (after resolving what exists of them).
fn same_path(a: &Path, b: &Path) -> bool {
    let norm = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    a == b || norm(a) == norm(b)
}
