//! Writing to stdout: a reader that went away (`subagent agents | head -1`)
//! ends the command quietly with status 0, as `ls | head` does.

use std::io::Write;

/// Stdout was closed by its reader.
#[derive(Debug, thiserror::Error)]
#[error("stdout is closed")]
pub struct StdoutClosed;

/// Writes `text` to stdout and flushes it.
pub fn write(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        Err(e) => Err(anyhow::Error::new(e).context("writing to stdout")),
    }
}

/// Writes `line` and a newline to stdout.
pub fn line(line: &str) -> anyhow::Result<()> {
    write(&format!("{line}\n"))
}

/// Whether `e` is (or was caused by) a closed stdout.
pub fn closed(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<StdoutClosed>())
}
