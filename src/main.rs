//! Thin binary: parse, run, map errors to one line and an exit code.
fn main() {
    std::process::exit(ringbag::cli::main_entry());
}
