//! Test support shared by the workspace's tests (not used by the runner):
//! how a test that needs something the host lacks skips.

/// Skips a test that needs `mechanism`, which this host lacks (`why`):
/// prints `SKIPPED: <why>`. Under `CI=true` it panics instead, unless
/// `SUBAGENT_ALLOW_MISSING` (comma-separated mechanism names) lists it: CI
/// machines are expected to have everything.
pub fn skip(mechanism: &str, why: &str) {
    let allowed = std::env::var("SUBAGENT_ALLOW_MISSING").unwrap_or_default();
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    if ci && !allowed.split(',').any(|m| m.trim() == mechanism) {
        panic!("{mechanism} is required under CI but missing: {why} (list it in SUBAGENT_ALLOW_MISSING to allow)");
    }
    println!("SKIPPED: {why}");
}
