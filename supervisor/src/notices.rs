//! Durable finished-run notices, one folder per session:
//! `notices/pending/<ended_ms>-<run_id>.json` until taken, then moved to
//! `notices/taken/<run_id>.json`. A notice is stored at most once per run and
//! handed out by exactly one `take`, also across daemon restarts.
//!
//! Which runs of a session have a pending notice is read from pending/
//! once, the first time the session is used, and then kept in memory: a
//! store is O(1), however many notices wait untaken.

use crate::paths::StateLayout;
use crate::protocol::Notice;
use std::collections::{HashMap, HashSet};
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::sync::Mutex;
use subagent_runner::atomic::{fsync_dir, write_atomic, AtomicError};
use subagent_runner::ioerr::{at, IoAt};

/// A notice could not be stored or taken.
#[derive(Debug, thiserror::Error)]
pub enum NoticeError {
    /// A file step failed.
    #[error(transparent)]
    Io(#[from] IoAt),
    /// An atomic write failed.
    #[error(transparent)]
    Atomic(#[from] AtomicError),
}

/// What is known of one session's notices.
struct Known {
    /// Run ids with a notice in pending/.
    pending: HashSet<String>,
    /// pending/ and taken/ exist.
    dirs_made: bool,
}

/// The run id in a pending notice's file name, `<ended_ms>-<run_id>.json`.
fn run_id_of(name: &str) -> Option<&str> {
    if name.starts_with('.') {
        return None;
    }
    Some(name.strip_suffix(".json")?.split_once('-')?.1)
}

/// The notice folders of every session. Stores and takes are serialised by
/// one lock; they are rare and short.
pub struct NoticeStore {
    layout: StateLayout,
    known: Mutex<HashMap<String, Known>>,
}

impl NoticeStore {
    /// A store over `layout`'s sessions.
    pub fn new(layout: StateLayout) -> NoticeStore {
        NoticeStore {
            layout,
            known: Mutex::new(HashMap::new()),
        }
    }

    fn dirs(&self, session: &str) -> (PathBuf, PathBuf) {
        let base = self.layout.notices_dir(session);
        (base.join("pending"), base.join("taken"))
    }

    /// Stores `notice` unless it was stored before (pending or taken).
    /// Returns whether it was newly stored. Blocking.
    pub fn store(&self, notice: &Notice, ended_ms: u64) -> Result<bool, NoticeError> {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        let (pending, taken) = self.dirs(&notice.session_id);
        let k = known
            .entry(notice.session_id.clone())
            .or_insert_with(|| Known {
                pending: match std::fs::read_dir(&pending) {
                    Ok(rd) => rd
                        .flatten()
                        .filter_map(|e| Some(run_id_of(e.file_name().to_str()?)?.to_owned()))
                        .collect(),
                    Err(_) => HashSet::new(),
                },
                dirs_made: false,
            });
        // Stored before, maybe under another end time (a run finished again
        // after a crash, with no exit.json to give the same time)?
        if k.pending.contains(&notice.run_id)
            || taken.join(format!("{}.json", notice.run_id)).exists()
        {
            return Ok(false);
        }
        let name = format!("{ended_ms:013}-{}.json", notice.run_id);
        let mut bytes = serde_json::to_vec(notice).unwrap_or_default();
        bytes.push(b'\n');
        let make_dirs = || -> Result<(), NoticeError> {
            for dir in [&pending, &taken] {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)
                    .map_err(at("create", dir))?;
            }
            Ok(())
        };
        if !k.dirs_made {
            make_dirs()?;
            k.dirs_made = true;
        }
        match write_atomic(&pending.join(&name), &bytes) {
            Ok(()) => {}
            // Its folders were removed behind our back: made again.
            Err(_) if !pending.is_dir() => {
                make_dirs()?;
                write_atomic(&pending.join(&name), &bytes)?;
            }
            Err(e) => return Err(e.into()),
        }
        k.pending.insert(notice.run_id.clone());
        Ok(true)
    }

    /// Takes every pending notice of `session`, oldest first. Each is moved
    /// to taken/ (durably) before it is returned, so no other take can
    /// return it again. Blocking.
    pub fn take(&self, session: &str) -> Result<Vec<Notice>, NoticeError> {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        let (pending, taken) = self.dirs(session);
        let mut names: Vec<String> = match std::fs::read_dir(&pending) {
            Ok(rd) => rd
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.ends_with(".json") && !n.starts_with('.'))
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(at("list", &pending)(e).into()),
        };
        names.sort();
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let from = pending.join(&name);
            let bytes = std::fs::read(&from).map_err(at("read", &from))?;
            let Ok(notice) = serde_json::from_slice::<Notice>(&bytes) else {
                tracing::warn!(path = %from.display(), "skipping a corrupt notice file");
                continue;
            };
            let to = taken.join(format!("{}.json", notice.run_id));
            std::fs::rename(&from, &to).map_err(at("rename", &from))?;
            if let Some(k) = known.get_mut(session) {
                if let Some(id) = run_id_of(&name) {
                    k.pending.remove(id);
                }
            }
            out.push(notice);
        }
        if !out.is_empty() {
            fsync_dir(&pending)?;
            fsync_dir(&taken)?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::record::RunState;

    fn notice(run: &str) -> Notice {
        Notice {
            run_id: run.into(),
            session_id: "s".into(),
            state: RunState::Succeeded,
            result_path: "/x/result.md".into(),
            ended_at: "2026-01-01T00:00:00.000Z".into(),
        }
    }

    #[test]
    fn each_notice_is_taken_once_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let store = NoticeStore::new(StateLayout {
            root: dir.path().into(),
        });
        assert!(store.store(&notice("b"), 2).unwrap());
        assert!(store.store(&notice("a"), 1).unwrap());
        assert!(!store.store(&notice("a"), 1).unwrap());
        // Stored again with another end time: still once.
        assert!(!store.store(&notice("a"), 7).unwrap());
        let got: Vec<String> = store
            .take("s")
            .unwrap()
            .into_iter()
            .map(|n| n.run_id)
            .collect();
        assert_eq!(got, ["a", "b"]);
        assert!(store.take("s").unwrap().is_empty());
        // Storing again after the take does not bring it back.
        assert!(!store.store(&notice("a"), 1).unwrap());
        assert!(store.take("s").unwrap().is_empty());
        assert!(store.take("other").unwrap().is_empty());
    }

    #[test]
    fn a_new_store_knows_the_pending_notices_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let layout = || StateLayout {
            root: dir.path().into(),
        };
        let first = NoticeStore::new(layout());
        assert!(first.store(&notice("r-1"), 5).unwrap());
        // A restarted daemon: the notice is found under another end time.
        let second = NoticeStore::new(layout());
        assert!(!second.store(&notice("r-1"), 9).unwrap());
        assert!(second.store(&notice("r-2"), 6).unwrap());
        let got: Vec<String> = second
            .take("s")
            .unwrap()
            .into_iter()
            .map(|n| n.run_id)
            .collect();
        assert_eq!(got, ["r-1", "r-2"]);
        // Its folders removed behind its back: made again.
        std::fs::remove_dir_all(dir.path().join("sessions")).unwrap();
        assert!(second.store(&notice("r-3"), 7).unwrap());
        assert_eq!(second.take("s").unwrap().len(), 1);
        assert_eq!(run_id_of("0000000000005-r-1.json"), Some("r-1"));
        assert_eq!(run_id_of(".tmp-x.json"), None);
    }
}
