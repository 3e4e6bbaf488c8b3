//! subagentd: a supervisor that runs AI subagents as separate OS processes.
//!
//! Layout, in layers from the bottom (a module uses its own layer and
//! those below; docs/architecture.md has the map, tests/tests/layers.rs
//! keeps it true):
//! - foundation: [`ids`], [`timefmt`] (run and session ids, timestamps);
//!   [`securedir`] (private directories without following links);
//!   [`lockfile`] (flock: "someone is alive here"); [`runas`] (the user
//!   children may run as); [`rights`] (what a requester of another uid may
//!   reach, as it); [`runlog`] (the bounded JSON-lines writer of
//!   egress.log and gateway.log); [`runservice`] (their stop handle and
//!   accept); [`sanitize`] (showing what a child or a definition wrote, on
//!   a terminal, to a model and in Markdown, without letting it act);
//!   [`isolation`] (the isolation report's rows).
//! - host: [`gitsnap`] (the git snapshot at spawn, under a time budget),
//!   [`observe`] (the pictures that tell what a run changed), [`paths`]
//!   (where things live), [`runnerpath`] (which subagent-runner the daemon
//!   execs), [`uids`] (per-run uid leases), [`trust`] (what a
//!   client checks of the socket before it sends anything), [`agents`]
//!   (subagent definitions on disk), [`sessions`] (each parent session's
//!   recent files), [`livesample`] (a live run's processes and its log's
//!   last line, read per call), [`slurm`] (the Slurm commands a cluster
//!   backend runs).
//! - run model: [`run`]: a run's record, typed by phase, and what it is
//!   made of (worktree, delta, driver, egress counts).
//! - run services: [`egress`] (the proxy of runs in allowlist mode),
//!   [`gateway`] (the model gateway of driver runs, the daemon adding the
//!   key), [`metrics`] (the engine's counters, their bounded labels and
//!   the Prometheus exposition).
//! - protocol: [`protocol`] (the JSON-RPC wire types and error codes),
//!   [`status`] (a run's status, from its record), [`usage`] (a live run's
//!   usage so far, and usage summed), [`result_md`] (a finished run's
//!   result.md), [`store`] (the daemon's records in SQLite, state.db).
//! - [`engine`]: the supervisor itself: its parts, its phases (accept,
//!   launch, finish, recover) and its API; used by the daemon and by
//!   `subagent run`.
//! - front ends: [`server`] (the socket listener, a handler per
//!   connection), [`client`], [`view`] (what both cli and mcp show),
//!   [`mcp`] (`subagent mcp`), [`cli`] (the `subagent` command),
//!   [`selfcheck`] (`subagentd --check`).

pub mod agents;
pub mod cli;
pub mod client;
pub mod egress;
pub mod engine;
pub mod gateway;
pub mod gitsnap;
pub mod ids;
pub mod isolation;
pub mod livesample;
pub mod lockfile;
pub mod mcp;
pub mod metrics;
pub mod observe;
pub mod paging;
pub mod paths;
pub mod protocol;
pub mod result_md;
pub mod rights;
pub mod run;
pub mod runas;
pub mod runlog;
pub mod runnerpath;
pub mod runservice;
pub mod sanitize;
pub mod securedir;
pub mod selfcheck;
pub mod server;
pub mod sessions;
pub mod slurm;
pub mod status;
pub mod store;
pub mod timefmt;
pub mod trust;
pub mod uids;
pub mod usage;
pub mod view;
