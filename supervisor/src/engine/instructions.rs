//! The project's instructions file (`AGENTS.md` and its kin), which a
//! child with the write right may have left as a link to a host file, a
//! FIFO or a huge file: each name is opened beneath the project with no
//! link on the way, must be a regular file, and at most
//! [`INSTRUCTIONS_MAX`] bytes of it are read.

use std::os::fd::AsFd;
use std::path::Path;
use subagent_runner::safefile;

/// The names looked for, in order.
pub const NAMES: [&str; 4] = [
    ".subagents/AGENTS.md",
    "AGENTS.md",
    "CLAUDE.md",
    "CONTEXT.md",
];
/// At most this much of the file is read (composition caps it further).
pub const INSTRUCTIONS_MAX: u64 = 1 << 20;

/// The first of [`NAMES`] in `dir` that is a regular file reached without
/// a link; a name that is something else is passed over (and logged).
pub fn project_instructions(dir: &Path) -> Option<policy::compose::Sourced> {
    let root = safefile::open_root(dir).ok()?;
    for name in NAMES {
        let read = safefile::open_beneath(root.as_fd(), Path::new(name))
            .and_then(|f| f.read_head(INSTRUCTIONS_MAX));
        match read {
            Ok(buf) => {
                return Some(policy::compose::Sourced {
                    path: dir.join(name),
                    text: String::from_utf8_lossy(&buf).into_owned(),
                })
            }
            Err(e) if e.is_missing() => {}
            Err(e) => {
                tracing::warn!(project = %dir.display(), "project instructions passed over: {e}")
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_and_fifos_are_passed_over_for_the_next_name() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        std::fs::create_dir(p.join(".subagents")).unwrap();
        nix::unistd::mkfifo(
            &p.join(".subagents/AGENTS.md"),
            nix::sys::stat::Mode::S_IRWXU,
        )
        .unwrap();
        std::os::unix::fs::symlink("/proc/self/environ", p.join("AGENTS.md")).unwrap();
        std::fs::write(p.join("real.md"), "linked").unwrap();
        std::os::unix::fs::symlink("real.md", p.join("CLAUDE.md")).unwrap();
        assert!(project_instructions(p).is_none());
        std::fs::write(p.join("CONTEXT.md"), "use tabs").unwrap();
        let got = project_instructions(p).unwrap();
        assert_eq!(
            (got.path, got.text.as_str()),
            (p.join("CONTEXT.md"), "use tabs")
        );
        // `.subagents` itself a link: not followed either.
        let e = tempfile::tempdir().unwrap();
        std::fs::create_dir(e.path().join("real")).unwrap();
        std::fs::write(e.path().join("real/AGENTS.md"), "x").unwrap();
        std::os::unix::fs::symlink(e.path().join("real"), e.path().join(".subagents")).unwrap();
        assert!(project_instructions(e.path()).is_none());
    }
}
