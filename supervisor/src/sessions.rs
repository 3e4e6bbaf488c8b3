//! Each parent session's working context, persisted in its session folder
//! (`sessions/<id>/session.json`): its project dir and its recent files.
//! Every change happens under one lock and is written atomically, so
//! concurrent merges from several children never lose an update.
//!
//! A session has an owner: the uid whose spawn (or `touch_files`) made it,
//! recorded when it is first written; one made before owners were recorded
//! is the daemon's. A run joins a session only if it is its owner's, and
//! only the owner (or the daemon's uid, or root) may use a session.

use crate::paths::StateLayout;
use policy::rights::Requester;
use policy::workctx::touch;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A session's durable working context.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionState {
    /// The uid the session belongs to; absent: the daemon's (a session
    /// made before owners were recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_uid: Option<u32>,
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
    /// The session is another uid's.
    #[error("permission denied: session {session} belongs to another user; use a session id of your own")]
    NotOwned {
        /// The session id.
        session: String,
    },
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

    /// Whose the session is: `None` when it has no session.json yet (a
    /// new session); one that cannot be read is the daemon's.
    fn owner(&self, session: &str) -> Option<u32> {
        let path = file(&self.layout, session);
        if let Err(e) = std::fs::symlink_metadata(&path) {
            if e.kind() == std::io::ErrorKind::NotFound {
                return None;
            }
        }
        let recorded = self.load(session).and_then(|s| s.owner_uid);
        Some(policy::rights::recorded_owner(
            recorded,
            crate::paths::uid(),
        ))
    }

    /// Refuses a caller that may not use the session (another uid's).
    fn check_use(&self, session: &str, who: Option<&Requester>) -> Result<(), SessionError> {
        match self.owner(session) {
            Some(o) if !policy::rights::may_act_on(who, o) => Err(SessionError::NotOwned {
                session: session.to_owned(),
            }),
            _ => Ok(()),
        }
    }

    /// Refuses a run for `who` in a session that is not `who`'s.
    fn check_join(&self, session: &str, who: Option<&Requester>) -> Result<(), SessionError> {
        if policy::rights::may_join(who, crate::paths::uid(), self.owner(session)) {
            return Ok(());
        }
        Err(SessionError::NotOwned {
            session: session.to_owned(),
        })
    }

    /// Whether `who` may use the session. Blocking.
    pub fn may_use(&self, session: &str, who: Option<&Requester>) -> Result<(), SessionError> {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.check_use(session, who)
    }

    /// Whether a run for `who` may join the session. Blocking.
    pub fn may_join(&self, session: &str, who: Option<&Requester>) -> Result<(), SessionError> {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.check_join(session, who)
    }

    /// The session's state for `who`, refused when the session is another
    /// uid's. Blocking.
    pub fn get_for(
        &self,
        session: &str,
        who: Option<&Requester>,
    ) -> Result<SessionState, SessionError> {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.check_use(session, who)?;
        Ok(self.load(session).unwrap_or_default())
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

    /// On a spawn for `who`: refuses a session that is another uid's;
    /// records the project dir, and on the session's first contact its
    /// owner and seeds its recent files. Returns the state.
    pub fn on_spawn(
        &self,
        session: &str,
        project_dir: &Path,
        seed: Option<&[PathBuf]>,
        who: Option<&Requester>,
    ) -> Result<SessionState, SessionError> {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.check_join(session, who)?;
        let existing = self.load(session);
        let mut s = existing.clone().unwrap_or_else(|| self.new_state(who));
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

    /// The state of a session `who` makes: owned by it.
    fn new_state(&self, who: Option<&Requester>) -> SessionState {
        SessionState {
            owner_uid: Some(policy::rights::owner_for(who, crate::paths::uid())),
            ..Default::default()
        }
    }

    /// Puts `files` at the front of the session's recent files, for `who`
    /// (refused when the session is another uid's; a new one is `who`'s).
    pub fn touch(
        &self,
        session: &str,
        files: &[PathBuf],
        who: Option<&Requester>,
    ) -> Result<SessionState, SessionError> {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.check_use(session, who)?;
        let mut s = self
            .load(session)
            .unwrap_or_else(|| match self.owner(session) {
                // There but unreadable: the daemon's, as it was.
                Some(_) => SessionState::default(),
                None => self.new_state(who),
            });
        let base = s.project_dir.clone().unwrap_or_else(|| PathBuf::from("/"));
        s.recent_files = touch(&s.recent_files, &absolute(&base, files));
        self.save(session, &s)?;
        Ok(s)
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
            .on_spawn(
                "s",
                Path::new("/p"),
                Some(&[PathBuf::from("seed.rs")]),
                None,
            )
            .unwrap();
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let store = store.clone();
                std::thread::spawn(move || {
                    store
                        .touch("s", &[PathBuf::from(format!("f{i}"))], None)
                        .unwrap()
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
            .on_spawn("s", Path::new("/p"), Some(&[PathBuf::from("other")]), None)
            .unwrap();
        assert!(!store
            .get("s")
            .recent_files
            .contains(&PathBuf::from("/p/other")));
    }

    fn store() -> (tempfile::TempDir, SessionStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = SessionStore::new(StateLayout {
            root: dir.path().into(),
        });
        (dir, store)
    }

    fn other() -> Requester {
        let uid = crate::paths::uid().wrapping_add(4242).max(1);
        Requester {
            uid,
            gid: uid,
            groups: vec![],
        }
    }

    #[test]
    fn a_session_is_its_makers_and_refuses_other_users() {
        let (_d, store) = store();
        let (x, me) = (other(), crate::paths::uid());
        let p = Path::new("/p");
        store.on_spawn("theirs", p, None, Some(&x)).unwrap();
        store.touch("mine", &[PathBuf::from("a")], None).unwrap();
        assert_eq!(store.get("theirs").owner_uid, Some(x.uid));
        assert_eq!(store.get("mine").owner_uid, Some(me));
        // The other uid may not use the daemon's session, nor run in it.
        let refused = |r: Result<SessionState, SessionError>| {
            assert!(matches!(r, Err(SessionError::NotOwned { .. })), "{r:?}");
        };
        refused(store.on_spawn("mine", p, None, Some(&x)));
        refused(store.touch("mine", &[PathBuf::from("b")], Some(&x)));
        refused(store.get_for("mine", Some(&x)));
        assert!(store.may_use("mine", Some(&x)).is_err());
        assert_eq!(store.get("mine").recent_files, [PathBuf::from("/a")]);
        // The daemon's uid uses every session, but runs join its own only.
        assert!(store.get_for("theirs", None).is_ok());
        assert!(store.touch("theirs", &[], None).is_ok());
        refused(store.on_spawn("theirs", p, None, None));
        assert!(store.may_join("theirs", Some(&x)).is_ok());
        assert_eq!(store.get("theirs").owner_uid, Some(x.uid));
        // A new session is anyone's to make.
        assert!(store.may_join("new", Some(&x)).is_ok());
        assert!(store.may_use("new", Some(&x)).is_ok());
    }

    #[test]
    fn a_session_without_an_owner_is_the_daemons() {
        let (d, store) = store();
        let x = other();
        for (name, text) in [("old", "{\"recent_files\": []}\n"), ("bad", "{")] {
            let dir = d.path().join("sessions").join(name);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("session.json"), text).unwrap();
            assert!(store.may_use(name, Some(&x)).is_err(), "{name}");
            assert!(store.may_join(name, Some(&x)).is_err(), "{name}");
            assert!(store.may_join(name, None).is_ok(), "{name}");
        }
    }
}
