//! Each parent session's working context (its project dir and its recent
//! files) and the rules of who owns a session, as pure functions: the
//! state itself is a row of the store (`store/sessions.rs`).
//!
//! A session has an owner: the uid whose spawn (or `touch_files`) made it,
//! recorded when it is first written; one made before owners were recorded
//! is the daemon's. A run joins a session only if it is its owner's, and
//! only the owner (or the daemon's uid, or root) may use a session.

use policy::rights::Requester;
use policy::workctx::touch;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

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

/// A session may not be used as asked.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The session is another uid's.
    #[error("permission denied: session {session} belongs to another user; use a session id of your own")]
    NotOwned {
        /// The session id.
        session: String,
    },
}

/// Whose the session `existing` is: `None` for a new session (no state
/// yet); one without a recorded owner is the daemon's.
pub fn owner(existing: Option<&SessionState>) -> Option<u32> {
    existing.map(|s| policy::rights::recorded_owner(s.owner_uid, crate::paths::uid()))
}

/// Refuses `who` when the session is another uid's.
pub fn check_use(
    session: &str,
    existing: Option<&SessionState>,
    who: Option<&Requester>,
) -> Result<(), SessionError> {
    match owner(existing) {
        Some(o) if !policy::rights::may_act_on(who, o) => Err(SessionError::NotOwned {
            session: session.to_owned(),
        }),
        _ => Ok(()),
    }
}

/// Refuses a run for `who` in a session that is not `who`'s.
pub fn check_join(
    session: &str,
    existing: Option<&SessionState>,
    who: Option<&Requester>,
) -> Result<(), SessionError> {
    if policy::rights::may_join(who, crate::paths::uid(), owner(existing)) {
        return Ok(());
    }
    Err(SessionError::NotOwned {
        session: session.to_owned(),
    })
}

/// The state of a session `who` makes: owned by it.
pub fn new_state(who: Option<&Requester>) -> SessionState {
    SessionState {
        owner_uid: Some(policy::rights::owner_for(who, crate::paths::uid())),
        ..Default::default()
    }
}

/// The session's state after a spawn for `who` (refused when the session
/// is another uid's): the project dir recorded, and on the session's first
/// contact its owner and its recent files seeded.
pub fn on_spawn(
    session: &str,
    existing: Option<SessionState>,
    project_dir: &Path,
    seed: Option<&[PathBuf]>,
    who: Option<&Requester>,
) -> Result<SessionState, SessionError> {
    check_join(session, existing.as_ref(), who)?;
    let first = existing.is_none();
    let mut s = existing.unwrap_or_else(|| new_state(who));
    s.project_dir = Some(project_dir.to_path_buf());
    if first {
        if let Some(seed) = seed {
            s.recent_files = touch(&[], &absolute(project_dir, seed));
        }
    }
    Ok(s)
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

    fn other() -> Requester {
        let uid = crate::paths::uid().wrapping_add(4242).max(1);
        Requester {
            uid,
            gid: uid,
            groups: vec![],
        }
    }

    #[test]
    fn the_seed_applies_on_first_contact_only() {
        let p = Path::new("/p");
        let s = on_spawn("s", None, p, Some(&[PathBuf::from("seed.rs")]), None).unwrap();
        assert_eq!(s.recent_files, [PathBuf::from("/p/seed.rs")]);
        assert_eq!(s.owner_uid, Some(crate::paths::uid()));
        let again = on_spawn("s", Some(s), p, Some(&[PathBuf::from("other")]), None).unwrap();
        assert_eq!(again.recent_files, [PathBuf::from("/p/seed.rs")]);
    }

    #[test]
    fn a_session_is_its_makers_and_refuses_other_users() {
        let (x, me) = (other(), crate::paths::uid());
        let p = Path::new("/p");
        let theirs = on_spawn("theirs", None, p, None, Some(&x)).unwrap();
        let mine = new_state(None);
        assert_eq!(theirs.owner_uid, Some(x.uid));
        assert_eq!(mine.owner_uid, Some(me));
        // The other uid may not use the daemon's session, nor run in it.
        assert!(on_spawn("mine", Some(mine.clone()), p, None, Some(&x)).is_err());
        assert!(check_use("mine", Some(&mine), Some(&x)).is_err());
        // The daemon's uid uses every session, but runs join its own only.
        assert!(check_use("theirs", Some(&theirs), None).is_ok());
        assert!(on_spawn("theirs", Some(theirs.clone()), p, None, None).is_err());
        assert!(check_join("theirs", Some(&theirs), Some(&x)).is_ok());
        // A new session is anyone's to make.
        assert!(check_join("new", None, Some(&x)).is_ok());
        assert!(check_use("new", None, Some(&x)).is_ok());
    }

    #[test]
    fn a_session_without_an_owner_is_the_daemons() {
        let x = other();
        let old = SessionState::default();
        assert!(check_use("old", Some(&old), Some(&x)).is_err());
        assert!(check_join("old", Some(&old), Some(&x)).is_err());
        assert!(check_join("old", Some(&old), None).is_ok());
    }
}
