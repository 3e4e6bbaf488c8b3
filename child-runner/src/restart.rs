//! Restart with handoff: a child that exits 75 ("I ran out of room;
//! continue me") is started again under the same run, with a context
//! composed afresh that carries its handoff note.

use crate::spec::RestartSpec;
use policy::compose::{compose, ComposeInput};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The exit code that asks for a restart.
pub const EXIT_CONTINUE: i32 = policy::compose::EXIT_CONTINUE;
/// The largest handoff note read.
pub const MAX_HANDOFF_BYTES: u64 = 64 * 1024;

/// Records the attempt in progress (for the status); best effort, and not
/// durable: it only informs a status read while the run is alive. Nothing
/// is written for the first attempt, which a missing file means.
pub fn record_attempt(r: &RestartSpec, attempt: u32) {
    if attempt <= 1 {
        return;
    }
    let text = format!(
        "{{\"attempt\": {attempt}, \"max_attempts\": {}}}\n",
        r.max_attempts
    );
    let _ = crate::atomic::write_replace(&r.attempt_file, text.as_bytes());
}

/// Reads the child's handoff note without following symlinks (the child
/// controls its artifact dir): a regular file, at most 64 KiB, as text.
pub fn read_handoff(artifact_dir: &Path) -> Option<String> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(artifact_dir.join("handoff.md"))
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut buf = Vec::new();
    f.take(MAX_HANDOFF_BYTES).read_to_end(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

fn write(r: &RestartSpec, name: &str, text: &str) -> Result<(), String> {
    let path = r.context_dir.join(name);
    crate::atomic::write_atomic(&path, text.as_bytes()).map_err(|e| e.to_string())?;
    if let Some(gid) = r.share_gid {
        std::os::unix::fs::chown(&path, None, Some(gid))
            .map_err(|e| format!("chown {}: {e}", path.display()))?;
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o640))
            .map_err(|e| format!("chmod {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Composes the context of `attempt` from compose.json and the handoff
/// note, and writes it into the context dir.
pub fn prepare_next(r: &RestartSpec, attempt: u32) -> Result<(), String> {
    let bytes = std::fs::read(&r.compose_input)
        .map_err(|e| format!("read {}: {e}", r.compose_input.display()))?;
    let input: ComposeInput = serde_json::from_slice(&bytes)
        .map_err(|e| format!("parse {}: {e}", r.compose_input.display()))?;
    let handoff = read_handoff(&r.artifact_dir);
    let c = compose(&input, attempt, handoff.as_deref());
    write(r, "system.md", &c.system_md)?;
    write(r, "first_message.md", &c.first_message_md)?;
    write(r, &format!("plan-{attempt}.json"), &c.plan_json)?;
    write(r, "plan.json", &c.plan_json)
}
