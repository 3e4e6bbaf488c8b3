//! Pure decisions for subagentd. Nothing here touches the file system, the
//! network or the process table: every function takes its inputs as plain
//! data and returns plain data, so each rule is unit-tested without
//! installing anything.
//!
//! Layout:
//! - [`audience`]: who may delegate to subagents (Public sessions may not).
//! - [`backend`]: where runs are placed (this host or a Slurm cluster),
//!   a run's Slurm job and what Slurm's job states mean for it.
//! - [`compose`]: the child's prompt stack (system.md, first_message.md,
//!   plan.json), a pure function of its inputs.
//! - [`config`]: the config file, parsed from its text.
//! - [`definition`]: subagent definitions (Markdown with YAML front matter).
//! - [`driver`]: how a coding agent (Claude Code, Codex) is started from
//!   the composed context; [`agentstream`]: what its JSON events report;
//!   [`usage`]: the turns, tokens and cost among them, also while it runs.
//! - [`agenttools`]: a definition's tool entries resolved against the
//!   catalog (Claude Code's names, `Tool(pattern)`, MCP names).
//! - [`env`](mod@env): the allowlisted environment a child starts with.
//! - [`limits`]: resource limits with their defaults.
//! - [`observed`]: what a run changed in its project, from two pictures.
//! - [`retention`]: which finished runs a prune removes, and why others stay.
//! - [`rights`]: what a run for another uid needs that uid to hold.
//! - [`tools`]: the tool catalog and capability classes.
//! - [`toolpolicy`]: audiences' tool sets and the child-tools filter.
//! - [`workctx`]: recent files, the git snapshot's shape, the
//!   `[working-context]` block, and the delta acceptance rules.
//! - [`sandbox`]: the sandbox spec the runner applies (file-system rules,
//!   seccomp deny-list, cgroup plan, rlimits, required mechanisms).

pub mod agentstream;
pub mod agenttools;
pub mod audience;
pub mod backend;
pub mod compose;
pub mod config;
pub mod definition;
pub mod driver;
pub mod env;
pub mod limits;
pub mod observed;
pub mod retention;
pub mod rights;
pub mod sandbox;
pub mod toolpolicy;
pub mod tools;
pub mod usage;
pub mod visible;
pub mod workctx;

pub use audience::{Audience, AudienceError};
pub use env::{child_env, validate_request_env, ChildPaths, EnvError};
pub use limits::Limits;

/// Default restarts after exit 75.
pub const DEFAULT_MAX_RESTARTS: u32 = 3;
/// The most restarts a run may ask for.
pub const MAX_RESTARTS: u32 = 10;
