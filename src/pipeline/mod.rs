//! Recording pipeline: bounded queues and the writer thread.
