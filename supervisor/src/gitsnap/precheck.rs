//! A repository a child may have written, checked before libgit2 opens
//! it (libgit2 follows symlinks and blocks on FIFOs in `open(2)`, and its
//! config errors can quote a line of the file they read): the `.git` found
//! from the work tree up, the files libgit2 reads first (HEAD, the
//! configs, the index, packed refs, the ref HEAD names, the ignore and
//! attribute files) must be regular files or absent and the directories
//! real directories, never symlinks; a `.git` file is followed only to a
//! git dir that links back to it (a worktree's) or to a submodule's under
//! an enclosing repository; the common dir must enclose the git dir; a
//! config that includes other files is refused. Only metadata and small
//! reads through [`subagent_runner::safefile`]: nothing here blocks.
//!
//! A file swapped after this check can still block libgit2: that is what
//! [`super::guard`] bounds.

use std::fs::Metadata;
use std::os::unix::fs::FileTypeExt;
use std::path::{Component, Path, PathBuf};
use subagent_runner::safefile::{self, SafeFileError};

/// The bound of HEAD, a `.git` file, `commondir` and `gitdir`.
const SMALL: u64 = 4096;
/// The bound of a config file.
const CONFIG_MAX: u64 = 1 << 20;

/// The repository found for a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The work tree: the directory holding `.git` (canonical).
    pub root: PathBuf,
    /// The git dir.
    pub git_dir: PathBuf,
    /// The common dir (the git dir but for a linked worktree).
    pub common_dir: PathBuf,
}

/// Why a repository is not opened.
#[derive(Debug, thiserror::Error)]
pub enum PrecheckError {
    /// No `.git` from the directory up.
    #[error("not a git repository")]
    NotARepository,
    /// `.git` is neither a directory nor a regular file.
    #[error("{path} is {kind}, neither a directory nor a regular file")]
    DotGit {
        /// The `.git` entry.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// A file libgit2 reads is not a regular file.
    #[error("{path} is {kind}, not a regular file")]
    NotRegular {
        /// The file.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// A directory libgit2 reads is not a directory.
    #[error("{path} is {kind}, not a directory")]
    NotADirectory {
        /// The directory.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// A file the repository needs is missing.
    #[error("{0} is missing")]
    Missing(PathBuf),
    /// A small file could not be read safely.
    #[error(transparent)]
    Read(#[from] SafeFileError),
    /// A `.git` file or `commondir` points where it may not.
    #[error("{path} names {target}, {why}")]
    Redirect {
        /// The file.
        path: PathBuf,
        /// What it names.
        target: PathBuf,
        /// Why that is refused.
        why: &'static str,
    },
    /// A config includes other files.
    #[error("{0} includes other files ([include] or [includeIf]), which are not followed")]
    Includes(PathBuf),
    /// A file holds what git does not write there.
    #[error("{path}: {what}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: &'static str,
    },
    /// Another failure of `lstat`.
    #[error("stat {path}: {source}")]
    Stat {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// What an `lstat` found.
fn lstat(path: &Path) -> Result<Option<Metadata>, PrecheckError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) => Ok(Some(m)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(PrecheckError::Stat {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn kind(m: &Metadata) -> &'static str {
    let t = m.file_type();
    if t.is_symlink() {
        "a symbolic link"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_file() {
        "a regular file"
    } else {
        "a device"
    }
}

/// `path` is a regular file (`required`) or absent.
fn file(path: &Path, required: bool) -> Result<bool, PrecheckError> {
    match lstat(path)? {
        Some(m) if m.file_type().is_file() => Ok(true),
        Some(m) => Err(PrecheckError::NotRegular {
            path: path.to_path_buf(),
            kind: kind(&m),
        }),
        None if required => Err(PrecheckError::Missing(path.to_path_buf())),
        None => Ok(false),
    }
}

/// `path` is a directory (`required`) or absent.
fn dir(path: &Path, required: bool) -> Result<bool, PrecheckError> {
    match lstat(path)? {
        Some(m) if m.file_type().is_dir() => Ok(true),
        Some(m) => Err(PrecheckError::NotADirectory {
            path: path.to_path_buf(),
            kind: kind(&m),
        }),
        None if required => Err(PrecheckError::Missing(path.to_path_buf())),
        None => Ok(false),
    }
}

/// The text of a small file (a regular file, read without following a
/// link), trimmed.
fn small(path: &Path) -> Result<String, PrecheckError> {
    let bytes = safefile::read(path, SMALL)?;
    let text = String::from_utf8(bytes).map_err(|_| PrecheckError::Malformed {
        path: path.to_path_buf(),
        what: "not UTF-8",
    })?;
    Ok(text.trim().to_owned())
}

/// `target` (relative to `base` unless absolute), canonical.
fn resolve(path: &Path, base: &Path, target: &str) -> Result<PathBuf, PrecheckError> {
    let t = base.join(target);
    t.canonicalize().map_err(|_| PrecheckError::Redirect {
        path: path.to_path_buf(),
        target: t,
        why: "which does not exist",
    })
}

/// The repository holding `dir`, checked (see the module doc).
pub fn check(dir: &Path) -> Result<Found, PrecheckError> {
    let start = dir
        .canonicalize()
        .map_err(|_| PrecheckError::NotARepository)?;
    let mut found = None;
    for a in start.ancestors() {
        let dotgit = a.join(".git");
        if let Some(m) = lstat(&dotgit)? {
            found = Some((a.to_path_buf(), dotgit, m));
            break;
        }
    }
    let (root, dotgit, m) = found.ok_or(PrecheckError::NotARepository)?;
    let git_dir = if m.file_type().is_dir() {
        dotgit
    } else if m.file_type().is_file() {
        linked_git_dir(&root, &dotgit)?
    } else {
        return Err(PrecheckError::DotGit {
            path: dotgit,
            kind: kind(&m),
        });
    };
    let common_dir = if file(&git_dir.join("commondir"), false)? {
        let path = git_dir.join("commondir");
        let common = resolve(&path, &git_dir, &small(&path)?)?;
        if !git_dir.starts_with(&common) {
            return Err(PrecheckError::Redirect {
                path,
                target: common,
                why: "which does not enclose the git dir",
            });
        }
        common
    } else {
        git_dir.clone()
    };
    check_files(&root, &git_dir, &common_dir)?;
    Ok(Found {
        root,
        git_dir,
        common_dir,
    })
}

/// The git dir a `.git` file names, when it links back (a worktree's
/// `gitdir` file names this `.git`) or is a submodule's under an
/// enclosing repository's `.git/modules`.
fn linked_git_dir(root: &Path, dotgit: &Path) -> Result<PathBuf, PrecheckError> {
    let text = small(dotgit)?;
    let named = text
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("gitdir:"))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| PrecheckError::Malformed {
            path: dotgit.to_path_buf(),
            what: "no `gitdir:` line",
        })?;
    let git_dir = resolve(dotgit, root, named)?;
    dir(&git_dir, true)?;
    let back = git_dir.join("gitdir");
    let links_back =
        file(&back, false)? && resolve(&back, &git_dir, &small(&back)?).is_ok_and(|b| b == dotgit);
    let submodule = root
        .ancestors()
        .skip(1)
        .any(|a| git_dir.starts_with(a.join(".git").join("modules")));
    if links_back || submodule {
        return Ok(git_dir);
    }
    Err(PrecheckError::Redirect {
        path: dotgit.to_path_buf(),
        target: git_dir,
        why: "which neither links back to it (as a worktree's does) nor is a submodule's",
    })
}

/// The files and directories libgit2 reads first.
fn check_files(root: &Path, git_dir: &Path, common_dir: &Path) -> Result<(), PrecheckError> {
    file(&git_dir.join("HEAD"), true)?;
    for f in ["index", "config.worktree"] {
        file(&git_dir.join(f), false)?;
    }
    for d in ["objects", "refs"] {
        dir(&common_dir.join(d), true)?;
    }
    for d in ["info", "objects/info"] {
        dir(&common_dir.join(d), false)?;
    }
    for f in [
        "config",
        "packed-refs",
        "shallow",
        "info/exclude",
        "info/attributes",
        "info/grafts",
        "objects/info/alternates",
    ] {
        file(&common_dir.join(f), false)?;
    }
    for f in [".gitignore", ".gitattributes"] {
        file(&root.join(f), false)?;
    }
    for config in [
        common_dir.join("config"),
        git_dir.join("config"),
        git_dir.join("config.worktree"),
    ] {
        if file(&config, false)? {
            let text = safefile::read(&config, CONFIG_MAX)?;
            if includes(&String::from_utf8_lossy(&text)) {
                return Err(PrecheckError::Includes(config));
            }
        }
    }
    head_ref(git_dir, common_dir)
}

/// The loose ref HEAD names, when it names one: each component a real
/// directory, the ref a regular file (or absent: packed or unborn).
fn head_ref(git_dir: &Path, common_dir: &Path) -> Result<(), PrecheckError> {
    let head = small(&git_dir.join("HEAD"))?;
    let Some(name) = head.strip_prefix("ref:").map(str::trim) else {
        return Ok(());
    };
    let rel = Path::new(name);
    let plain = rel.components().all(|c| matches!(c, Component::Normal(_)));
    if !name.starts_with("refs/") || !plain {
        // libgit2 refuses such a name itself.
        return Ok(());
    }
    let mut at = common_dir.to_path_buf();
    let parts: Vec<_> = rel.components().collect();
    for (i, c) in parts.iter().enumerate() {
        at.push(c);
        let present = if i + 1 == parts.len() {
            file(&at, false)?
        } else {
            dir(&at, false)?
        };
        if !present {
            return Ok(());
        }
    }
    Ok(())
}

/// Whether a git config has an `[include]` or `[includeIf ...]` section.
pub fn includes(config: &str) -> bool {
    config.lines().any(|l| {
        let Some(rest) = l.trim_start().strip_prefix('[') else {
            return false;
        };
        let name: String = rest
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        name.eq_ignore_ascii_case("include") || name.eq_ignore_ascii_case("includeif")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git(dir: &Path, args: &[&str]) {
        let out = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(["-c", "init.defaultBranch=main"])
            .args(args)
            .current_dir(dir)
            .env_remove("GIT_DIR")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn repo() -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().canonicalize().unwrap();
        git(&p, &["init", "-q"]);
        std::fs::write(p.join("a"), "a").unwrap();
        git(&p, &["add", "."]);
        git(&p, &["commit", "-qm", "one"]);
        (d, p)
    }

    fn err(p: &Path) -> String {
        check(p).unwrap_err().to_string()
    }

    #[test]
    fn a_plain_repository_and_its_subdirectories_pass() {
        let (_d, p) = repo();
        std::fs::create_dir(p.join("sub")).unwrap();
        let f = check(&p.join("sub")).unwrap();
        assert_eq!(f.root, p);
        assert_eq!(f.git_dir, p.join(".git"));
        assert_eq!(f.common_dir, p.join(".git"));
        let none = tempfile::tempdir().unwrap();
        assert!(matches!(
            check(none.path()),
            Err(PrecheckError::NotARepository)
        ));
    }

    #[test]
    fn fifos_and_links_in_dot_git_are_refused() {
        for (name, plant) in [
            ("HEAD", "fifo"),
            ("config", "fifo"),
            ("index", "fifo"),
            ("config", "link"),
            ("packed-refs", "link"),
            ("refs/heads/main", "fifo"),
            ("refs/heads", "link"),
            ("info/exclude", "fifo"),
        ] {
            let (_d, p) = repo();
            let path = p.join(".git").join(name);
            if path.is_dir() {
                std::fs::remove_dir_all(&path).unwrap();
            } else {
                let _ = std::fs::remove_file(&path);
            }
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            if plant == "fifo" {
                nix::unistd::mkfifo(&path, nix::sys::stat::Mode::S_IRWXU).unwrap();
            } else {
                std::os::unix::fs::symlink("/etc/shadow", &path).unwrap();
            }
            let e = err(&p);
            assert!(e.contains(name), "{name}: {e}");
            assert!(
                e.contains(if plant == "fifo" {
                    "a FIFO"
                } else {
                    "a symbolic link"
                }),
                "{name}: {e}"
            );
        }
        let (_d, p) = repo();
        std::fs::rename(p.join(".git"), p.join("real-git")).unwrap();
        std::os::unix::fs::symlink(p.join("real-git"), p.join(".git")).unwrap();
        assert!(err(&p).contains("neither a directory nor a regular file"));
    }

    #[test]
    fn git_files_must_link_back_or_be_submodules() {
        let (_d, p) = repo();
        let wt_parent = tempfile::tempdir().unwrap();
        let wt = wt_parent.path().canonicalize().unwrap().join("wt");
        git(
            &p,
            &["worktree", "add", "-q", "-b", "f", wt.to_str().unwrap()],
        );
        let f = check(&wt).unwrap();
        assert_eq!(f.root, wt);
        assert_eq!(f.common_dir, p.join(".git"));
        // Another checkout's .git file pointed at someone else's git dir.
        let (_v, vault) = repo();
        std::fs::write(
            wt.join(".git"),
            format!("gitdir: {}\n", vault.join(".git").display()),
        )
        .unwrap();
        assert!(err(&wt).contains("neither links back"), "{}", err(&wt));
        // A git dir whose commondir leads elsewhere.
        let (_o, other) = repo();
        std::fs::write(
            other.join(".git/commondir"),
            format!("{}\n", vault.join(".git").display()),
        )
        .unwrap();
        assert!(err(&other).contains("does not enclose"), "{}", err(&other));
    }

    #[test]
    fn configs_that_include_other_files_are_refused() {
        assert!(includes(
            "[core]\n\tbare = false\n[include]\n\tpath = /etc/x\n"
        ));
        assert!(includes("  [ IncludeIf \"gitdir:/x/\"]\npath = y\n"));
        assert!(!includes("[core]\n\tx = [include]\n[includes]\n"));
        let (_d, p) = repo();
        let mut cfg = std::fs::read_to_string(p.join(".git/config")).unwrap();
        cfg.push_str("[include]\n\tpath = /root/secret\n");
        std::fs::write(p.join(".git/config"), cfg).unwrap();
        assert!(err(&p).contains("includes other files"), "{}", err(&p));
    }
}
