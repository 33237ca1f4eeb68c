//! Every byte the command line prints goes through here. `std`'s `println!`
//! panics (exit 101) when stdout is a closed pipe (`npc events | head -1`)
//! or a full disk (`> /dev/full`); these writers return an [`OutputError`]
//! instead, which the commands pass up with `?` and [`super::main`] turns
//! into the exit: a closed reader ends the command quietly with exit 0 (as
//! `ripgrep` and `git log | head` do, so `set -o pipefail` scripts keep
//! working), any other write failure is an error message and exit 1.
//! Stdout is flushed after every write so a failure surfaces at the write
//! that caused it, not at an exit-time flush that would ignore it.
//! Diagnostics on stderr ([`errln!`]) never fail a command: when stderr
//! itself is gone there is nowhere left to report to.
//!
//! Stderr only ever carries text for a person (errors, warnings, notes,
//! quoting what daemons, plugins, hooks and servers said), so every write
//! to it goes through [`crate::stdx::term::printable`]: no control
//! character but newline and tab reaches the terminal from there. Stdout
//! also carries exact data (JSON, TOML, rendered documents), so the
//! commands call `printable` themselves on the human lines that hold text
//! npc did not write.
//!
//! The crate denies `clippy::print_stdout` and `clippy::print_stderr` in
//! `src/cli/`, so a new `println!` cannot slip back in.

use std::fmt;
use std::io::{self, Write};

/// Why printing failed.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// The reader went away (EPIPE): end quietly.
    #[error("stdout was closed by its reader")]
    Closed,
    /// Anything else (a full disk, an I/O error).
    #[error("cannot write to stdout: {source}; free space or send the output elsewhere")]
    Failed {
        #[source]
        source: io::Error,
    },
}

impl From<io::Error> for OutputError {
    fn from(source: io::Error) -> Self {
        if source.kind() == io::ErrorKind::BrokenPipe {
            Self::Closed
        } else {
            Self::Failed { source }
        }
    }
}

/// Write `args` to stdout and flush.
pub fn write_stdout(args: fmt::Arguments<'_>) -> Result<(), OutputError> {
    let mut out = io::stdout().lock();
    out.write_fmt(args)?;
    out.flush()?;
    Ok(())
}

/// Write raw bytes to stdout and flush.
pub fn write_stdout_bytes(bytes: &[u8]) -> Result<(), OutputError> {
    let mut out = io::stdout().lock();
    out.write_all(bytes)?;
    out.flush()?;
    Ok(())
}

/// Write `args` to stderr, controls escaped; failures are ignored (see the
/// module docs).
pub fn write_stderr(args: fmt::Arguments<'_>) {
    let text = args.to_string();
    let mut err = io::stderr().lock();
    let _ = err.write_all(crate::stdx::term::printable(&text).as_bytes());
    let _ = err.flush();
}

/// The output failure somewhere in `e`'s chain, if it is one.
pub fn classify(e: &anyhow::Error) -> Option<&OutputError> {
    e.chain().find_map(|c| c.downcast_ref::<OutputError>())
}

/// `print!` that returns `Result<(), OutputError>` instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::output::write_stdout(format_args!($($arg)*))
    };
}

/// `println!` that returns `Result<(), OutputError>` instead of panicking.
macro_rules! outln {
    () => {
        $crate::cli::output::write_stdout(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::cli::output::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `eprintln!` that never panics.
macro_rules! errln {
    () => {
        $crate::cli::output::write_stderr(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::cli::output::write_stderr(format_args!("{}\n", format_args!($($arg)*)))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broken_pipe_is_closed_and_other_errors_fail() {
        assert!(matches!(
            OutputError::from(io::Error::from(io::ErrorKind::BrokenPipe)),
            OutputError::Closed
        ));
        let full = OutputError::from(io::Error::from_raw_os_error(28));
        assert!(matches!(full, OutputError::Failed { .. }));
        assert!(
            full.to_string().contains("No space left on device"),
            "{full}"
        );
    }

    #[test]
    fn classify_finds_an_output_error_under_context() {
        let e = anyhow::Error::from(OutputError::Closed).context("printing events");
        assert!(matches!(classify(&e), Some(OutputError::Closed)));
        assert!(classify(&anyhow::anyhow!("other")).is_none());
    }
}
