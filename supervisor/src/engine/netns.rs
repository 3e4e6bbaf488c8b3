//! A pool of empty network namespaces for runs without the network.
//!
//! Making a network namespace is about a tenth of the host CPU a run costs
//! (`unshare(CLONE_NEWNET)` registers a loopback device, its sysctls and
//! sysfs files; tearing it down later costs half as much again in a kernel
//! worker). The daemon makes them ahead, on a short-lived thread of its
//! own, and hands one to each runner of a run without the network (with
//! the hand-over to a warm runner, or as fd [`super::spawn::NETNS_FD`] to a
//! runner it starts). The runner joins it; the child inherits it.
//!
//! A namespace serves **one run at a time**. It goes back to the pool only
//! when the runner exited 0 and the run's exit.json says its whole process
//! tree was gone (`tree_gone`: no descendant of the runner, the cgroups
//! empty) and Landlock was enforced ([`super::finish::reusable`]), so no
//! process of the run is left in it. What a run could leave in a namespace
//! otherwise dies with its processes: its sockets (seccomp allows only
//! Unix ones, and Landlock, from ABI 6, scopes abstract ones to the run).
//! It cannot change the namespace itself: interfaces and routes need
//! `CAP_NET_ADMIN` over the user namespace that owns it (the daemon's),
//! and the namespace's sysctls under `/proc/sys/net`, which a uid-0 child
//! could write without any capability, are read-only under Landlock. A
//! namespace whose run ended any other way (the runner died or failed, a
//! tree left behind, a start that failed, no Landlock) is dropped.
//!
//! The pool is empty and inert without `CAP_SYS_ADMIN`; each run's child
//! then makes its own namespace where it can, as before.

use std::os::fd::OwnedFd;
use std::sync::Mutex;

/// Making a network namespace failed.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// A system call failed.
    #[error("{op}: {errno}")]
    Sys {
        /// The call.
        op: &'static str,
        /// The errno.
        errno: nix::errno::Errno,
    },
    /// The thread that makes it could not run.
    #[error("the namespace thread: {0}")]
    Thread(String),
}

/// The pool.
pub struct NetnsPool {
    /// Namespaces no run uses.
    free: Mutex<Vec<OwnedFd>>,
    /// Made ahead until this many are free.
    low: usize,
    /// At most this many are kept free; more are dropped.
    high: usize,
    /// False without `CAP_SYS_ADMIN`, or once closed.
    enabled: std::sync::atomic::AtomicBool,
    /// One fill at a time.
    filling: Mutex<()>,
}

/// Makes one new, empty network namespace and returns a descriptor on it.
/// Blocking: a thread of its own moves into the new namespace, opens it and
/// ends, so no thread of the daemon ever changes its namespace.
pub fn make() -> Result<OwnedFd, NetnsError> {
    std::thread::Builder::new()
        .name("netns-maker".into())
        .spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).map_err(|errno| {
                NetnsError::Sys {
                    op: "unshare(CLONE_NEWNET)",
                    errno,
                }
            })?;
            nix::fcntl::open(
                "/proc/thread-self/ns/net",
                nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            )
            .map_err(|errno| NetnsError::Sys {
                op: "open /proc/thread-self/ns/net",
                errno,
            })
        })
        .map_err(|e| NetnsError::Thread(e.to_string()))?
        .join()
        .map_err(|_| NetnsError::Thread("panicked".into()))?
}

impl NetnsPool {
    /// A pool that keeps `low` to `high` namespaces free; inert when
    /// `enabled` is false (no `CAP_SYS_ADMIN`). Nothing is made until
    /// [`NetnsPool::fill`].
    pub fn new(enabled: bool, low: usize, high: usize) -> NetnsPool {
        NetnsPool {
            free: Mutex::new(Vec::new()),
            low,
            high: high.max(low),
            enabled: std::sync::atomic::AtomicBool::new(enabled),
            filling: Mutex::new(()),
        }
    }

    fn free(&self) -> std::sync::MutexGuard<'_, Vec<OwnedFd>> {
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn enabled(&self) -> bool {
        self.enabled.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// How many namespaces are free.
    pub fn ready(&self) -> usize {
        self.free().len()
    }

    /// Whether [`NetnsPool::fill`] would make any (fewer than `low` free).
    pub fn wants_more(&self) -> bool {
        self.enabled() && self.ready() < self.low
    }

    /// A free namespace for one run, if any.
    pub fn take(&self) -> Option<OwnedFd> {
        let mut free = self.free();
        if !self.enabled() {
            return None;
        }
        free.pop()
    }

    /// Returns the namespace of a run that has ended with its whole tree
    /// gone; dropped when the pool is full or closed. (`enabled` is read
    /// under the lock [`NetnsPool::close`] clears the pool under, so nothing
    /// is kept after a close.)
    pub fn give_back(&self, ns: OwnedFd) {
        let mut free = self.free();
        if self.enabled() && free.len() < self.high {
            free.push(ns);
        }
    }

    /// Makes namespaces until `low` are free. Blocking. A failure stops the
    /// fill with a warning (the runs' children make their own meanwhile).
    pub fn fill(&self) {
        let Ok(_one) = self.filling.try_lock() else {
            return;
        };
        while self.enabled() && self.ready() < self.low {
            match make() {
                Ok(ns) => self.give_back(ns),
                Err(e) => {
                    tracing::warn!("making a network namespace ahead: {e}");
                    return;
                }
            }
        }
    }

    /// Drops every free namespace; none is made or kept any more.
    pub fn close(&self) {
        self.enabled
            .store(false, std::sync::atomic::Ordering::SeqCst);
        self.free().clear();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn can() -> bool {
        subagent_runner::sandbox::caps::effective_has(subagent_runner::sandbox::caps::CAP_SYS_ADMIN)
    }

    fn ino(fd: &OwnedFd) -> u64 {
        nix::sys::stat::fstat(fd).unwrap().st_ino
    }

    fn own_ns() -> u64 {
        nix::sys::stat::stat("/proc/thread-self/ns/net")
            .unwrap()
            .st_ino
    }

    #[test]
    fn made_namespaces_are_new_and_the_daemon_stays_in_its_own() {
        if !can() {
            subagent_runner::testsupport::skip(
                "network",
                "making a network namespace needs CAP_SYS_ADMIN",
            );
            return;
        }
        let before = own_ns();
        let a = make().unwrap();
        let b = make().unwrap();
        assert_ne!(ino(&a), ino(&b));
        assert_ne!(ino(&a), before);
        assert_eq!(own_ns(), before, "the calling thread never moved");
    }

    #[test]
    fn the_pool_fills_to_low_keeps_at_most_high_and_closes() {
        if !can() {
            subagent_runner::testsupport::skip(
                "network",
                "making a network namespace needs CAP_SYS_ADMIN",
            );
            return;
        }
        let p = NetnsPool::new(true, 2, 3);
        assert!(p.wants_more());
        p.fill();
        assert_eq!(p.ready(), 2);
        assert!(!p.wants_more());
        let taken = p.take().unwrap();
        let id = ino(&taken);
        assert_eq!(p.ready(), 1);
        p.give_back(taken);
        p.give_back(make().unwrap());
        p.give_back(make().unwrap());
        assert_eq!(p.ready(), 3, "one over high is dropped");
        // Last in, first out: the namespace given back is among the free.
        let inos: Vec<u64> = std::iter::from_fn(|| p.take()).map(|f| ino(&f)).collect();
        assert!(inos.contains(&id));
        p.close();
        p.give_back(make().unwrap());
        p.fill();
        assert_eq!(p.ready(), 0, "a closed pool keeps and makes nothing");
    }

    #[test]
    fn an_inert_pool_makes_nothing() {
        let p = NetnsPool::new(false, 2, 3);
        assert!(!p.wants_more());
        p.fill();
        assert_eq!(p.ready(), 0);
        assert!(p.take().is_none());
    }
}
