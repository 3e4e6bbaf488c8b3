//! Finding subagent definitions on disk: `<project>/.subagents/`, then
//! `<project>/.claude/agents/`, then `$XDG_CONFIG_HOME/subagentd/agents/`,
//! then `~/.claude/agents/`. The first definition of a name wins (project
//! first). A malformed file is reported and does not hide the others.
//!
//! A child with the write right may have written the project's folders:
//! they are opened beneath the project with no link on the way, and in
//! every folder a definition file must be a regular file (not a link, not
//! a FIFO) of at most [`DEFINITION_MAX`] bytes; at most
//! [`FILES_MAX`] files of a folder are read.

use policy::definition::{parse, Definition, DefinitionError};
use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use subagent_runner::safefile;

/// The largest definition file read.
pub const DEFINITION_MAX: u64 = 1 << 20;
/// At most this many `*.md` files of one folder are read (by name order).
pub const FILES_MAX: usize = 1_000;

/// Where definitions are looked for, in order, and whether each holds
/// Claude Code files.
pub fn search_dirs(project_dir: &Path) -> Vec<(PathBuf, bool)> {
    let config_home = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")));
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let mut dirs = vec![
        (project_dir.join(".subagents"), false),
        (project_dir.join(".claude").join("agents"), true),
    ];
    if let Some(c) = config_home {
        dirs.push((c.join("subagentd").join("agents"), false));
    }
    if let Some(h) = home {
        dirs.push((h.join(".claude").join("agents"), true));
    }
    dirs
}

/// Every definition found, and every file that could not be used.
#[derive(Debug, Default)]
pub struct Found {
    /// Usable definitions, first of each name, in search order.
    pub definitions: Vec<Definition>,
    /// Files that could not be used.
    pub errors: Vec<DefinitionError>,
}

impl Found {
    /// The definition called `name`.
    pub fn get(&self, name: &str) -> Option<&Definition> {
        self.definitions.iter().find(|d| d.name == name)
    }

    /// The names available (a malformed file blocks its name), sorted.
    pub fn names(&self) -> Vec<String> {
        let mut n: Vec<String> = self
            .definitions
            .iter()
            .map(|d| d.name.clone())
            .filter(|n| self.error_for(n).is_none())
            .collect();
        n.sort();
        n
    }

    /// The error of a file whose stem is `name` (a definition of that name
    /// that could not be read).
    pub fn error_for(&self, name: &str) -> Option<&DefinitionError> {
        self.errors
            .iter()
            .find(|e| e.file.file_stem().is_some_and(|s| s == name))
    }
}

/// A search dir, opened: the project's beneath the project (no link on
/// the way), the user's as configured.
fn open_search_dir(project_dir: &Path, dir: &Path) -> Option<OwnedFd> {
    match dir.strip_prefix(project_dir) {
        Ok(rel) => {
            let root = safefile::open_root(project_dir).ok()?;
            safefile::open_dir_beneath(root.as_fd(), rel).ok()
        }
        Err(_) => safefile::open_root(dir).ok(),
    }
}

/// The `*.md` names of a folder, sorted, at most [`FILES_MAX`].
fn md_names(dir: &OwnedFd, shown: &Path) -> Vec<OsString> {
    let (mut names, _) = safefile::names(dir.as_fd(), usize::MAX).unwrap_or_default();
    names.retain(|n| Path::new(n).extension().is_some_and(|x| x == "md"));
    names.sort();
    if names.len() > FILES_MAX {
        tracing::warn!(dir = %shown.display(), "only the first {FILES_MAX} of {} definition files are read", names.len());
        names.truncate(FILES_MAX);
    }
    names
}

/// Reads every `*.md` in the search dirs of `project_dir`.
pub fn discover(project_dir: &Path) -> Found {
    let mut found = Found::default();
    for (dir, claude) in search_dirs(project_dir) {
        let Some(fd) = open_search_dir(project_dir, &dir) else {
            continue;
        };
        for name in md_names(&fd, &dir) {
            let file = dir.join(&name);
            let read = safefile::open_beneath(fd.as_fd(), Path::new(&name));
            // A directory named `*.md` is no definition.
            if matches!(&read, Err(safefile::SafeFileError::NotRegular { kind, .. }) if *kind == "a directory")
            {
                continue;
            }
            let text = read
                .and_then(|f| f.read_all(DEFINITION_MAX))
                .map_err(|e| e.to_string())
                .and_then(|b| String::from_utf8(b).map_err(|_| "not UTF-8".to_owned()));
            let text = match text {
                Ok(t) => t,
                Err(message) => {
                    found.errors.push(DefinitionError {
                        file,
                        line: 0,
                        field: None,
                        message,
                    });
                    continue;
                }
            };
            match parse(&file, &text, claude) {
                Ok(d) => {
                    for w in &d.warnings {
                        tracing::warn!("{w}");
                    }
                    if found.get(&d.name).is_none() {
                        found.definitions.push(d);
                    }
                }
                Err(e) => found.errors.push(e),
            }
        }
    }
    found
}
