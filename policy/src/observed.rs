//! What a run changed in its project, as the supervisor sees it: a picture
//! of the project taken when the run is accepted, another when it ends,
//! and the difference (created, modified, deleted). Pure: the caller takes
//! the pictures from disk (libgit2's status in a repository, a bounded
//! scan otherwise).
//!
//! A picture of a repository lists only the paths git reports as changed
//! or untracked (ignored files never show); a path missing from the first
//! picture was then clean, or absent. A scan lists every file. Either way
//! the second picture also holds every path of the first, looked up again.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A picture holds at most this many paths; a larger project (or one with
/// more changes, in a repository) is not observed.
pub const MAX_PATHS: usize = 10_000;
/// Each list of the report shows at most this many paths.
pub const MAX_LISTED: usize = 100;

/// The facts of one file that change when it is written: its ctime is
/// set by the kernel on every change and cannot be set back by the child.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    /// Inode number (a replaced file gets another).
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Status-change time, ns since the epoch.
    pub ctime_ns: i64,
    /// Modification time, ns since the epoch.
    pub mtime_ns: i64,
    /// The file type and mode bits.
    pub mode: u32,
}

/// One path of a picture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seen {
    /// Its stamp, `None` when nothing is at the path.
    pub stamp: Option<Stamp>,
    /// Git reports it untracked or newly added (a scan: always false).
    #[serde(default)]
    pub new_to_git: bool,
}

/// What git's index recorded of a file when it last looked at it, as
/// the index holds it (32 bits each; seconds and nanoseconds apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexStat {
    pub size: u32,
    pub ino: u32,
    pub mtime: (i32, u32),
    pub ctime: (i32, u32),
}

/// Whether the file `now` at a path git is told to leave alone
/// (assume-unchanged, skip-worktree) may differ from its index entry:
/// gone, or its size, times or inode not those recorded. Nothing on disk
/// for a skip-worktree entry is a sparse checkout's: no change.
pub fn differs_from_index(now: Option<&Stamp>, recorded: &IndexStat, skip_worktree: bool) -> bool {
    let Some(st) = now else {
        return !skip_worktree;
    };
    // The index keeps the low 32 bits, as git does.
    let split = |ns: i64| {
        (
            ns.div_euclid(1_000_000_000) as i32,
            ns.rem_euclid(1_000_000_000) as u32,
        )
    };
    st.size as u32 != recorded.size
        || st.ino as u32 != recorded.ino
        || split(st.mtime_ns) != recorded.mtime
        || split(st.ctime_ns) != recorded.ctime
}

/// How a picture was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// libgit2's status of the repository (ignored files left out).
    GitStatus,
    /// Every file under the project, without following links.
    Scan,
}

/// The paths of a project at one moment, relative to its root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Picture {
    /// How it was taken.
    pub source: Source,
    /// Path (relative, `/`-separated) → what was there.
    pub paths: BTreeMap<String, Seen>,
    /// A repository's HEAD commit when it was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<String>,
}

/// What changed between two pictures.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Paths that now hold a file and did not before.
    pub created: Vec<String>,
    /// Paths whose file changed (content, size, mode or identity).
    pub modified: Vec<String>,
    /// Paths that held a file and no longer do.
    pub deleted: Vec<String>,
}

impl Changes {
    /// Created and modified paths, the most recently changed first (by
    /// ctime in `after`): the order they merge into recent files.
    pub fn written_newest_first(&self, after: &Picture) -> Vec<String> {
        let ctime = |p: &String| {
            after
                .paths
                .get(p)
                .and_then(|s| s.stamp)
                .map_or(i64::MIN, |s| s.ctime_ns)
        };
        let mut out: Vec<String> = self.created.iter().chain(&self.modified).cloned().collect();
        out.sort_by(|a, b| ctime(b).cmp(&ctime(a)).then_with(|| a.cmp(b)));
        out
    }
}

/// The difference between `before` and `after` (which must hold every
/// path of `before`; one it lacks counts as gone).
pub fn diff(before: &Picture, after: &Picture) -> Changes {
    let mut c = Changes::default();
    for (path, now) in &after.paths {
        let then = before.paths.get(path);
        match (then.and_then(|s| s.stamp), now.stamp) {
            (Some(a), Some(b)) if a != b => c.modified.push(path.clone()),
            (Some(_), Some(_)) => {}
            (Some(_), None) => c.deleted.push(path.clone()),
            (None, Some(_)) => {
                // Absent from a repository's first picture: it was clean,
                // unless git calls it new now.
                let was_clean = then.is_none() && before.source == Source::GitStatus;
                if was_clean && !now.new_to_git {
                    c.modified.push(path.clone());
                } else {
                    c.created.push(path.clone());
                }
            }
            (None, None) => {
                // A clean tracked file deleted shows only in the second.
                if then.is_none() && before.source == Source::GitStatus {
                    c.deleted.push(path.clone());
                }
            }
        }
    }
    for (path, then) in &before.paths {
        if then.stamp.is_some() && !after.paths.contains_key(path) {
            c.deleted.push(path.clone());
        }
    }
    c.deleted.sort();
    c
}

/// What the supervisor observed of a run, as recorded and shown.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObservedReport {
    /// How the pictures were taken (`git_status` or `scan`), when they were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<Source>,
    /// Files the run created (at most [`MAX_LISTED`]).
    #[serde(default)]
    pub created: Vec<String>,
    /// Files the run changed.
    #[serde(default)]
    pub modified: Vec<String>,
    /// Files the run deleted.
    #[serde(default)]
    pub deleted: Vec<String>,
    /// Changed paths beyond the lists' bound.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub not_listed: usize,
    /// Absolute paths merged into the session's recent files.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub merged: Vec<std::path::PathBuf>,
    /// Why nothing was observed, or what limits what was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl ObservedReport {
    /// A report of nothing observed, and why.
    pub fn none(why: impl Into<String>) -> ObservedReport {
        ObservedReport {
            note: Some(why.into()),
            ..Default::default()
        }
    }

    /// The report of `changes`, each list cut to [`MAX_LISTED`].
    pub fn of(source: Source, changes: &Changes) -> ObservedReport {
        let mut not_listed = 0;
        let mut cut = |v: &[String]| {
            not_listed += v.len().saturating_sub(MAX_LISTED);
            v.iter().take(MAX_LISTED).cloned().collect::<Vec<_>>()
        };
        let created = cut(&changes.created);
        let modified = cut(&changes.modified);
        let deleted = cut(&changes.deleted);
        ObservedReport {
            source: Some(source),
            created,
            modified,
            deleted,
            not_listed,
            merged: Vec::new(),
            note: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flagged_entry_differs_when_any_recorded_fact_does() {
        let st = Stamp {
            ino: (7 << 32) | 5,
            size: (1 << 32) | 10,
            ctime_ns: 3_000_000_004,
            mtime_ns: 1_000_000_002,
            mode: 0o100644,
        };
        let rec = IndexStat {
            size: 10,
            ino: 5,
            mtime: (1, 2),
            ctime: (3, 4),
        };
        assert!(!differs_from_index(Some(&st), &rec, false));
        for changed in [
            IndexStat { size: 11, ..rec },
            IndexStat { ino: 6, ..rec },
            IndexStat {
                mtime: (1, 3),
                ..rec
            },
            IndexStat {
                ctime: (2, 4),
                ..rec
            },
        ] {
            assert!(differs_from_index(Some(&st), &changed, true), "{changed:?}");
        }
        assert!(differs_from_index(None, &rec, false), "gone");
        assert!(!differs_from_index(None, &rec, true), "sparse");
    }

    fn stamp(ino: u64, ctime_ns: i64) -> Option<Stamp> {
        Some(Stamp {
            ino,
            size: 1,
            ctime_ns,
            mtime_ns: ctime_ns,
            mode: 0o100644,
        })
    }

    fn pic(source: Source, paths: &[(&str, Option<Stamp>, bool)]) -> Picture {
        Picture {
            source,
            head: None,
            paths: paths
                .iter()
                .map(|(p, stamp, new_to_git)| {
                    (
                        (*p).to_owned(),
                        Seen {
                            stamp: *stamp,
                            new_to_git: *new_to_git,
                        },
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn a_scan_tells_created_modified_and_deleted() {
        let before = pic(
            Source::Scan,
            &[
                ("same", stamp(1, 10), false),
                ("edited", stamp(2, 10), false),
                ("gone", stamp(3, 10), false),
            ],
        );
        let after = pic(
            Source::Scan,
            &[
                ("same", stamp(1, 10), false),
                ("edited", stamp(2, 20), false),
                ("new", stamp(4, 30), false),
            ],
        );
        let c = diff(&before, &after);
        assert_eq!(c.created, ["new"]);
        assert_eq!(c.modified, ["edited"]);
        assert_eq!(c.deleted, ["gone"]);
        assert_eq!(c.written_newest_first(&after), ["new", "edited"]);
    }

    #[test]
    fn a_replaced_file_with_the_same_times_is_modified() {
        let before = pic(Source::Scan, &[("f", stamp(1, 10), false)]);
        let after = pic(Source::Scan, &[("f", stamp(9, 10), false)]);
        assert_eq!(diff(&before, &after).modified, ["f"]);
    }

    #[test]
    fn in_a_repository_a_path_first_seen_changed_was_clean_or_is_new() {
        let before = pic(
            Source::GitStatus,
            &[
                ("dirty", stamp(1, 10), false),
                ("untracked", stamp(2, 10), true),
            ],
        );
        let after = pic(
            Source::GitStatus,
            &[
                ("dirty", stamp(1, 10), false),
                ("untracked", stamp(2, 10), true),
                ("was_clean", stamp(3, 20), false),
                ("brand_new", stamp(4, 20), true),
                ("clean_then_deleted", None, false),
            ],
        );
        let c = diff(&before, &after);
        assert_eq!(c.created, ["brand_new"]);
        assert_eq!(c.modified, ["was_clean"]);
        assert_eq!(c.deleted, ["clean_then_deleted"]);
    }

    #[test]
    fn a_file_deleted_before_and_made_again_is_created() {
        let before = pic(Source::GitStatus, &[("f", None, false)]);
        let after = pic(Source::GitStatus, &[("f", stamp(1, 20), false)]);
        assert_eq!(diff(&before, &after).created, ["f"]);
        let still = pic(Source::GitStatus, &[("f", None, false)]);
        assert_eq!(diff(&before, &still), Changes::default());
    }

    #[test]
    fn the_report_lists_a_bounded_number() {
        let changes = Changes {
            created: (0..MAX_LISTED + 5).map(|i| format!("f{i}")).collect(),
            modified: vec!["m".into()],
            deleted: Vec::new(),
        };
        let r = ObservedReport::of(Source::Scan, &changes);
        assert_eq!(r.created.len(), MAX_LISTED);
        assert_eq!(r.modified, ["m"]);
        assert_eq!(r.not_listed, 5);
    }
}
