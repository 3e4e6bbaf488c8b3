//! The `subagent` command line as clap parses it: the global options,
//! the subcommands and their arguments, and the exit codes. Uses only the
//! MCP options; the commands and `main` build on it.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// Exit code of `wait` when `--timeout` passed before the run ended.
pub const EXIT_STILL_RUNNING: u8 = 75;
/// Exit code when the client itself failed (no daemon, bad answer).
pub const EXIT_CLIENT_ERROR: u8 = 1;

/// The `subagent` command line.
#[derive(Debug, Parser)]
#[command(
    name = "subagent",
    version,
    about = "Run and inspect sandboxed AI subagents through subagentd"
)]
pub struct Cli {
    /// The daemon's socket.
    #[arg(long, global = true, env = "SUBAGENTD_SOCKET", value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// The state dir, for `logs` without a daemon and for `run`'s embedded
    /// supervisor.
    #[arg(long, global = true, env = "SUBAGENTD_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    /// Also trust a daemon running as this uid (a number or a user name):
    /// its socket's directories may be owned by it, and it may listen.
    /// Yours and root's are always trusted.
    #[arg(long, global = true, env = "SUBAGENT_EXPECT_UID", value_name = "UID")]
    pub expect_uid: Option<String>,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// What a new run needs; shared by `spawn` and `run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// The parent session's id.
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
    /// The parent's audience: personal or team.
    #[arg(long, default_value = "personal")]
    pub audience: String,
    /// The child's working directory (default: the current directory).
    #[arg(long, value_name = "DIR")]
    pub project_dir: Option<PathBuf>,
    /// The task.
    #[arg(long)]
    pub task: String,
    /// Background for the task.
    #[arg(long)]
    pub context: Option<String>,
    /// Wall-clock limit in seconds.
    #[arg(long, value_name = "S")]
    pub wall_time: Option<u64>,
    /// Cap on child.log in MiB.
    #[arg(long, value_name = "MB")]
    pub output_mb: Option<u64>,
    /// Memory limit in MiB (default 2048).
    #[arg(long, value_name = "MB")]
    pub memory_mb: Option<u64>,
    /// Process limit (default 512).
    #[arg(long, value_name = "N")]
    pub pids: Option<u64>,
    /// Size of the run's temp, artifact and delta dirs together, in MiB
    /// (default 1024).
    #[arg(long, value_name = "MB")]
    pub disk_mb: Option<u64>,
    /// Let the child write the project dir (default: read only).
    #[arg(long)]
    pub write_project: bool,
    /// Let the child use the network (default: none).
    #[arg(long)]
    pub network: bool,
    /// A `host:port` the child may reach through the daemon's egress proxy
    /// (repeatable; `*.example.com` for a domain's hosts).
    #[arg(long, value_name = "HOST:PORT")]
    pub network_allow: Vec<String>,
    /// How the agent starts: command, claude-code or codex (the driver's
    /// program and endpoint come from the daemon's config).
    #[arg(long, value_name = "DRIVER")]
    pub driver: Option<String>,
    /// Give the command first_message.md on its stdin.
    #[arg(long)]
    pub stdin_first_message: bool,
    /// An extra read-only root (repeatable).
    #[arg(long, value_name = "DIR")]
    pub read_path: Vec<PathBuf>,
    /// An extra writable root (repeatable).
    #[arg(long, value_name = "DIR")]
    pub write_path: Vec<PathBuf>,
    /// The parent's tools, comma-separated (the child gets those it may be
    /// delegated, and OS rights to match).
    #[arg(long, value_name = "T1,T2")]
    pub tools: Option<String>,
    /// Restarts after the child exits 75 (default: the config's, else 3).
    #[arg(long, value_name = "N")]
    pub max_restarts: Option<u32>,
    /// At most N turns, enforced by the agent (the claude-code driver's
    /// --max-turns; other drivers are refused).
    #[arg(long, value_name = "N")]
    pub max_turns: Option<u32>,
    /// At most X US dollars, as the agent computes its cost (the
    /// claude-code driver's --max-budget-usd; other drivers are refused).
    #[arg(long, value_name = "X")]
    pub max_budget_usd: Option<f64>,
    /// Work in a git worktree of its own (branch `subagent/<run id>`).
    #[arg(long)]
    pub worktree: bool,
    /// Run this subagent definition (see `subagent agents`).
    #[arg(long, value_name = "NAME")]
    pub agent: Option<String>,
    /// Extra environment for the child (repeatable).
    #[arg(long = "env", value_name = "NAME=VALUE")]
    pub env: Vec<String>,
    /// Keep the temp dir after the run.
    #[arg(long)]
    pub keep_temp: bool,
    /// The agent program and its arguments (default: the agent
    /// definition's command, else the config's).
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start a run through the daemon and print its id.
    Spawn {
        /// The run.
        #[command(flatten)]
        run: RunArgs,
        /// Wait for the run to end and exit as `wait` does.
        #[arg(long)]
        wait: bool,
    },
    /// Print a run's status.
    Check {
        /// The run id.
        run: String,
    },
    /// Wait for a run to end; exit with its code (0 succeeded, the child's
    /// code or 128+signal when failed, 124 timed_out, 130 cancelled, 125 lost).
    Wait {
        /// The run id.
        run: String,
        /// Give up after this many seconds (exit 75 when still running).
        #[arg(long, value_name = "S")]
        timeout: Option<f64>,
    },
    /// Cancel a run.
    Cancel {
        /// The run id.
        run: String,
    },
    /// List runs, oldest first: all of them, fetched and printed a page at a
    /// time, or one page with --limit.
    Ls(LsArgs),
    /// A live, full-screen view of the runs, refreshed every second: state,
    /// CPU, memory, egress, tokens and cost, and each run's last log line.
    /// Keys: ↑/↓ select, Enter follows the run's log (Esc back), c cancels
    /// it (y to confirm), s or / filters by session, f cycles all/live/ended,
    /// q or Ctrl-C quits.
    Top(TopArgs),
    /// Take a session's finished-run notices (each is shown once).
    Notices {
        /// The session.
        #[arg(long, value_name = "ID")]
        session: String,
    },
    /// Print a run's log (works for ended runs and without the daemon).
    Logs {
        /// The run id.
        run: String,
        /// Keep printing until the run has ended and its log is drained.
        #[arg(short, long)]
        follow: bool,
        /// Start with the last N lines.
        #[arg(long, value_name = "N")]
        tail: Option<usize>,
        /// Put the time each line was captured in front of it, RFC 3339 in
        /// UTC (`2026-12-06T19:19:38.123Z line`); `-` where it is not known.
        #[arg(long)]
        timestamps: bool,
        /// Start at the first line captured at or after: an age (`90s`,
        /// `10m`, `2h`, `7d`) or an RFC 3339 time.
        #[arg(long, value_name = "WHEN")]
        since: Option<String>,
        /// Print the log's bytes unchanged even to a terminal (by default
        /// a terminal gets control characters and escape sequences shown
        /// visibly, e.g. ESC as `\x1b`; a pipe or file always gets the bytes).
        #[arg(long)]
        raw: bool,
    },
    /// Run a task to its end for CI: stream its log, print result.md's
    /// path on stderr, exit with the run's code. Uses the daemon when one
    /// answers, else an embedded supervisor.
    Run {
        /// The run.
        #[command(flatten)]
        run: RunArgs,
        /// Stream the log's bytes unchanged even to a terminal (see `logs`).
        #[arg(long)]
        raw: bool,
    },
    /// Show what a run's child was given: each context layer with its raw
    /// and injected size, ~tokens, truncation, and the stable-prefix hash.
    Context {
        /// The run id.
        run: String,
        /// Also the tool schemas' sizes, largest first.
        #[arg(long)]
        detail: bool,
        /// Print the composed texts (system.md, first_message.md).
        #[arg(long)]
        show: bool,
    },
    /// Print a session's `[working-context]` block (project dir, recent
    /// files, a fresh git snapshot).
    ContextOf {
        /// The session.
        #[arg(long, value_name = "ID")]
        session: String,
    },
    /// Manage the git worktrees of `--worktree` runs.
    Worktree {
        /// What to do.
        #[command(subcommand)]
        action: WorktreeAction,
    },
    /// List the subagent definitions a run in this project can use.
    Agents {
        /// The project (default: the current directory).
        #[arg(long, value_name = "DIR")]
        project_dir: Option<PathBuf>,
    },
    /// Remove finished runs by the daemon's retention limits now, printing
    /// each run removed and each kept that a limit wanted, with why.
    Prune {
        /// Say what would be removed; remove nothing.
        #[arg(long)]
        dry_run: bool,
        /// Only this session's runs.
        #[arg(long, value_name = "ID")]
        session: Option<String>,
        /// Also every run that ended at least this long ago (`7d`, `12h`,
        /// `0s`), but never the runs retention keeps.
        #[arg(long, value_name = "D")]
        older_than: Option<String>,
    },
    /// Sum the turns, tokens and cost runs reported (as each agent reported
    /// them), per driver: a session's, or every run you may see; pruned runs
    /// count.
    Usage(UsageArgs),
    /// Check that the daemon answers.
    Ping,
    /// Print the daemon's metrics in the Prometheus text format (the
    /// daemon's uid and root only; see docs/operating.md).
    Metrics {
        /// OpenMetrics text 1.0.0 instead.
        #[arg(long)]
        openmetrics: bool,
    },
    /// Print a completion script for SHELL (bash, zsh, fish, elvish,
    /// powershell), e.g. `subagent completions bash > /etc/bash_completion.d/subagent`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), e.g. `subagent man | man -l -`.
    Man,
    /// Serve MCP on stdin/stdout, so an MCP client (Claude Code, Codex, …)
    /// can delegate to subagents; starts a daemon when none answers.
    Mcp(crate::mcp::McpArgs),
}

/// `subagent worktree` actions.
#[derive(Debug, Subcommand)]
pub enum WorktreeAction {
    /// Remove a run's worktree and its branch.
    Rm {
        /// The run id.
        run: String,
    },
}

/// `subagent ls`.
#[derive(Debug, Clone, clap::Args)]
pub struct LsArgs {
    /// Only this session's runs.
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
    /// Only runs in this state.
    #[arg(long, value_name = "STATE")]
    pub state: Option<String>,
    /// One page of at most N runs (1 to 1000); with --all, the page size.
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
    /// Every run, a page at a time (the default without --limit).
    #[arg(long)]
    pub all: bool,
    /// Only runs created since: an age (`90s`, `10m`, `2h`, `7d`) or an
    /// RFC 3339 time.
    #[arg(long, value_name = "WHEN")]
    pub since: Option<String>,
    /// Only runs created until: an age or an RFC 3339 time.
    #[arg(long, value_name = "WHEN")]
    pub until: Option<String>,
    /// Newest first.
    #[arg(long)]
    pub desc: bool,
    /// Print the list again every interval, each time after a line with
    /// the time, until interrupted: plain lines, for a pipe or a dumb
    /// terminal (`subagent top` is the full-screen view).
    #[arg(long)]
    pub watch: bool,
    /// Seconds between two lists with --watch (default 2).
    #[arg(long, value_name = "SECS", requires = "watch")]
    pub interval: Option<f64>,
}

/// `subagent top`.
#[derive(Debug, Clone, clap::Args)]
pub struct TopArgs {
    /// Only this session's runs (`s` or `/` changes it in the view).
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
}

/// `subagent usage`.
#[derive(Debug, Clone, clap::Args)]
pub struct UsageArgs {
    /// Only this session's runs.
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
    /// Only runs created since: an age (`90s`, `10m`, `2h`, `7d`) or an
    /// RFC 3339 time.
    #[arg(long, value_name = "WHEN")]
    pub since: Option<String>,
    /// Only runs created until: an age or an RFC 3339 time.
    #[arg(long, value_name = "WHEN")]
    pub until: Option<String>,
}
