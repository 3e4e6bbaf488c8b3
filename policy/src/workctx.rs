//! The working context of a parent session: its project dir, its recent
//! files (most recent first, no duplicates, at most 10), the git snapshot,
//! the `[working-context]` block, and the rules for merging a child's
//! delta back. Pure: the caller gathers the facts from disk.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// At most this many recent files are kept.
pub const RECENT_CAP: usize = 10;
/// A delta file larger than this is malformed.
pub const DELTA_MAX_BYTES: usize = 1 << 20;
/// A delta with more entries than this is malformed.
pub const DELTA_MAX_ENTRIES: usize = 10_000;

/// A git snapshot taken at spawn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum GitSnapshot {
    /// The repository's state.
    Available {
        /// The work tree's root.
        worktree: PathBuf,
        /// The common git dir (shared by linked worktrees).
        common_dir: PathBuf,
        /// The branch, or `(detached)`.
        branch: String,
        /// HEAD's commit, abbreviated (`(none)` before the first commit).
        head: String,
        /// The upstream branch, when the branch tracks one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        upstream: Option<String>,
        /// Commits ahead of the upstream.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ahead: Option<usize>,
        /// Commits behind the upstream.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        behind: Option<usize>,
        /// Files with staged changes.
        staged: usize,
        /// Files modified in the work tree.
        modified: usize,
        /// Untracked files.
        untracked: usize,
    },
    /// No snapshot, and why.
    Unavailable {
        /// e.g. "not a git repository", "timed out after 2 s".
        reason: String,
    },
}

/// Puts `files` at the front of `recent` in their order, without
/// duplicates, keeping at most [`RECENT_CAP`].
pub fn touch(recent: &[PathBuf], files: &[PathBuf]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::with_capacity(RECENT_CAP);
    for f in files.iter().chain(recent) {
        if out.len() == RECENT_CAP {
            break;
        }
        if !out.contains(f) {
            out.push(f.clone());
        }
    }
    out
}

/// The git line of the block.
pub fn git_line(git: &GitSnapshot) -> String {
    // A repository a child may write names its branches; one line each.
    crate::visible::one_line(&git_text(git))
}

fn git_text(git: &GitSnapshot) -> String {
    match git {
        GitSnapshot::Unavailable { reason } => format!("git: unavailable ({reason})"),
        GitSnapshot::Available {
            worktree,
            common_dir,
            branch,
            head,
            upstream,
            ahead,
            behind,
            staged,
            modified,
            untracked,
        } => {
            let mut s = format!(
                "git: worktree={} common_dir={} branch={branch} head={head}",
                worktree.display(),
                common_dir.display()
            );
            if let Some(u) = upstream {
                s.push_str(&format!(
                    " upstream={u} ahead={} behind={}",
                    ahead.unwrap_or(0),
                    behind.unwrap_or(0)
                ));
            }
            s.push_str(&format!(
                " staged={staged} modified={modified} untracked={untracked}"
            ));
            s
        }
    }
}

/// The `[working-context]` block.
pub fn render_block(project_dir: &Path, recent: &[PathBuf], git: &GitSnapshot) -> String {
    // Paths can hold any byte but `/` and NUL, and may come from a child:
    // each is shown on its one line.
    let show = |p: &Path| crate::visible::one_line(&p.to_string_lossy());
    let mut s = format!("[working-context]\nproject_dir: {}\n", show(project_dir));
    if recent.is_empty() {
        s.push_str("recent_files: (none)\n");
    } else {
        s.push_str("recent_files:\n");
        for f in recent {
            s.push_str(&format!("- {}\n", show(f)));
        }
    }
    s.push_str(&git_line(git));
    s.push('\n');
    s
}

/// The delta a child writes at SUBAGENT_DELTA_PATH.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Delta {
    /// Files it created, most recent first.
    #[serde(default)]
    pub written: Vec<String>,
    /// Files it changed, most recent first.
    #[serde(default)]
    pub edited: Vec<String>,
    /// Files it only read (never merged).
    #[serde(default)]
    pub read: Vec<String>,
}

/// Why a delta is malformed (and nothing of it is merged).
#[derive(Debug, thiserror::Error)]
pub enum DeltaError {
    /// Over [`DELTA_MAX_BYTES`].
    #[error("delta is {len} bytes, over the limit of {DELTA_MAX_BYTES}")]
    TooLarge {
        /// Its size.
        len: usize,
    },
    /// Not text.
    #[error("delta is not UTF-8")]
    NotUtf8,
    /// Not the expected JSON.
    #[error("delta is not valid: {0}")]
    Invalid(#[source] serde_json::Error),
    /// Over [`DELTA_MAX_ENTRIES`].
    #[error("delta has {entries} entries, over the limit of {DELTA_MAX_ENTRIES}")]
    TooManyEntries {
        /// How many it lists.
        entries: usize,
    },
}

/// Parses delta.json; the error says why nothing is merged.
pub fn parse_delta(bytes: &[u8]) -> Result<Delta, DeltaError> {
    if bytes.len() > DELTA_MAX_BYTES {
        return Err(DeltaError::TooLarge { len: bytes.len() });
    }
    let text = std::str::from_utf8(bytes).map_err(|_| DeltaError::NotUtf8)?;
    let d: Delta = serde_json::from_str(text).map_err(DeltaError::Invalid)?;
    let entries = d.written.len() + d.edited.len() + d.read.len();
    if entries > DELTA_MAX_ENTRIES {
        return Err(DeltaError::TooManyEntries { entries });
    }
    Ok(d)
}

/// What the supervisor found on disk for one claimed path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileFacts {
    /// The path as claimed.
    pub claimed: String,
    /// The path after resolving `..` and symlinks, when it resolves.
    pub resolved: Option<PathBuf>,
    /// It is a regular file.
    pub regular: bool,
    /// Its modification time, in ms since the epoch.
    pub mtime_ms: Option<u64>,
}

/// A claimed path and what became of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// The path as claimed.
    pub path: String,
    /// Accepted: the resolved path merged; rejected: why.
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// Accepted or rejected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Merged as this absolute path.
    Accepted(PathBuf),
    /// Not merged, and why.
    Rejected(String),
}

/// Judges one claim: the resolved path lies inside one of `roots`, is a
/// regular file, and was modified at or after `since_ms` (the run's start,
/// floored to the second for file systems with coarse timestamps).
pub fn judge(facts: &FileFacts, roots: &[PathBuf], since_ms: u64) -> Verdict {
    let reject = |why: &str| Verdict {
        path: facts.claimed.clone(),
        outcome: Outcome::Rejected(why.to_owned()),
    };
    let Some(resolved) = &facts.resolved else {
        return reject("does not exist");
    };
    if !roots.iter().any(|r| resolved.starts_with(r)) {
        return reject("outside the project");
    }
    if !facts.regular {
        return reject("not a regular file");
    }
    let floor = since_ms - since_ms % 1000;
    match facts.mtime_ms {
        Some(m) if m >= floor => Verdict {
            path: facts.claimed.clone(),
            outcome: Outcome::Accepted(resolved.clone()),
        },
        _ => reject("not modified during the run"),
    }
}

/// The claims to verify, in merge order: written then edited, each most
/// recent first, without repeats. Read paths never merge.
pub fn claims(d: &Delta) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for p in d.written.iter().chain(&d.edited) {
        if !out.contains(p) {
            out.push(p.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    #[test]
    fn touch_puts_files_first_dedups_and_caps() {
        let recent: Vec<PathBuf> = (0..10).map(|i| p(&format!("/r{i}"))).collect();
        let out = touch(&recent, &[p("/new"), p("/r5"), p("/new")]);
        assert_eq!(out.len(), 10);
        assert_eq!(out[0], p("/new"));
        assert_eq!(out[1], p("/r5"));
        assert_eq!(out[2], p("/r0"));
        assert!(!out.contains(&p("/r9")), "the oldest fell off");
    }

    #[test]
    fn the_block_shows_upstream_only_when_tracked() {
        let mut g = GitSnapshot::Available {
            worktree: p("/w"),
            common_dir: p("/w/.git"),
            branch: "main".into(),
            head: "abc1234".into(),
            upstream: None,
            ahead: None,
            behind: None,
            staged: 1,
            modified: 2,
            untracked: 3,
        };
        assert_eq!(
            git_line(&g),
            "git: worktree=/w common_dir=/w/.git branch=main head=abc1234 staged=1 modified=2 untracked=3"
        );
        if let GitSnapshot::Available {
            upstream,
            ahead,
            behind,
            ..
        } = &mut g
        {
            *upstream = Some("origin/main".into());
            *ahead = Some(2);
            *behind = Some(0);
        }
        assert!(git_line(&g).contains(" upstream=origin/main ahead=2 behind=0 "));
        let block = render_block(
            &p("/w"),
            &[p("/w/a.rs")],
            &GitSnapshot::Unavailable {
                reason: "not a git repository".into(),
            },
        );
        assert_eq!(block, "[working-context]\nproject_dir: /w\nrecent_files:\n- /w/a.rs\ngit: unavailable (not a git repository)\n");
    }

    #[test]
    fn malformed_deltas_say_why() {
        let why = |bytes: &[u8]| parse_delta(bytes).unwrap_err().to_string();
        assert!(why(b"not json").starts_with("delta is not valid: "));
        assert!(parse_delta(br#"{"written": [1]}"#).is_err());
        assert!(parse_delta(br#"{"written": "a"}"#).is_err());
        assert_eq!(why(&[0xff, 0xfe]), "delta is not UTF-8");
        assert_eq!(
            why(&vec![b' '; DELTA_MAX_BYTES + 1]),
            format!(
                "delta is {} bytes, over the limit of {DELTA_MAX_BYTES}",
                DELTA_MAX_BYTES + 1
            )
        );
        let many = format!(
            "{{\"read\": [{}]}}",
            vec!["\"a\""; DELTA_MAX_ENTRIES + 1].join(",")
        );
        assert_eq!(
            why(many.as_bytes()),
            format!(
                "delta has {} entries, over the limit of {DELTA_MAX_ENTRIES}",
                DELTA_MAX_ENTRIES + 1
            )
        );
        let d = parse_delta(br#"{"written": ["a", "b"], "edited": ["b", "c"], "read": ["r"]}"#)
            .unwrap();
        assert_eq!(claims(&d), ["a", "b", "c"]);
    }

    #[test]
    fn claims_are_judged_on_the_facts() {
        let roots = [p("/w")];
        let f = |resolved: Option<&str>, regular, mtime| FileFacts {
            claimed: "x".into(),
            resolved: resolved.map(p),
            regular,
            mtime_ms: mtime,
        };
        let since = 10_500;
        assert_eq!(
            judge(&f(Some("/w/a"), true, Some(10_000)), &roots, since).outcome,
            Outcome::Accepted(p("/w/a")),
            "same second counts"
        );
        assert_eq!(
            judge(&f(Some("/w/a"), true, Some(9_999)), &roots, since).outcome,
            Outcome::Rejected("not modified during the run".into())
        );
        assert_eq!(
            judge(&f(Some("/etc/passwd"), true, Some(20_000)), &roots, since).outcome,
            Outcome::Rejected("outside the project".into())
        );
        assert_eq!(
            judge(&f(None, false, None), &roots, since).outcome,
            Outcome::Rejected("does not exist".into())
        );
        assert_eq!(
            judge(&f(Some("/w/d"), false, Some(20_000)), &roots, since).outcome,
            Outcome::Rejected("not a regular file".into())
        );
    }
}
