//! Many children sleeping at once (for the load test and the memory
//! benchmark), and reading a process's RSS.

use crate::{wait_until, Conn};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

/// A process's resident set size in KiB (0 when it is gone).
pub fn rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("VmRSS:")
                    .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
            })
        })
        .unwrap_or(0)
}

/// `n` runs of one session, each sleeping until [`Sleepers::release`].
pub struct Sleepers {
    /// The runs' ids.
    pub runs: Vec<String>,
    flag: PathBuf,
    _dir: tempfile::TempDir,
}

impl Sleepers {
    /// Spawns `n` sleepers in `session` and waits (up to `limit`) until all
    /// of them are running.
    pub fn start(c: &mut Conn, session: &str, n: usize, limit: Duration) -> Sleepers {
        let dir = tempfile::tempdir().unwrap();
        let flag = dir.path().join("go");
        let script = format!("while [ ! -e {} ]; do sleep 0.2; done", flag.display());
        let runs: Vec<String> = (0..n)
            .map(|_| {
                c.spawn(
                    session,
                    &["sh", "-c", &script],
                    json!({"sandbox": {"read_paths": [dir.path()]}}),
                )
            })
            .collect();
        wait_until(limit, &format!("{n} children running"), || {
            c.list_all(json!({"session_id": session, "state": "running", "limit": 1000}))
                .len()
                == n
        });
        Sleepers {
            runs,
            flag,
            _dir: dir,
        }
    }

    /// Lets every sleeper finish and returns each one's final status.
    pub fn release(self, c: &mut Conn) -> Vec<Value> {
        std::fs::write(&self.flag, "").unwrap();
        self.runs.iter().map(|r| c.wait(r)).collect()
    }
}
