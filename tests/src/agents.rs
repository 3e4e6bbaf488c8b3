//! The coding-agent CLIs the driver tests run, as scripts/install-agents
//! puts them in the checkout (`target/agents/`, or
//! `$SUBAGENT_AGENTS_PREFIX`): Claude Code's native binary and Codex's
//! static binary (its Node launcher only picks and execs that binary).

use std::path::PathBuf;

/// The prefix scripts/install-agents installs into.
pub fn prefix() -> PathBuf {
    match std::env::var_os("SUBAGENT_AGENTS_PREFIX") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/agents"),
    }
}

/// An installed agent: the file to run, canonical (so it can be bound
/// into a run as one file), or why there is none.
fn found(p: PathBuf, what: &str) -> Result<PathBuf, String> {
    p.canonicalize().map_err(|_| {
        format!(
            "{what} is not installed at {} (run scripts/install-agents)",
            p.display()
        )
    })
}

/// Claude Code's binary.
pub fn claude() -> Result<PathBuf, String> {
    found(prefix().join("bin/claude"), "Claude Code")
}

/// Codex's static binary.
pub fn codex() -> Result<PathBuf, String> {
    found(
        prefix().join(
            "lib/node_modules/@openai/codex/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex",
        ),
        "Codex",
    )
}

/// The agent `find` returns, or `None` after printing `SKIPPED: <why>`
/// (under `CI=true` a missing agent fails the test unless
/// `SUBAGENT_ALLOW_MISSING` lists `mechanism`: `claude-code` or `codex`).
pub fn require(find: fn() -> Result<PathBuf, String>, mechanism: &str) -> Option<PathBuf> {
    match find() {
        Ok(p) => Some(p),
        Err(why) => {
            crate::runnable(false, mechanism, &why);
            None
        }
    }
}
