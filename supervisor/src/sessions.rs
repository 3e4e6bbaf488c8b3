//! Each parent session's working context, persisted in its session folder
//! (`sessions/<id>/session.json`): its project dir and its recent files.
//! Every change happens under one lock and is written atomically, so
//! concurrent merges from several children never lose an update.

use crate::paths::StateLayout;
use policy::workctx::touch;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A session's durable working context.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionState {
    /// The session's project dir (from its latest spawn).
    pub project_dir: Option<PathBuf>,
    /// Most recent first, no duplicates, at most 10, absolute.
    pub recent_files: Vec<PathBuf>,
}

/// A session's state could not be saved.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// Its folder could not be made.
    #[error("create {}: {source}", dir.display())]
    CreateDir {
        /// The folder.
        dir: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// session.json could not be written.
    #[error(transparent)]
    Write(#[from] subagent_runner::atomic::AtomicError),
}

/// The sessions' working contexts.
pub struct SessionStore {
    layout: StateLayout,
    lock: Mutex<()>,
}

fn file(layout: &StateLayout, session: &str) -> PathBuf {
    layout.session_dir(session).join("session.json")
}

impl SessionStore {
    /// A store over `layout`.
    pub fn new(layout: StateLayout) -> SessionStore {
        SessionStore {
            layout,
            lock: Mutex::new(()),
        }
    }

    /// The session's state (empty when it has none yet). Blocking.
    pub fn get(&self, session: &str) -> SessionState {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.load(session).unwrap_or_default()
    }

    fn load(&self, session: &str) -> Option<SessionState> {
        let bytes = std::fs::read(file(&self.layout, session)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    fn save(&self, session: &str, s: &SessionState) -> Result<(), SessionError> {
        let path = file(&self.layout, session);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| SessionError::CreateDir {
                dir: dir.to_path_buf(),
                source,
            })?;
        }
        let mut bytes = serde_json::to_vec_pretty(s).unwrap_or_default();
        bytes.push(b'\n');
        Ok(subagent_runner::atomic::write_atomic(&path, &bytes)?)
    }

    /// Changes the session's state with `f`, durably. Blocking.
    pub fn update(
        &self,
        session: &str,
        f: impl FnOnce(&mut SessionState),
    ) -> Result<SessionState, SessionError> {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut s = self.load(session).unwrap_or_default();
        f(&mut s);
        self.save(session, &s)?;
        Ok(s)
    }

    /// On a spawn: records the project dir, and on the session's first
    /// contact seeds its recent files. Returns the state.
    pub fn on_spawn(
        &self,
        session: &str,
        project_dir: &Path,
        seed: Option<&[PathBuf]>,
    ) -> Result<SessionState, SessionError> {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let existing = self.load(session);
        let mut s = existing.clone().unwrap_or_default();
        s.project_dir = Some(project_dir.to_path_buf());
        if existing.is_none() {
            if let Some(seed) = seed {
                s.recent_files = touch(&[], &absolute(project_dir, seed));
            }
        }
        // Written only when something changed: not on every spawn.
        if existing.as_ref() != Some(&s) {
            self.save(session, &s)?;
        }
        Ok(s)
    }

    /// Puts `files` at the front of the session's recent files.
    pub fn touch(&self, session: &str, files: &[PathBuf]) -> Result<SessionState, SessionError> {
        self.update(session, |s| {
            let base = s.project_dir.clone().unwrap_or_else(|| PathBuf::from("/"));
            s.recent_files = touch(&s.recent_files, &absolute(&base, files));
        })
    }
}

/// Paths made absolute against `base`.
pub fn absolute(base: &Path, files: &[PathBuf]) -> Vec<PathBuf> {
    files
        .iter()
        .map(|f| {
            if f.is_absolute() {
                f.clone()
            } else {
                base.join(f)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_touches_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = std::sync::Arc::new(SessionStore::new(StateLayout {
            root: dir.path().into(),
        }));
        store
            .on_spawn("s", Path::new("/p"), Some(&[PathBuf::from("seed.rs")]))
            .unwrap();
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let store = store.clone();
                std::thread::spawn(move || {
                    store.touch("s", &[PathBuf::from(format!("f{i}"))]).unwrap()
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = store.get("s");
        assert_eq!(s.recent_files.len(), 9);
        for i in 0..8 {
            assert!(s.recent_files.contains(&PathBuf::from(format!("/p/f{i}"))));
        }
        assert_eq!(s.recent_files[8], PathBuf::from("/p/seed.rs"));
        // The seed applies on first contact only.
        store
            .on_spawn("s", Path::new("/p"), Some(&[PathBuf::from("other")]))
            .unwrap();
        assert!(!store
            .get("s")
            .recent_files
            .contains(&PathBuf::from("/p/other")));
    }
}
