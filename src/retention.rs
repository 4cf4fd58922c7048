//! Circular budget over a recording root (issue 4): total size, total duration, file count,
//! free space, and the max-splits stop condition.

use crate::bag::writer::BagWriter;
use crate::bag::BagError;

#[derive(Debug, thiserror::Error)]
pub enum RetentionError {
    #[error(transparent)]
    Bag(#[from] BagError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Continue,
    StopMaxSplits(u32),
}

#[derive(Debug, Default, Clone)]
pub struct RetentionPolicy {
    pub max_splits: u32,
}

#[derive(Debug)]
pub struct Retention {
    policy: RetentionPolicy,
}

impl Retention {
    pub fn new(policy: RetentionPolicy) -> Self {
        Retention { policy }
    }

    /// Make room before a batch of `incoming` bytes is committed; returns splits deleted.
    pub fn before_batch(
        &mut self,
        _w: &mut BagWriter,
        _incoming: u64,
        _newest_ns: i64,
    ) -> Result<u64, RetentionError> {
        Ok(0)
    }

    /// Account for splits closed by the last batch; returns the verdict and splits deleted.
    pub fn after_batch(&mut self, w: &mut BagWriter) -> Result<(Verdict, u64), RetentionError> {
        w.take_newly_closed();
        if self.policy.max_splits > 0 && w.splits_created() > self.policy.max_splits {
            return Ok((Verdict::StopMaxSplits(self.policy.max_splits), 0));
        }
        Ok((Verdict::Continue, 0))
    }
}
