//! The live Slurm jobs of a Slurm backend and the one poll that reads
//! them: every `poll_interval_ms` while any job is watched, a single
//! `squeue --json` for all of them (never a process per run), whose
//! answer is handed to each job's watcher. An answer Slurm gives with an
//! error, or none, changes nothing: a job is seen gone only when Slurm
//! answered and did not list it, twice in a row.

use crate::slurm::{JobInfo, Slurm};
use std::collections::HashMap;
use std::sync::{Mutex, Weak};
use std::time::Duration;
use tokio::sync::watch;

/// What the last polls said of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Not polled since it was watched.
    NotYet,
    /// Slurm listed it, so.
    Listed(JobInfo),
    /// Slurm answered without it this many polls in a row.
    Absent(u32),
}

/// The jobs watched, and how to ask Slurm about them.
pub(crate) struct Jobs {
    /// The Slurm commands.
    pub(super) slurm: Slurm,
    /// The backend's settings.
    pub(super) settings: policy::backend::Backend,
    /// Each watched job's latest [`Seen`]. A std lock held only to add,
    /// remove or send; never across an await.
    watched: Mutex<HashMap<u64, watch::Sender<Seen>>>,
    /// When the last poll failed, so that failures are logged once a minute.
    last_failure_log: Mutex<Option<std::time::Instant>>,
}

impl Jobs {
    /// A table for the backend `settings`.
    pub(crate) fn new(settings: &policy::backend::Backend) -> Jobs {
        Jobs {
            slurm: Slurm::new(&settings.bin_dir()),
            settings: settings.clone(),
            watched: Mutex::new(HashMap::new()),
            last_failure_log: Mutex::new(None),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<u64, watch::Sender<Seen>>> {
        self.watched.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Watches job `id`: the receiver sees each poll's word on it.
    pub(crate) fn watch(&self, id: u64) -> watch::Receiver<Seen> {
        self.table()
            .entry(id)
            .or_insert_with(|| watch::channel(Seen::NotYet).0)
            .subscribe()
    }

    /// Stops watching job `id`.
    pub(crate) fn unwatch(&self, id: u64) {
        self.table().remove(&id);
    }

    /// Whether any job is watched.
    fn idle(&self) -> bool {
        self.table().is_empty()
    }

    /// Hands one answer of Slurm's to every watcher.
    fn deliver(&self, listed: &HashMap<u64, JobInfo>) {
        for (id, tx) in self.table().iter() {
            tx.send_if_modified(|seen| {
                let next = match (listed.get(id), &*seen) {
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

    /// Logs a failed poll, at most once a minute.
    fn failed(&self, e: &crate::slurm::SlurmError) {
        let mut last = self
            .last_failure_log
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
            tracing::warn!("reading the Slurm jobs' states: {e}; their runs keep their state");
            *last = Some(std::time::Instant::now());
        }
    }
}

/// Polls Slurm for the watched jobs until the table is dropped.
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
        if j.idle() {
            continue;
        }
        match j.slurm.jobs().await {
            Ok(listed) => j.deliver(&listed),
            Err(e) => j.failed(&e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: u64, state: &str) -> JobInfo {
        JobInfo {
            job_id: id,
            name: "r".into(),
            state: state.into(),
            reason: "None".into(),
            description: String::new(),
            exit_status: 0,
            start_time: 0,
        }
    }

    #[test]
    fn each_watcher_sees_its_job_and_absence_is_counted() {
        let jobs = Jobs::new(&Default::default());
        let (mut a, mut b) = (jobs.watch(1), jobs.watch(2));
        assert_eq!(*a.borrow(), Seen::NotYet);
        jobs.deliver(&HashMap::from([
            (1, info(1, "RUNNING")),
            (9, info(9, "PENDING")),
        ]));
        assert!(a.has_changed().unwrap() && b.has_changed().unwrap());
        assert_eq!(*a.borrow_and_update(), Seen::Listed(info(1, "RUNNING")));
        assert_eq!(*b.borrow_and_update(), Seen::Absent(1));
        jobs.deliver(&HashMap::from([(1, info(1, "RUNNING"))]));
        assert!(!a.has_changed().unwrap(), "the same answer is no change");
        assert_eq!(*b.borrow_and_update(), Seen::Absent(2));
        jobs.unwatch(2);
        assert!(
            b.has_changed().is_err(),
            "an unwatched job's channel closes"
        );
        assert!(!jobs.idle());
        jobs.unwatch(1);
        assert!(jobs.idle());
    }
}
