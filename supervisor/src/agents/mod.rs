//! Finding subagent definitions on disk, as Claude Code finds its own:
//! every `*.md` (in any case) beneath `<project>/.subagents/`, then
//! `<project>/.claude/agents/`, then `$XDG_CONFIG_HOME/subagentd/agents/`,
//! then `~/.claude/agents/`, subfolders included. The first definition of
//! a name wins (the folders in that order, then by path); every other one
//! is reported as shadowed. A malformed file is reported and does not hide
//! the others.
//!
//! A child with the write right may have written the project's folders:
//! they are opened beneath the project with no link on the way, and
//! within each folder links are followed only where they stay in it
//! ([`walk`]); a definition must be a regular file of at most
//! [`DEFINITION_MAX`] bytes.
//!
//! - [`walk`]: the folder walk.
//! - [`cache`]: parses kept per file and content.

pub mod cache;
pub mod walk;

pub use cache::DEFINITION_MAX;
use policy::agenttools::AgentTools;
use policy::definition::{Definition, DefinitionError};
use policy::toolpolicy::ToolPolicy;
use policy::tools::{covers, NEVER_DELEGATED};
use policy::visible::one_line;
use std::collections::HashSet;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use subagent_runner::safefile::{self, SafeFileError};

/// The first search dirs, the project's.
const PROJECT_DIRS: usize = 2;

/// Where definitions are looked for, in order: the project's
/// ([`PROJECT_DIRS`]), then the user's.
pub fn search_dirs(project_dir: &Path) -> Vec<PathBuf> {
    let config_home = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")));
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let mut dirs = vec![
        project_dir.join(".subagents"),
        project_dir.join(".claude").join("agents"),
    ];
    if let Some(c) = config_home {
        dirs.push(c.join("subagentd").join("agents"));
    }
    if let Some(h) = home {
        dirs.push(h.join(".claude").join("agents"));
    }
    dirs
}

/// A usable definition, its tools resolved against the catalog.
#[derive(Debug, Clone)]
pub struct Agent {
    pub definition: Definition,
    pub tools: AgentTools,
    /// Everything said about it: the file's warnings, the tools', its
    /// body's size.
    pub warnings: Vec<String>,
    /// Read now, not taken from the cache: its warnings are new.
    pub fresh: bool,
    /// From a project folder, which a child may have written.
    pub project: bool,
}

impl Agent {
    /// The tools it may hold at most, as `subagent agents` shows them: its
    /// list without the tools no child holds and those it denies (None:
    /// any the parent may delegate, but those it denies).
    pub fn shown_tools(&self, policy: &ToolPolicy) -> Option<Vec<String>> {
        let allow = self.tools.allow.as_ref()?;
        let delegable = |n: &String| {
            policy
                .tool(n)
                .is_none_or(|t| t.class.delegable() && !NEVER_DELEGATED.contains(&n.as_str()))
        };
        let denied = |n: &String| self.tools.deny.iter().any(|d| covers(d, n));
        Some(
            allow
                .iter()
                .filter(|n| delegable(n) && !denied(n))
                .cloned()
                .collect(),
        )
    }
}

/// A definition hidden by an earlier one of the same name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Duplicate {
    pub name: String,
    /// The file whose definition is used.
    pub winner: PathBuf,
    pub shadowed: PathBuf,
    /// The shadowed one is from a user-level folder, the one used from a
    /// project folder.
    pub over_user: bool,
}

/// Every definition found, and every file that could not be used.
#[derive(Debug, Default)]
pub struct Found {
    /// Usable definitions, the first of each name, in search order.
    pub agents: Vec<Agent>,
    /// Definitions hidden by an earlier one of the same name.
    pub duplicates: Vec<Duplicate>,
    /// Files that could not be used.
    pub errors: Vec<DefinitionError>,
    /// What was not walked (links out of a folder, limits, folders that
    /// cannot be read).
    pub notes: Vec<String>,
    /// The first search folder not read whole, and why.
    blocked_by: Option<(PathBuf, String)>,
}

impl Found {
    /// The definition called `name`.
    pub fn get(&self, name: &str) -> Option<&Agent> {
        self.agents.iter().find(|a| a.definition.name == name)
    }

    /// The user-level definition the project's definition `name` shadows.
    pub fn shadowed_user_level(&self, name: &str) -> Option<&Path> {
        self.duplicates
            .iter()
            .find(|d| d.name == name && d.over_user)
            .map(|d| d.shadowed.as_path())
    }

    /// The names available (a malformed file blocks its name), sorted.
    pub fn names(&self) -> Vec<String> {
        let mut n: Vec<String> = self
            .agents
            .iter()
            .map(|a| a.definition.name.clone())
            .filter(|n| self.error_for(n).is_none())
            .collect();
        n.sort();
        n
    }

    /// The error of a file that names `name`, or whose stem is `name`
    /// when it names nothing (a definition of that name that could not be
    /// read).
    pub fn error_for(&self, name: &str) -> Option<&DefinitionError> {
        self.errors.iter().find(|e| match &e.name {
            Some(n) => n == name,
            None => e.file.file_stem().is_some_and(|s| s == name),
        })
    }

    /// Logs the warnings not logged before (once per file and content),
    /// and the folders not read whole, each on one line: a file name
    /// cannot start a line of the log.
    pub fn log_new_warnings(&self) {
        if let Some((dir, why)) = &self.blocked_by {
            let dir = one_line(&dir.to_string_lossy());
            tracing::warn!("definitions: {dir}: {}", one_line(why));
        }
        for a in self.agents.iter().filter(|a| a.fresh) {
            for w in &a.warnings {
                tracing::warn!("{}", one_line(w));
            }
        }
    }
}

/// A search dir, opened: the project's beneath the project (no link on
/// the way), the user's as configured. None: it is not there.
fn open_search_dir(project_dir: &Path, dir: &Path) -> Result<Option<OwnedFd>, SafeFileError> {
    let opened = match dir.strip_prefix(project_dir) {
        Ok(rel) => safefile::open_root(project_dir)
            .and_then(|root| safefile::open_dir_beneath(root.as_fd(), rel)),
        Err(_) => safefile::open_root(dir),
    };
    match opened {
        Ok(fd) => Ok(Some(fd)),
        Err(e) if e.is_missing() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Reads every definition in the search dirs of `project_dir`, its tools
/// resolved against `tools`; a body over `max_body_chars` (the context's
/// per-layer cap, which it is not cut at) is warned about. A folder that
/// cannot be read whole blocks the names found after it: one of them
/// there would have come first.
pub fn discover(project_dir: &Path, tools: &ToolPolicy, max_body_chars: usize) -> Found {
    discover_in(project_dir, search_dirs(project_dir), tools, max_body_chars)
}

/// `path` as the host resolves it: its deepest existing ancestor made
/// canonical, the rest as it is.
fn resolved(path: &Path) -> PathBuf {
    let mut rest = Vec::new();
    let mut at = path;
    loop {
        if let Ok(c) = at.canonicalize() {
            return rest.iter().rev().fold(c, |p, r| p.join(r));
        }
        match (at.parent(), at.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_owned());
                at = parent;
            }
            _ => return path.to_path_buf(),
        }
    }
}

/// Whether a search folder is the project's: one of the first
/// [`PROJECT_DIRS`], or any inside the project once resolved (a user-level
/// folder under a project at `$HOME` is child-writable all the same).
fn is_project_dir(i: usize, dir: &Path, project_dir: &Path) -> bool {
    i < PROJECT_DIRS || resolved(dir).starts_with(resolved(project_dir))
}

/// [`discover`] over the folders `dirs`, in order.
fn discover_in(
    project_dir: &Path,
    dirs: Vec<PathBuf>,
    tools: &ToolPolicy,
    max_body_chars: usize,
) -> Found {
    let mut found = Found::default();
    let mut seen_files = HashSet::new();
    let mut budget = cache::READ_MAX;
    for (i, dir) in dirs.into_iter().enumerate() {
        let project = is_project_dir(i, &dir, project_dir);
        let fd = match open_search_dir(project_dir, &dir) {
            Ok(Some(fd)) => fd,
            Ok(None) => continue,
            Err(e) => {
                found.unread(&dir, format!("cannot be opened: {e}"));
                continue;
            }
        };
        let walked = walk::walk(fd.as_fd(), &dir);
        found.notes.extend(walked.notes);
        for (path, e) in walked.errors {
            found
                .errors
                .push(DefinitionError::unreadable(&path, e.to_string()));
        }
        for f in walked.files {
            let (file, id) = match walk::open(fd.as_fd(), &dir, &f) {
                Ok(opened) => opened,
                Err(e) => {
                    let e = DefinitionError::unreadable(&f.path, e.to_string());
                    found.errors.push(e);
                    continue;
                }
            };
            // A file reached twice (a link, a hard link) counts once.
            if !seen_files.insert((id.dev, id.ino)) {
                continue;
            }
            let src = cache::Source {
                path: f.path,
                file,
                size: id.size,
            };
            match cache::parsed(src, tools, &mut budget) {
                (Ok((d, t)), fresh) => {
                    let mut a = agent(d, t, fresh, max_body_chars);
                    a.project = project;
                    if project {
                        warn_project_network(&mut a);
                        warn_project_driver(&mut a);
                    }
                    found.add(a);
                }
                (Err(e), _) => found.errors.push(e),
            }
        }
        if walked.incomplete {
            found.unread(&dir, "some of its folders cannot be read".into());
        }
    }
    found
}

impl Found {
    /// A search folder not read whole: said, and the names found after it
    /// blocked.
    fn unread(&mut self, dir: &Path, why: String) {
        self.notes.push(format!("{}: {why}", dir.display()));
        if self.blocked_by.is_none() {
            self.blocked_by = Some((dir.to_path_buf(), why));
        }
    }

    fn add(&mut self, a: Agent) {
        match self.get(&a.definition.name) {
            Some(first) => self.duplicates.push(Duplicate {
                name: a.definition.name.clone(),
                winner: first.definition.source.clone(),
                shadowed: a.definition.source,
                over_user: first.project && !a.project,
            }),
            None => {
                if let Some((dir, why)) = &self.blocked_by {
                    let mut e = DefinitionError::unreadable(
                        dir,
                        format!(
                            "{why}; a definition of this name there would come before {}",
                            a.definition.source.display()
                        ),
                    );
                    e.name = Some(a.definition.name.clone());
                    self.errors.push(e);
                }
                self.agents.push(a);
            }
        }
    }
}

fn agent(d: Definition, resolved: AgentTools, fresh: bool, max_body_chars: usize) -> Agent {
    let mut warnings = d.warnings.clone();
    warnings.extend(resolved.warning.clone());
    let chars = d.body.chars().count();
    if chars > max_body_chars {
        warnings.push(format!(
            "{}: the body is {chars} characters, over the per-layer cap of {max_body_chars}; it is given whole",
            d.source.display()
        ));
    }
    Agent {
        definition: d,
        tools: resolved,
        warnings,
        fresh,
        project: false,
    }
}

/// What a project definition's `network_allow` gets, said where it is
/// listed.
pub const PROJECT_NETWORK: &str = "network_allow is ignored unless the session's audience has a network_allow cap in the config, and must fall within it then: a child may have written this folder";

/// What a project definition's `driver` gets, said where it is listed.
pub const PROJECT_DRIVER: &str = "driver is ignored in a project folder (a driver adds its model endpoint to the run's allowlist, and a child may have written this folder): name the driver in the request or the config";

fn warn_project_driver(a: &mut Agent) {
    let d = &a.definition;
    if d.driver
        .is_none_or(|d| d == policy::driver::Driver::Command)
    {
        return;
    }
    let line = d.lines.get("driver").copied().unwrap_or(1);
    let source = d.source.display();
    a.warnings
        .push(format!("{source}:{line}: {PROJECT_DRIVER}"));
}

fn warn_project_network(a: &mut Agent) {
    let d = &a.definition;
    if d.network_allow.is_empty() {
        return;
    }
    let line = d.lines.get("network_allow").copied().unwrap_or(1);
    let source = d.source.display();
    a.warnings
        .push(format!("{source}:{line}: {PROJECT_NETWORK}"));
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_user_level_folder_inside_the_project_is_the_projects() {
        let home = tempfile::tempdir().unwrap();
        let project = home.path().canonicalize().unwrap();
        let user = project.join(".config/subagentd/agents");
        std::fs::create_dir_all(&user).unwrap();
        let text = "---\nname: planted\ndescription: d\ndriver: claude-code\nnetwork_allow: [\"evil.example:443\"]\n---\nBody.\n";
        std::fs::write(user.join("planted.md"), text).unwrap();
        let outside = tempfile::tempdir().unwrap();
        let dirs = vec![
            project.join(".subagents"),
            project.join(".claude/agents"),
            user,
            outside.path().join("agents"),
        ];
        let found = discover_in(&project, dirs, &ToolPolicy::builtin(), 10_000);
        let a = found.get("planted").unwrap();
        assert!(a.project, "a folder inside the project is child-writable");
        assert!(!is_project_dir(3, &outside.path().join("agents"), &project));
        let link = outside.path().join("link");
        std::os::unix::fs::symlink(&project, &link).unwrap();
        assert!(is_project_dir(3, &link.join("x/agents"), &project));
    }
}
