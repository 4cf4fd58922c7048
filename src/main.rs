//! Thin binary: parse, run, map errors to one line and an exit code.
fn main() {
    std::process::exit(ringbag::cli::main_entry());
}

/// Runs before the Rust runtime starts, which opens /dev/null on a closed stdin, stdout or
/// stderr: only here can `ringbag info BAG >&-` still be told apart from `>/dev/null`, so
/// that printing into the closed stdout is an error, not a silent success.
#[used]
#[link_section = ".init_array"]
static NOTE_CLOSED_STDOUT: extern "C" fn() = note_closed_stdout;

extern "C" fn note_closed_stdout() {
    ringbag::cli::note_closed_stdout();
}
