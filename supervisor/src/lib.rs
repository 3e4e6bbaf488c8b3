//! subagentd: a supervisor that runs AI subagents as separate OS processes.
//!
//! Layout:
//! - [`agents`]: finding subagent definitions on disk.
//! - [`ids`], [`timefmt`], [`paths`]: run ids, timestamps, where things live.
//! - [`securedir`]: private directories under /tmp without following symlinks.
//! - [`runas`]: the unprivileged user children may run as.
//! - [`rights`]: checking what a requester of another uid may reach, as it.
//! - [`record`]: run.json, the durable record of a run, and its states.
//! - [`run`]: the run's data run.json holds (worktree, delta, driver,
//!   egress counts), below everything that acts on a run.
//! - [`status`]: a run's status as the protocol returns it, from its record.
//! - [`protocol`]: the JSON-RPC wire types and error codes (docs/protocol.md).
//! - [`gitsnap`]: the git snapshot taken at spawn, under a time budget.
//! - [`sessions`]: each parent session's recent files, persisted.
//! - [`notices`]: the durable finished-run notices of each session.
//! - [`observe`]: the pictures of a project that tell what a run changed.
//! - [`result_md`]: the result.md a finished run leaves.
//! - [`isolation`]: the isolation report's rows, for result.md and `--check`.
//! - [`sanitize`]: showing what a child or a definition wrote, on a
//!   terminal, to a model and in Markdown, without letting it act.
//! - [`engine`]: the supervisor itself: accepting, queueing, launching,
//!   watching and finishing runs; used by the daemon and by `subagent run`.
//! - [`egress`]: the proxy through which runs in allowlist mode reach
//!   their listed hosts, and their egress.log.
//! - [`gateway`]: the model gateway through which a driver's agent reaches
//!   its configured endpoint, the daemon adding the key; and gateway.log.
//! - [`runlog`]: the bounded JSON-lines writer both of those logs use.
//! - [`runservice`]: the stop handle and accept both of those services use.
//! - [`server`]: the Unix socket listener and one handler per connection.
//! - [`client`]: a blocking client for the socket.
//! - [`trust`]: what every client checks of the socket and its listener
//!   before it sends anything.
//! - [`cli`]: the `subagent` command.
//! - [`mcp`]: `subagent mcp`, an MCP server on stdio over the socket.
//! - [`view`]: what both front ends show: a log's tail, the definitions
//!   as JSON.

pub mod agents;
pub mod cli;
pub mod client;
pub mod egress;
pub mod engine;
pub mod gateway;
pub mod gitsnap;
pub mod ids;
pub mod isolation;
pub mod lockfile;
pub mod mcp;
pub mod notices;
pub mod observe;
pub mod paths;
pub mod protocol;
pub mod result_md;
pub mod rights;
pub mod run;
pub mod runas;
pub mod runlog;
pub mod runservice;
pub mod sanitize;
pub mod securedir;
pub mod selfcheck;
pub mod server;
pub mod sessions;
pub mod status;
pub mod timefmt;
pub mod trust;
pub mod uids;
pub mod view;
