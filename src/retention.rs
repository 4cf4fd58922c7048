//! Circular budget over a recording root (issue 4).
