//! libgit2 work on a repository a child can write, on a thread of its own
//! under a time bound, at most one at a time per repository. libgit2 opens
//! files with a plain `open(2)`: a FIFO planted in `.git` after the
//! [`super::precheck`] blocks that thread for good. The caller returns at
//! the bound; the repository stays busy until the thread ends, so each
//! repository holds at most one such thread however often it is asked.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

/// Repositories (by common dir) with libgit2 work in progress.
static BUSY: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

/// Why bounded work gave no result.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    /// Earlier work on the repository has not ended.
    #[error("earlier work on the repository is still running")]
    Busy,
    /// The bound passed first; the work goes on and its result is handed
    /// to the caller's `abandoned`.
    #[error("timed out")]
    TimedOut,
    /// No thread could be started.
    #[error("could not start a thread: {0}")]
    Spawn(#[source] std::io::Error),
}

/// Marks a repository busy until dropped.
struct Claim(PathBuf);

impl Claim {
    fn take(repo: PathBuf) -> Option<Claim> {
        let mut busy = BUSY.lock().unwrap_or_else(PoisonError::into_inner);
        // A claim is made only once the repository is marked.
        busy.insert(repo.clone()).then(|| Claim(repo))
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        BUSY.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.0);
    }
}

/// The hand-over between the worker and the caller.
enum State<T> {
    Waiting,
    Done(T),
    Abandoned,
}

/// Runs `work` on a thread named `name` while `repo` is not busy, and
/// waits at most `limit` for it. Work that ends after the caller gave up
/// hands its result to `abandoned` (to undo what it made).
pub fn bounded<T: Send + 'static>(
    repo: PathBuf,
    limit: Duration,
    name: &str,
    work: impl FnOnce() -> T + Send + 'static,
    abandoned: impl FnOnce(T) + Send + 'static,
) -> Result<T, GuardError> {
    let claim = Claim::take(repo).ok_or(GuardError::Busy)?;
    let shared = Arc::new((Mutex::new(State::Waiting), Condvar::new()));
    let theirs = Arc::clone(&shared);
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let out = work();
            let (lock, cv) = &*theirs;
            let mut st = lock.lock().unwrap_or_else(PoisonError::into_inner);
            if matches!(*st, State::Abandoned) {
                drop(st);
                abandoned(out);
                drop(claim);
            } else {
                // Released before the caller hears: its next call on the
                // repository is not refused as busy.
                drop(claim);
                *st = State::Done(out);
                cv.notify_all();
            }
        })
        .map_err(GuardError::Spawn)?;
    let (lock, cv) = &*shared;
    let st = lock.lock().unwrap_or_else(PoisonError::into_inner);
    let (mut st, _) = cv
        .wait_timeout_while(st, limit, |s| matches!(s, State::Waiting))
        .unwrap_or_else(PoisonError::into_inner);
    match std::mem::replace(&mut *st, State::Abandoned) {
        State::Done(out) => Ok(out),
        _ => Err(GuardError::TimedOut),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;

    #[test]
    fn one_outstanding_job_per_repository_and_late_results_are_handed_back() {
        let repo = PathBuf::from("/test/guard/repo");
        let (release, blocked) = mpsc::channel::<()>();
        let undone = Arc::new(AtomicBool::new(false));
        let u = Arc::clone(&undone);
        let r = bounded(
            repo.clone(),
            Duration::from_millis(20),
            "guard-test",
            move || {
                let _ = blocked.recv();
                7
            },
            move |v| u.store(v == 7, Ordering::SeqCst),
        );
        assert!(matches!(r, Err(GuardError::TimedOut)), "{r:?}");
        // Still running: the repository is busy; another one is not.
        let again = bounded(repo.clone(), Duration::from_secs(5), "t", || 1, |_| {});
        assert!(matches!(again, Err(GuardError::Busy)), "{again:?}");
        let other = PathBuf::from("/test/guard/other");
        let ok = bounded(other, Duration::from_secs(5), "t", || 2, |_| {});
        assert!(matches!(ok, Ok(2)), "{ok:?}");
        release.send(()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match bounded(repo.clone(), Duration::from_secs(5), "t", || 3, |_| {}) {
                Ok(3) => break,
                Err(GuardError::Busy) => {}
                other => panic!("{other:?}"),
            }
            assert!(std::time::Instant::now() < deadline, "never released");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            undone.load(Ordering::SeqCst),
            "the late result was handed back"
        );
    }
}
