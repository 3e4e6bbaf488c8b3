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

/// The daemon variable a driver test's config names for the key.
pub const KEY_VAR: &str = "SUBAGENT_TEST_MODEL_KEY";

/// A daemon whose config sets `driver`'s program, endpoint and key (in
/// [`KEY_VAR`]); `extra` goes into the driver's table (what comes before
/// a line `[]` in it, at the top); and the home holding the config.
pub fn daemon(
    driver: &str,
    program: &std::path::Path,
    base_url: &str,
    extra: &str,
    key: &str,
) -> (crate::Daemon, tempfile::TempDir) {
    let home = tempfile::tempdir_in("/tmp").unwrap();
    let cfg = home.path().join("config.toml");
    let (top, extra) = extra.split_once("\n[]\n").unwrap_or(("", extra));
    let text = format!(
        "{top}\n[drivers.{driver}]\ncommand = {:?}\nbase_url = {base_url:?}\napi_key_env = {KEY_VAR:?}\n{extra}",
        program.display().to_string()
    );
    std::fs::write(&cfg, text).unwrap();
    let d = crate::Daemon::start_with(crate::DaemonOpts {
        env: vec![(KEY_VAR.to_owned(), key.to_owned())],
        args: vec!["--config".into(), cfg.display().to_string()],
        ..Default::default()
    });
    (d, home)
}
