//! The live Slurm jobs of a Slurm backend and the one poll that reads
//! them: every `poll_interval_ms` while any run is watched, a single
//! `squeue --json` for all of them (never a process per run), whose answer
//! is handed to each run's watcher. Runs are watched by their job's name
//! (the run id), and by its id once known: a run whose job id was never
//! committed is found by its name, and a job of the same name with
//! another id (ids restart with a cluster's state) is not taken for it. An
//! answer Slurm gives with an error, or none, changes nothing: a job is
//! seen gone only when Slurm answered and did not list it, twice in a row.

use crate::slurm::{JobInfo, Slurm};
use std::collections::HashMap;
use std::sync::{Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// What the last polls said of a run's job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Not polled since it was watched.
    NotYet,
    /// Slurm listed it, so.
    Listed(JobInfo),
    /// Slurm answered without it this many polls in a row.
    Absent(u32),
}

/// One watched run: the job id it expects (none until known) and the
/// channel of its job's [`Seen`].
struct Watched {
    job: Option<u64>,
    tx: watch::Sender<Seen>,
}

/// The runs watched, and how to ask Slurm about them.
pub(crate) struct Jobs {
    /// The Slurm commands.
    pub(super) slurm: Slurm,
    /// The backend's settings.
    pub(super) settings: policy::backend::Backend,
    /// Each watched run, by run id. A std lock held only to add, remove
    /// or send; never across an await.
    watched: Mutex<HashMap<String, Watched>>,
    /// Since when Slurm has not answered (none: the last poll did).
    failing: Mutex<Option<Instant>>,
    /// When a failed poll was last logged, so failures are logged once a
    /// minute.
    logged: Mutex<Option<Instant>>,
}

impl Jobs {
    /// A table for the backend `settings`.
    pub(crate) fn new(settings: &policy::backend::Backend) -> Jobs {
        Jobs {
            slurm: Slurm::new(&settings.bin_dir()),
            settings: settings.clone(),
            watched: Mutex::new(HashMap::new()),
            failing: Mutex::new(None),
            logged: Mutex::new(None),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Watched>> {
        self.watched.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Watches run `run`'s job (`job`, when its id is known): the receiver
    /// sees each poll's word on it.
    pub(crate) fn watch(&self, run: &str, job: Option<u64>) -> watch::Receiver<Seen> {
        let mut t = self.table();
        let w = t.entry(run.to_owned()).or_insert_with(|| Watched {
            job,
            tx: watch::channel(Seen::NotYet).0,
        });
        w.job = w.job.or(job);
        w.tx.subscribe()
    }

    /// The job id of run `run` is known now.
    pub(crate) fn found(&self, run: &str, job: u64) {
        if let Some(w) = self.table().get_mut(run) {
            w.job = Some(job);
        }
    }

    /// Whether run `run`'s job is watched (it was submitted, or may have
    /// been).
    pub(crate) fn watching(&self, run: &str) -> bool {
        self.table().contains_key(run)
    }

    /// Stops watching run `run`.
    pub(crate) fn unwatch(&self, run: &str) {
        self.table().remove(run);
    }

    /// The watched runs' ids (their jobs' names).
    fn names(&self) -> Vec<String> {
        self.table().keys().cloned().collect()
    }

    /// For how long Slurm has given no answer, if it has not.
    pub(crate) fn failing_for(&self) -> Option<Duration> {
        self.failing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|t| t.elapsed())
    }

    /// Hands one answer of Slurm's to every watcher: the job of the run's
    /// name (of its id, when known; else the newest of that name).
    fn deliver(&self, listed: &HashMap<u64, JobInfo>) {
        *self.failing.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let mut by_name: HashMap<&str, Vec<&JobInfo>> = HashMap::new();
        for j in listed.values() {
            by_name.entry(j.name.as_str()).or_default().push(j);
        }
        for (run, w) in self.table().iter() {
            let mine = by_name.get(run.as_str()).and_then(|js| match w.job {
                Some(id) => js.iter().find(|j| j.job_id == id).copied(),
                None => js.iter().max_by_key(|j| j.job_id).copied(),
            });
            w.tx.send_if_modified(|seen| {
                let next = match (mine, &*seen) {
                    (Some(info), _) => Seen::Listed(info.clone()),
                    (None, Seen::Absent(n)) => Seen::Absent(n.saturating_add(1)),
                    (None, _) => Seen::Absent(1),
                };
                let changed = *seen != next;
                *seen = next;
                changed
            });
        }
    }

    /// Notes a failed poll, and logs it at most once a minute.
    fn failed(&self, e: &crate::slurm::SlurmError) {
        self.failing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(Instant::now);
        let mut last = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
            tracing::warn!("reading the Slurm jobs' states: {e}; their runs keep their state");
            *last = Some(Instant::now());
        }
    }
}

/// Polls Slurm for the watched runs' jobs until the table is dropped.
pub(crate) async fn poll_every(jobs: Weak<Jobs>) {
    loop {
        let Some(interval) = jobs
            .upgrade()
            .map(|j| Duration::from_millis(j.settings.poll_interval_ms()))
        else {
            return;
        };
        tokio::time::sleep(interval).await;
        let Some(j) = jobs.upgrade() else { return };
        let names = j.names();
        if names.is_empty() {
            continue;
        }
        match j.slurm.jobs(&names).await {
            Ok(listed) => j.deliver(&listed),
            Err(e) => j.failed(&e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: u64, name: &str, state: &str) -> JobInfo {
        JobInfo {
            job_id: id,
            name: name.into(),
            state: state.into(),
            reason: "None".into(),
            description: String::new(),
            exit_status: 0,
            start_time: 0,
        }
    }

    fn answer(jobs: &[JobInfo]) -> HashMap<u64, JobInfo> {
        jobs.iter().map(|j| (j.job_id, j.clone())).collect()
    }

    #[test]
    fn each_watcher_sees_its_job_and_absence_is_counted() {
        let jobs = Jobs::new(&Default::default());
        let (mut a, mut b) = (jobs.watch("a", Some(1)), jobs.watch("b", Some(2)));
        assert_eq!(*a.borrow(), Seen::NotYet);
        jobs.deliver(&answer(&[info(1, "a", "RUNNING"), info(9, "x", "PENDING")]));
        assert!(a.has_changed().unwrap() && b.has_changed().unwrap());
        assert_eq!(
            *a.borrow_and_update(),
            Seen::Listed(info(1, "a", "RUNNING"))
        );
        assert_eq!(*b.borrow_and_update(), Seen::Absent(1));
        jobs.deliver(&answer(&[info(1, "a", "RUNNING")]));
        assert!(!a.has_changed().unwrap(), "the same answer is no change");
        assert_eq!(*b.borrow_and_update(), Seen::Absent(2));
        jobs.unwatch("b");
        assert!(
            b.has_changed().is_err(),
            "an unwatched run's channel closes"
        );
        assert_eq!(jobs.names(), ["a"]);
    }

    #[test]
    fn a_job_is_found_by_name_and_never_by_a_name_with_another_id() {
        let jobs = Jobs::new(&Default::default());
        let mut unknown = jobs.watch("r", None);
        jobs.deliver(&answer(&[info(3, "r", "PENDING"), info(7, "r", "RUNNING")]));
        assert_eq!(
            *unknown.borrow_and_update(),
            Seen::Listed(info(7, "r", "RUNNING"))
        );
        let mut known = jobs.watch("s", Some(5));
        jobs.deliver(&answer(&[info(6, "s", "RUNNING")]));
        assert_eq!(*known.borrow_and_update(), Seen::Absent(1));
        jobs.found("r", 3);
        jobs.deliver(&answer(&[
            info(3, "r", "COMPLETED"),
            info(7, "r", "RUNNING"),
        ]));
        assert_eq!(
            *unknown.borrow_and_update(),
            Seen::Listed(info(3, "r", "COMPLETED"))
        );
    }

    #[test]
    fn a_failed_poll_is_timed_until_slurm_answers() {
        let jobs = Jobs::new(&Default::default());
        assert!(jobs.failing_for().is_none());
        jobs.failed(&crate::slurm::SlurmError::Timeout {
            program: "/usr/bin/squeue".into(),
        });
        assert!(jobs.failing_for().is_some());
        jobs.deliver(&HashMap::new());
        assert!(jobs.failing_for().is_none());
    }
}
