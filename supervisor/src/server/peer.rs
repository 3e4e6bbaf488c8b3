//! Who is calling: a process inside a run may not use the control socket.
//! Decided from the peer's credentials (its pid, then its cgroups and its
//! ancestry), never from anything the caller says.

use crate::ids::RunId;

/// The name the kernel shows for a runner (`comm`, 15 bytes at most).
const RUNNER_COMM: &str = "subagent-runner";

/// Whether `/proc/<pid>/cgroup` text puts the process in a run's cgroup
/// (`…/subagentd/<run id>`).
pub fn in_run_cgroup(cgroup_text: &str) -> bool {
    cgroup_text.lines().any(|line| {
        let path = line.splitn(3, ':').nth(2).unwrap_or("");
        let segs: Vec<&str> = path.split('/').collect();
        segs.windows(2)
            .any(|w| w[0] == "subagentd" && RunId::parse(w[1]).is_some())
    })
}

/// Whether the caller is inside a run could not be told: /proc could not be
/// read for a reason other than the process being gone (out of descriptors
/// or memory). Neither "inside" nor "outside": the connection is answered
/// with an internal error and closed.
#[derive(Debug, thiserror::Error)]
#[error("reading /proc/{pid}/{file}: {source}")]
pub struct PeerError {
    pid: i32,
    file: &'static str,
    source: std::io::Error,
}

/// Reads `/proc/<pid>/<file>`: `None` when the process is gone.
fn proc_file(pid: i32, file: &'static str) -> Result<Option<String>, PeerError> {
    match std::fs::read_to_string(format!("/proc/{pid}/{file}")) {
        Ok(t) => Ok(Some(t)),
        Err(e) if gone(&e) => Ok(None),
        Err(source) => Err(PeerError { pid, file, source }),
    }
}

/// Whether a read of /proc failed because the process is not there.
fn gone(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ESRCH))
}

/// Whether process `pid` belongs to a run: it sits in a run's cgroup, or a
/// runner is among its ancestors. A pid that is unknown, or gone by the
/// time it is looked at (a process that connected, handed the connection
/// on and exited), counts as inside: fail closed. Any other failure to
/// read /proc is an error, never an answer.
pub fn inside_run(pid: Option<i32>) -> Result<bool, PeerError> {
    let Some(pid) = pid.filter(|&p| p > 0) else {
        return Ok(true);
    };
    match proc_file(pid, "cgroup")? {
        Some(text) if in_run_cgroup(&text) => return Ok(true),
        Some(_) => {}
        None => return Ok(true),
    }
    let mut p = pid;
    for _ in 0..256 {
        let Some(comm) = proc_file(p, "comm")? else {
            // An ancestor that exited meanwhile: its place is unknown.
            return Ok(true);
        };
        if comm.trim() == RUNNER_COMM {
            return Ok(true);
        }
        let parent = proc_file(p, "stat")?
            .as_deref()
            .and_then(subagent_runner::procstat::parse_stat)
            .map(|s| s.ppid);
        match parent {
            Some(pp) if pp > 1 && pp != p => p = pp,
            Some(_) => return Ok(false),
            None => return Ok(true),
        }
    }
    Ok(false)
}

/// Callers waiting for the judge at once; more wait to be queued.
const JUDGE_QUEUE: usize = 64;

/// One question to the judge: a caller's pid, and where to answer.
type Ask = (
    Option<i32>,
    tokio::sync::oneshot::Sender<Result<bool, PeerError>>,
);

/// Judges callers ([`inside_run`]) on a thread of its own: the accept path
/// needs nothing from the runtime's blocking pool, which egress work or
/// many runs at once may fill.
#[derive(Clone)]
pub struct Judge {
    asks: tokio::sync::mpsc::Sender<Ask>,
}

impl Judge {
    /// Starts the judge's thread; it ends when every handle is dropped.
    pub fn start() -> std::io::Result<Judge> {
        let (asks, mut rx) = tokio::sync::mpsc::channel::<Ask>(JUDGE_QUEUE);
        std::thread::Builder::new()
            .name("peer-judge".into())
            .spawn(move || {
                while let Some((pid, answer)) = rx.blocking_recv() {
                    let _ = answer.send(inside_run(pid));
                }
            })?;
        Ok(Judge { asks })
    }

    /// [`inside_run`], answered by the judge's thread; a judge that is
    /// gone answers "inside" (fail closed).
    pub async fn inside_run(&self, pid: Option<i32>) -> Result<bool, PeerError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self.asks.send((pid, tx)).await.is_err() {
            return Ok(true);
        }
        rx.await.unwrap_or(Ok(true))
    }
}

/// `SO_PEERGROUPS` (include/uapi/asm-generic/socket.h); not in libc.
const SO_PEERGROUPS: libc::c_int = 59;

/// The peer's supplementary groups as the kernel recorded them when it
/// connected (`SO_PEERGROUPS`).
pub fn peer_groups(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<Vec<u32>> {
    use std::os::fd::AsRawFd;
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: the buffer is live and `len` bytes long; the kernel
        // writes at most `len` bytes and sets `len` to what it wrote or
        // (ERANGE) to what it needs.
        let rc = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let n = len as usize / std::mem::size_of::<libc::gid_t>();
        if rc == 0 {
            groups.truncate(n);
            return Ok(groups);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) || n <= groups.len() || n > 1 << 16 {
            return Err(e);
        }
        groups.resize(n, 0);
    }
}

/// Who a run is asked for by: `None` for the daemon's own uid and root
/// (unchanged: the run's rights are the daemon's), else the peer's ids.
/// Groups that cannot be read count as none: fewer rights, never more.
pub fn requester(
    uid: u32,
    gid: u32,
    groups: impl FnOnce() -> std::io::Result<Vec<u32>>,
) -> Option<policy::rights::Requester> {
    if uid == 0 || uid == crate::paths::uid() {
        return None;
    }
    let groups = groups().unwrap_or_else(|e| {
        tracing::warn!(
            uid,
            "reading the peer's groups: {e}; checking its rights without them"
        );
        Vec::new()
    });
    Some(policy::rights::Requester { uid, gid, groups })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_daemons_own_uid_and_root_are_no_requester() {
        let none = || -> std::io::Result<Vec<u32>> { panic!("not asked") };
        assert_eq!(requester(0, 0, none), None);
        assert_eq!(requester(crate::paths::uid(), 5, none), None);
        let other = crate::paths::uid().wrapping_add(4242).max(1);
        let r = requester(other, 7, || Err(std::io::Error::other("x"))).unwrap();
        assert_eq!((r.uid, r.gid, r.groups), (other, 7, vec![]));
    }

    #[test]
    fn a_socket_pair_reports_this_processs_groups() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let got = peer_groups(std::os::fd::AsFd::as_fd(&a)).unwrap();
        let mut ours = nix::unistd::getgroups()
            .unwrap()
            .into_iter()
            .map(|g| g.as_raw())
            .collect::<Vec<_>>();
        let mut got_sorted = got.clone();
        ours.sort_unstable();
        ours.dedup();
        got_sorted.sort_unstable();
        got_sorted.dedup();
        assert_eq!(got_sorted, ours);
    }

    #[test]
    fn run_cgroups_are_recognised() {
        let inside = "4:memory:/job/subagentd/20261130T055552.123456Z-a1b2c3d4\n0::/\n";
        assert!(in_run_cgroup(inside));
        for outside in [
            "0::/system.slice/subagentd.service\n",
            "4:memory:/job/subagentd\n",
            "4:memory:/subagentd/not-a-run-id\n",
            "",
        ] {
            assert!(!in_run_cgroup(outside), "{outside}");
        }
    }

    #[test]
    fn this_test_process_is_not_inside_a_run() {
        assert!(!inside_run(Some(std::process::id() as i32)).unwrap());
        assert!(inside_run(None).unwrap());
        // A pid that is gone counts as inside.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        assert!(inside_run(Some(pid)).unwrap());
    }

    #[tokio::test]
    async fn the_judge_answers_on_its_own_thread() {
        let judge = Judge::start().unwrap();
        let me = Some(std::process::id() as i32);
        assert!(!judge.inside_run(me).await.unwrap());
        assert!(judge.inside_run(None).await.unwrap());
    }

    #[test]
    fn only_a_missing_process_counts_as_gone() {
        assert!(gone(&std::io::Error::from_raw_os_error(libc::ENOENT)));
        assert!(gone(&std::io::Error::from_raw_os_error(libc::ESRCH)));
        for e in [libc::EMFILE, libc::ENFILE, libc::ENOMEM, libc::EACCES] {
            assert!(!gone(&std::io::Error::from_raw_os_error(e)), "{e}");
        }
    }
}
