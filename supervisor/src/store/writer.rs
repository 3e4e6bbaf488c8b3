//! The store's one writer: a thread that owns the read-write connection,
//! takes requests from a channel, applies each in a savepoint of one
//! transaction per group and answers only after that group's COMMIT.

use super::{Op, Result};
use crate::protocol::Notice;
use crate::sessions::SessionState;

/// What a request's ops gave back.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Out {
    /// The notices [`Op::TakeNotices`] took, oldest first.
    pub notices: Vec<Notice>,
    /// The session's state after [`Op::Touch`].
    pub session: Option<SessionState>,
}

/// One request: its ops and where its answer goes.
pub(super) struct Req {
    pub(super) ops: Vec<Op>,
    pub(super) reply: tokio::sync::oneshot::Sender<Result<Out>>,
}

/// What the writer has done, counted for the tests.
#[cfg(test)]
#[derive(Debug, Default)]
pub(super) struct Stats {
    /// Groups committed.
    pub(super) commits: std::sync::atomic::AtomicU64,
    /// Requests answered.
    pub(super) requests: std::sync::atomic::AtomicU64,
}
