//! The engine's errors, each mapped to a documented protocol error code.
//!
//! The protocol's message is the error's Display, so each variant's text
//! is part of the protocol (docs/protocol.md). A wrapper variant shows its
//! cause in that text and so does not also report it as `source()`: an
//! error-chain printer would say it twice. The cause stays typed: match on
//! the variant to reach it.

use crate::protocol::{codes, RpcError};
use std::path::PathBuf;
use subagent_runner::ioerr::IoAt;

/// Why a call to the engine failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A param is invalid; names the field.
    #[error("invalid params: {field}: {problem}")]
    InvalidParams {
        /// The field, as a dotted path (`session.project_dir`).
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// No run has this id (or none the caller may see).
    #[error("run not found: {0}")]
    RunNotFound(String),
    /// Retention removed the run.
    #[error("run {run_id} was pruned at {} (retention: {reason})", crate::timefmt::rfc3339_ms(*at_ms))]
    RunPruned {
        /// The run.
        run_id: String,
        /// When it was marked for pruning.
        at_ms: u64,
        /// The limit that removed it (`max_runs`, `on_demand`, …).
        reason: String,
        /// Whose it was.
        owner_uid: u32,
    },
    /// The session is another uid's.
    #[error(
        "permission denied: session {0} belongs to another user; use a session id of your own"
    )]
    SessionNotOwned(String),
    /// The audience may not spawn subagents.
    #[error(transparent)]
    Audience(#[from] policy::AudienceError),
    /// The state dir could not record the run.
    #[error("state dir: {0}")]
    StateDir(StorageError),
    /// The run's directories could not be made safely.
    #[error("run directories: {0}")]
    RunDirs(WorkspaceError),
    /// A required sandbox mechanism is unavailable.
    #[error("sandbox: required mechanism {mechanism} cannot be enforced on this host: {why}")]
    Sandbox {
        /// A `require` name (`landlock`), or `run_as` or `per_run_uid`.
        mechanism: &'static str,
        /// What the host lacks or refused.
        why: SandboxCause,
    },
    /// The daemon is shutting down.
    #[error("the supervisor is shutting down and accepts no new runs")]
    ShuttingDown,
    /// Something unexpected.
    #[error("internal error: {0}")]
    Unexpected(InternalError),
}

/// What keeps a required sandbox mechanism from being enforced.
#[derive(Debug, thiserror::Error)]
pub enum SandboxCause {
    /// The host probe at start found it missing, for this reason.
    #[error("{0}")]
    Missing(String),
    /// The per-run uids cannot be had.
    #[error(transparent)]
    Uids(#[from] crate::uids::UidError),
    /// The `run_as` user cannot be used.
    #[error(transparent)]
    RunAs(#[from] crate::runas::RunAsError),
    /// What the requester may reach could not be checked.
    #[error(transparent)]
    Rights(crate::rights::RightsError),
}

impl From<crate::rights::RightsError> for EngineError {
    /// A right the requester lacks names its field; a check that could
    /// not be made refuses the run as a mechanism that cannot be enforced.
    fn from(e: crate::rights::RightsError) -> EngineError {
        match e.field() {
            Some(field) => EngineError::invalid(field, &e),
            None => EngineError::Sandbox {
                mechanism: "requester_rights",
                why: SandboxCause::Rights(e),
            },
        }
    }
}

impl From<crate::sessions::SessionError> for EngineError {
    /// Another uid's session is refused as such.
    fn from(e: crate::sessions::SessionError) -> EngineError {
        match e {
            crate::sessions::SessionError::NotOwned { session } => {
                EngineError::SessionNotOwned(session)
            }
        }
    }
}

impl From<crate::store::StoreError> for EngineError {
    /// Another uid's session is refused as such; any other failure is the
    /// state dir's.
    fn from(e: crate::store::StoreError) -> EngineError {
        match e {
            crate::store::StoreError::NotOwned { session, .. } => {
                EngineError::SessionNotOwned(session)
            }
            other => EngineError::StateDir(StorageError::Db(other)),
        }
    }
}

/// Why the state dir could not record something.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// A file-system step failed.
    #[error(transparent)]
    Io(#[from] IoAt),
    /// Another daemon holds the state dir's lock.
    #[error("state dir {} is in use by another supervisor: {source}", root.display())]
    InUse {
        root: PathBuf,
        /// Who holds it.
        source: crate::lockfile::LockError,
    },
    /// The state dir's lock could not be taken.
    #[error(transparent)]
    Lock(crate::lockfile::LockError),
    /// The state database refused or failed a read or a commit.
    #[error(transparent)]
    Db(crate::store::StoreError),
    /// A file-system step of the atomic-write helpers failed.
    #[error(transparent)]
    Atomic(#[from] subagent_runner::atomic::AtomicError),
    /// `subagentd --check` could not make its temporary state dir.
    #[error("check: {0}")]
    Check(#[source] std::io::Error),
}

/// Why a run's directories could not be made.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// The run's worktree.
    #[error(transparent)]
    Worktree(#[from] WorktreeError),
    /// The run's temp dir.
    #[error(transparent)]
    TempDir(#[from] crate::securedir::SecureDirError),
}

/// A run's worktree could not be made, given away or removed.
#[derive(Debug, thiserror::Error)]
pub enum WorktreeError {
    /// Earlier git work on the repository has not ended.
    #[error("git worktree add: earlier git work on the repository is still running")]
    Busy,
    /// The checkout passed the worktree limit.
    #[error("git worktree add: not done after {secs} s")]
    TimedOut {
        /// The limit, in seconds.
        secs: u64,
    },
    /// No thread could be started for the checkout.
    #[error("git worktree add: could not start a thread: {0}")]
    Thread(#[source] std::io::Error),
    /// The run's branch could not be made.
    #[error("create branch {branch}: {}", source.message())]
    Branch {
        /// The branch.
        branch: String,
        /// The underlying error.
        source: git2::Error,
    },
    /// The worktree could not be checked out.
    #[error("git worktree add {}: {}", dir.display(), source.message())]
    Add {
        /// Its directory.
        dir: PathBuf,
        /// The underlying error.
        source: git2::Error,
    },
    /// A file-system step on the worktree failed.
    #[error(transparent)]
    Io(#[from] IoAt),
    /// The repository no longer passes the check.
    #[error(transparent)]
    Check(#[from] crate::gitsnap::precheck::PrecheckError),
    /// The repository could not be opened.
    #[error(transparent)]
    Open(#[from] crate::gitsnap::OpenError),
    /// The repository's git dir is reached through a symbolic link now.
    #[error("{} is a symbolic link; the worktree's record is left alone", .0.display())]
    Linked(PathBuf),
    /// The run's branch could not be deleted.
    #[error("delete branch {branch}: {}", source.message())]
    DeleteBranch {
        /// The branch.
        branch: String,
        /// The underlying error.
        source: git2::Error,
    },
}

/// Something that should not happen.
#[derive(Debug, thiserror::Error)]
pub enum InternalError {
    /// A blocking task panicked or was cancelled.
    #[error("blocking task failed: {0}")]
    Join(#[source] tokio::task::JoinError),
    /// The config's tool policy is invalid (it was checked when loaded).
    #[error("config: {0}")]
    ToolPolicy(#[source] policy::toolpolicy::ToolError),
    /// The runner spec or the run's first picture could not be encoded.
    #[error("encoding a run's spec or first picture: {0}")]
    Encode(#[source] serde_json::Error),
    /// `subagentd --check` built invalid spawn params.
    #[error("check: {0}")]
    CheckParams(#[source] serde_json::Error),
    /// The job services port could not be opened.
    #[error(transparent)]
    Services(#[from] super::services::ServicesError),
    /// `subagentd --check`'s run did not end in time.
    #[error("check: the probe run did not end within {secs} s")]
    CheckTimedOut {
        /// The bound, in seconds.
        secs: u64,
    },
}

impl EngineError {
    /// An invalid-params error for `field`.
    pub fn invalid(field: &str, problem: impl std::fmt::Display) -> EngineError {
        EngineError::InvalidParams {
            field: field.to_owned(),
            problem: problem.to_string(),
        }
    }
}

impl From<StorageError> for EngineError {
    fn from(e: StorageError) -> EngineError {
        EngineError::StateDir(e)
    }
}

impl From<WorkspaceError> for EngineError {
    fn from(e: WorkspaceError) -> EngineError {
        EngineError::RunDirs(e)
    }
}

impl From<InternalError> for EngineError {
    fn from(e: InternalError) -> EngineError {
        EngineError::Unexpected(e)
    }
}

impl From<&EngineError> for RpcError {
    fn from(e: &EngineError) -> RpcError {
        if let EngineError::RunPruned {
            run_id,
            at_ms,
            reason,
            ..
        } = e
        {
            let known = serde_json::from_value(serde_json::Value::String(reason.clone()));
            if let Ok(reason) = known {
                return RpcError::run_pruned(run_id, *at_ms, reason);
            }
        }
        let code = match e {
            EngineError::InvalidParams { .. } => codes::INVALID_PARAMS,
            EngineError::RunNotFound(_) => codes::RUN_NOT_FOUND,
            EngineError::RunPruned { .. } => codes::RUN_PRUNED,
            EngineError::SessionNotOwned(_) => codes::SESSION_NOT_OWNED,
            EngineError::Audience(_) => codes::AUDIENCE_REFUSED,
            EngineError::StateDir(_) => codes::STORAGE,
            EngineError::RunDirs(_) => codes::WORKSPACE,
            EngineError::ShuttingDown => codes::SHUTTING_DOWN,
            EngineError::Sandbox { .. } => codes::SANDBOX_UNAVAILABLE,
            EngineError::Unexpected(_) => codes::INTERNAL_ERROR,
        };
        RpcError::new(code, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_causes_keep_the_protocol_texts_and_codes() {
        let io = || std::io::Error::from_raw_os_error(libc::EACCES);
        let cases = [
            (
                EngineError::StateDir(StorageError::Io(IoAt {
                    op: "create",
                    path: PathBuf::from("/s/sessions"),
                    source: io(),
                })),
                codes::STORAGE,
                "state dir: create /s/sessions: Permission denied (os error 13)",
            ),
            (
                EngineError::StateDir(StorageError::Atomic(
                    subagent_runner::atomic::AtomicError::Io {
                        op: "fsync directory",
                        path: PathBuf::from("/s"),
                        source: io(),
                    },
                )),
                codes::STORAGE,
                "state dir: fsync directory /s: Permission denied (os error 13)",
            ),
            (
                EngineError::RunDirs(WorkspaceError::TempDir(
                    crate::securedir::SecureDirError::BadName("a/b".to_owned()),
                )),
                codes::WORKSPACE,
                "run directories: \"a/b\": not a single path component",
            ),
            (
                EngineError::from(crate::sessions::SessionError::NotOwned {
                    session: "wc-1".to_owned(),
                }),
                codes::SESSION_NOT_OWNED,
                "permission denied: session wc-1 belongs to another user; use a session id of your own",
            ),
            (
                EngineError::Unexpected(InternalError::CheckTimedOut { secs: 60 }),
                codes::INTERNAL_ERROR,
                "internal error: check: the probe run did not end within 60 s",
            ),
        ];
        for (e, code, text) in cases {
            let rpc = RpcError::from(&e);
            assert_eq!((rpc.code, rpc.message.as_str()), (code, text));
            assert!(std::error::Error::source(&e).is_none(), "{e:?}");
        }
    }
}
