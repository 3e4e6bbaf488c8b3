//! Finding subagent definitions on disk: `<project>/.subagents/`, then
//! `<project>/.claude/agents/`, then `$XDG_CONFIG_HOME/subagentd/agents/`,
//! then `~/.claude/agents/`. The first definition of a name wins (project
//! first). A malformed file is reported and does not hide the others.

use policy::definition::{parse, Definition, DefinitionError};
use std::path::{Path, PathBuf};

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

/// Reads every `*.md` in the search dirs of `project_dir`.
pub fn discover(project_dir: &Path) -> Found {
    let mut found = Found::default();
    for (dir, claude) in search_dirs(project_dir) {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "md") && p.is_file())
            .collect();
        files.sort();
        for file in files {
            let text = match std::fs::read_to_string(&file) {
                Ok(t) => t,
                Err(e) => {
                    found.errors.push(DefinitionError {
                        file: file.clone(),
                        line: 0,
                        field: None,
                        message: e.to_string(),
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
