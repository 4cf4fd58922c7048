//! Command line: clap definitions, validation, dispatch.
pub fn main_entry() -> i32 {
    0
}
