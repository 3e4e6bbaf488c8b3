//! The engine's errors, each mapped to a documented protocol error code.

use crate::protocol::{codes, RpcError};

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
    /// No run has this id.
    #[error("run not found: {0}")]
    RunNotFound(String),
    /// The audience may not spawn subagents.
    #[error(transparent)]
    Audience(#[from] policy::AudienceError),
    /// The state dir could not record the run.
    #[error("state dir: {0}")]
    Storage(String),
    /// The run's directories could not be made safely.
    #[error("run directories: {0}")]
    Workspace(String),
    /// A required sandbox mechanism is unavailable.
    #[error("sandbox: required mechanism {mechanism} cannot be enforced on this host: {why}")]
    Sandbox {
        /// The mechanism.
        mechanism: &'static str,
        /// Why.
        why: String,
    },
    /// The daemon is shutting down.
    #[error("the supervisor is shutting down and accepts no new runs")]
    ShuttingDown,
    /// Something unexpected.
    #[error("internal error: {0}")]
    Internal(String),
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

impl From<&EngineError> for RpcError {
    fn from(e: &EngineError) -> RpcError {
        let code = match e {
            EngineError::InvalidParams { .. } => codes::INVALID_PARAMS,
            EngineError::RunNotFound(_) => codes::RUN_NOT_FOUND,
            EngineError::Audience(_) => codes::AUDIENCE_REFUSED,
            EngineError::Storage(_) => codes::STORAGE,
            EngineError::Workspace(_) => codes::WORKSPACE,
            EngineError::ShuttingDown => codes::SHUTTING_DOWN,
            EngineError::Sandbox { .. } => codes::SANDBOX_UNAVAILABLE,
            EngineError::Internal(_) => codes::INTERNAL_ERROR,
        };
        RpcError::new(code, e.to_string())
    }
}
