//! A child spoken to in lines on its stdio (`subagent mcp`, or the Python
//! MCP client driving it): its stdout is read on a thread of its own so
//! that each read waits with a deadline; it is killed when dropped.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::Duration;

/// The child, its stdin, and the lines of its stdout.
pub struct LineChild {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl LineChild {
    /// Spawns `cmd` with its stdin and stdout piped.
    pub fn spawn(cmd: &mut Command) -> LineChild {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in out.lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        LineChild {
            child,
            stdin,
            lines,
        }
    }

    /// Writes `msg` as one line.
    pub fn write(&mut self, msg: &impl std::fmt::Display) {
        writeln!(self.stdin, "{msg}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// The next line of its stdout, within `timeout`.
    pub fn recv(&self, timeout: Duration) -> Result<String, RecvTimeoutError> {
        self.lines.recv_timeout(timeout)
    }
}

impl Drop for LineChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
