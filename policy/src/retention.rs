//! Retention: which finished runs a prune removes, and which it keeps
//! although a limit wanted them, with the reason for each. Pure: the
//! daemon gathers the candidates (its ended, finalized, not yet pruned
//! runs) and applies the plan; this module only decides.
//!
//! Never removed: the newest run of each session; a run whose worktree
//! still exists; a run whose notice is not taken yet, until `max_age`.
//! The limits apply in a fixed order, oldest first within each: age, the
//! count overall, the count per session, then the folders' bytes. A count
//! keeps the newest runs and the protected ones older than them; bytes
//! are freed from the oldest unprotected runs on.

use crate::rights::{may_act_on, Requester};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

/// The limits of `[retention]`; `None` turns one off.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// A run ended longer ago than this is removed.
    pub max_age: Option<Duration>,
    /// At most this many finished runs are kept overall.
    pub max_runs: Option<u64>,
    /// At most this many finished runs are kept per session.
    pub max_runs_per_session: Option<u64>,
    /// The finished runs' folders together hold at most this many bytes.
    pub max_bytes: Option<u64>,
}

/// What an on-demand prune narrows to: it never removes a run outside
/// the filter, and it may remove more within it (`older_than`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only this session's runs.
    pub session: Option<String>,
    /// Also every run that ended at least this long ago (`on_demand`).
    pub older_than: Option<Duration>,
    /// Who asks: `None` for the daemon's uid and root (every run), else
    /// only runs this uid may act on.
    pub requester: Option<Requester>,
}

impl Filter {
    fn admits(&self, c: &Candidate) -> bool {
        self.session.as_ref().is_none_or(|s| *s == c.session_id)
            && may_act_on(self.requester.as_ref(), c.owner_uid)
    }
}

/// A finished run that a prune may remove.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Its id.
    pub run_id: String,
    /// Its session.
    pub session_id: String,
    /// Whose it is.
    pub owner_uid: u32,
    /// When it ended (ms since the epoch).
    pub ended_at_ms: u64,
    /// Its run folder's size.
    pub dir_bytes: u64,
    /// Its notice has not been taken yet.
    pub notice_pending: bool,
    /// Its worktree's directory, when that still exists (the daemon looks).
    pub worktree: Option<PathBuf>,
}

/// Why a run is removed: the first rule that chose it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// It ended longer ago than `max_age`.
    MaxAge,
    /// More finished runs than `max_runs`.
    MaxRuns,
    /// More finished runs in its session than `max_runs_per_session`.
    MaxRunsPerSession,
    /// The folders hold more than `max_bytes`.
    MaxBytes,
    /// An on-demand prune's `older_than`.
    OnDemand,
}

impl Reason {
    /// The word on the wire and in the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::MaxAge => "max_age",
            Reason::MaxRuns => "max_runs",
            Reason::MaxRunsPerSession => "max_runs_per_session",
            Reason::MaxBytes => "max_bytes",
            Reason::OnDemand => "on_demand",
        }
    }

    /// The reason a word names.
    pub fn parse(s: &str) -> Option<Reason> {
        [
            Reason::MaxAge,
            Reason::MaxRuns,
            Reason::MaxRunsPerSession,
            Reason::MaxBytes,
            Reason::OnDemand,
        ]
        .into_iter()
        .find(|r| r.as_str() == s)
    }
}

/// Why a run a rule wanted is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    /// It is the newest finished run of its session.
    NewestOfSession,
    /// Its notice has not been taken (it is kept until `max_age`).
    NoticePending,
    /// Its worktree still exists.
    Worktree(PathBuf),
}

impl std::fmt::Display for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Kept::NewestOfSession => f.write_str("the newest run of its session"),
            Kept::NoticePending => f.write_str("its notice is not taken yet (kept until max_age)"),
            Kept::Worktree(dir) => write!(
                f,
                "worktree {} exists (subagent worktree rm)",
                dir.display()
            ),
        }
    }
}

/// What a prune does: the runs to remove and the runs kept that a rule
/// wanted, each oldest first (by end time, then id).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Each run to remove, with the rule that chose it.
    pub remove: Vec<(String, Reason)>,
    /// Each run kept although a rule wanted it, and why.
    pub keep: Vec<(String, Kept)>,
}

/// The state of one decision: the candidates oldest first, and what is
/// removed or kept so far.
struct Work<'a> {
    runs: Vec<&'a Candidate>,
    newest: BTreeSet<&'a str>,
    removed: BTreeMap<&'a str, Reason>,
    kept: BTreeMap<&'a str, Kept>,
}

impl<'a> Work<'a> {
    fn new(candidates: &'a [Candidate]) -> Work<'a> {
        let mut runs: Vec<&Candidate> = candidates.iter().collect();
        runs.sort_by(|a, b| age_key(a).cmp(&age_key(b)));
        runs.dedup_by(|a, b| a.run_id == b.run_id);
        let mut last: BTreeMap<&str, &str> = BTreeMap::new();
        for c in &runs {
            last.insert(&c.session_id, &c.run_id);
        }
        Work {
            runs,
            newest: last.into_values().collect(),
            removed: BTreeMap::new(),
            kept: BTreeMap::new(),
        }
    }

    /// What keeps `c` from a rule: the newest of its session and a live
    /// worktree always, a pending notice unless the rule is `max_age`.
    fn protection(&self, c: &Candidate, reason: Reason) -> Option<Kept> {
        if self.newest.contains(c.run_id.as_str()) {
            Some(Kept::NewestOfSession)
        } else if let Some(dir) = &c.worktree {
            Some(Kept::Worktree(dir.clone()))
        } else if c.notice_pending && reason != Reason::MaxAge {
            Some(Kept::NoticePending)
        } else {
            None
        }
    }

    /// Removes `c` for `reason` unless it is protected (then it is kept,
    /// with why). Returns whether it was removed.
    fn take(&mut self, c: &'a Candidate, reason: Reason) -> bool {
        match self.protection(c, reason) {
            Some(why) => {
                self.kept.entry(&c.run_id).or_insert(why);
                false
            }
            None => {
                self.removed.insert(&c.run_id, reason);
                true
            }
        }
    }

    /// The candidates not removed yet, oldest first.
    fn left(&self) -> Vec<&'a Candidate> {
        let removed = &self.removed;
        self.runs
            .iter()
            .copied()
            .filter(|c| !removed.contains_key(c.run_id.as_str()))
            .collect()
    }

    /// Every run that ended at least `age` before `now_ms`.
    fn by_age(&mut self, now_ms: u64, age: Duration, reason: Reason, only: &Filter) {
        let age_ms = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
        for c in self.left() {
            if now_ms.saturating_sub(c.ended_at_ms) >= age_ms && only.admits(c) {
                self.take(c, reason);
            }
        }
    }

    /// Every one of `runs` (oldest first) but the newest `max`: a
    /// protected one stays on top of them, and takes no newer one's place.
    fn by_count(&mut self, runs: Vec<&'a Candidate>, max: u64, reason: Reason) {
        let excess = (runs.len() as u64).saturating_sub(max);
        for c in runs
            .into_iter()
            .take(usize::try_from(excess).unwrap_or(usize::MAX))
        {
            self.take(c, reason);
        }
    }

    /// Oldest first until the folders left hold at most `max` bytes.
    fn by_bytes(&mut self, max: u64) {
        let left = self.left();
        let mut total: u64 = left
            .iter()
            .map(|c| c.dir_bytes)
            .fold(0, u64::saturating_add);
        for c in left {
            if total <= max {
                break;
            }
            if self.take(c, Reason::MaxBytes) {
                total -= c.dir_bytes;
            }
        }
    }

    fn by_limits(&mut self, now_ms: u64, limits: &Limits) {
        if let Some(age) = limits.max_age {
            self.by_age(now_ms, age, Reason::MaxAge, &Filter::default());
        }
        if let Some(max) = limits.max_runs {
            let left = self.left();
            self.by_count(left, max, Reason::MaxRuns);
        }
        if let Some(max) = limits.max_runs_per_session {
            let mut sessions: BTreeMap<&str, Vec<&Candidate>> = BTreeMap::new();
            for c in self.left() {
                sessions.entry(&c.session_id).or_default().push(c);
            }
            for runs in sessions.into_values() {
                self.by_count(runs, max, Reason::MaxRunsPerSession);
            }
        }
        if let Some(max) = limits.max_bytes {
            self.by_bytes(max);
        }
    }

    /// The decisions on runs `only` admits, oldest first.
    fn plan(self, only: &Filter) -> Plan {
        let mut plan = Plan::default();
        for c in self.runs.iter().filter(|c| only.admits(c)) {
            let id = c.run_id.as_str();
            if let Some(r) = self.removed.get(id) {
                plan.remove.push((id.to_owned(), *r));
            } else if let Some(k) = self.kept.get(id) {
                plan.keep.push((id.to_owned(), k.clone()));
            }
        }
        plan
    }
}

/// How long a pruned run's tombstone says "pruned" when `max_age` is off.
pub const TOMBSTONE_AGE: Duration = Duration::from_secs(30 * 86_400);

/// How many tombstones are kept at most when `max_runs` is off.
pub const TOMBSTONES: u64 = 20_000;

/// How long, and how many, tombstones of pruned runs are kept: beyond
/// either, the oldest (by the time they were pruned) are forgotten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tombstones {
    /// A tombstone pruned longer ago than this is forgotten.
    pub max_age: Duration,
    /// At most this many are kept.
    pub max_count: u64,
}

impl Limits {
    /// The bounds on tombstones: `max_age` after the prune, at most
    /// `max_runs` of them; a limit that is off gives its default bound
    /// ([`TOMBSTONE_AGE`], [`TOMBSTONES`]), so they never grow without one.
    pub fn tombstones(&self) -> Tombstones {
        Tombstones {
            max_age: self.max_age.unwrap_or(TOMBSTONE_AGE),
            max_count: self.max_runs.unwrap_or(TOMBSTONES),
        }
    }
}

fn age_key(c: &Candidate) -> (u64, &str) {
    (c.ended_at_ms, &c.run_id)
}

/// The plan for `candidates` at `now_ms`: what `limits` remove (decided
/// over every candidate, so that a filter only narrows it), then, within
/// `filter`, what its `older_than` removes; only runs the filter admits
/// are in the plan. A run listed twice counts once.
pub fn plan(now_ms: u64, limits: &Limits, filter: &Filter, candidates: &[Candidate]) -> Plan {
    let mut work = Work::new(candidates);
    work.by_limits(now_ms, limits);
    if let Some(age) = filter.older_than {
        work.by_age(now_ms, age, Reason::OnDemand, filter);
    }
    work.plan(filter)
}

/// A duration or size setting that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    /// Not a whole number followed by a known unit.
    #[error("{value:?} is not a {what}: {expected}")]
    Malformed {
        /// The text given.
        value: String,
        /// `duration` or `size`.
        what: &'static str,
        /// What would be accepted.
        expected: &'static str,
    },
    /// The number is too large to hold.
    #[error("{0:?} is too large")]
    TooLarge(String),
}

const DURATION_UNITS: &[(&str, u64)] = &[("s", 1), ("m", 60), ("h", 3600), ("d", 86_400)];
const SIZE_UNITS: &[(&str, u64)] = &[
    ("B", 1),
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
    ("KB", 1_000),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
];

/// A whole number and a unit of `units` (the number alone only for 0),
/// as a count of the smallest unit.
fn scaled(
    text: &str,
    units: &[(&str, u64)],
    what: &'static str,
    expected: &'static str,
) -> Result<u64, ValueError> {
    let malformed = || ValueError::Malformed {
        value: text.to_owned(),
        what,
        expected,
    };
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    if digits.is_empty() {
        return Err(malformed());
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| ValueError::TooLarge(text.to_owned()))?;
    let factor = match units.iter().find(|(u, _)| *u == unit) {
        Some((_, f)) => *f,
        None if unit.is_empty() && n == 0 => 1,
        None => return Err(malformed()),
    };
    n.checked_mul(factor)
        .ok_or_else(|| ValueError::TooLarge(text.to_owned()))
}

/// A duration: a whole number with `s`, `m`, `h` or `d` (`"30d"`), or `0`.
pub fn parse_duration(text: &str) -> Result<Duration, ValueError> {
    let expected = "a whole number with s, m, h or d (\"30d\"), or 0";
    scaled(text, DURATION_UNITS, "duration", expected).map(Duration::from_secs)
}

/// A size in bytes: a whole number with `B`, `KiB`, `MiB`, `GiB`, `TiB`,
/// `KB`, `MB` or `GB` (`"10GiB"`), or `0`.
pub fn parse_size(text: &str) -> Result<u64, ValueError> {
    let expected = "a whole number with B, KiB, MiB, GiB, TiB, KB, MB or GB (\"10GiB\"), or 0";
    scaled(text, SIZE_UNITS, "size", expected)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tombstones_are_bounded_even_with_the_limits_off() {
        let off = Limits::default();
        assert_eq!(
            off.tombstones(),
            Tombstones {
                max_age: TOMBSTONE_AGE,
                max_count: TOMBSTONES
            }
        );
        let set = Limits {
            max_age: Some(Duration::from_secs(60)),
            max_runs: Some(5),
            ..Limits::default()
        };
        assert_eq!(
            set.tombstones(),
            Tombstones {
                max_age: Duration::from_secs(60),
                max_count: 5
            }
        );
    }
    use proptest::prelude::*;

    const DAY: u64 = 86_400_000;

    fn run(id: u32, session: &str, ended_day: u64) -> Candidate {
        Candidate {
            run_id: format!("r{id:03}"),
            session_id: session.to_owned(),
            owner_uid: 1000,
            ended_at_ms: ended_day * DAY,
            dir_bytes: 100,
            notice_pending: false,
            worktree: None,
        }
    }

    fn ids(plan: &Plan) -> Vec<(&str, Reason)> {
        plan.remove.iter().map(|(i, r)| (i.as_str(), *r)).collect()
    }

    fn kept(plan: &Plan) -> Vec<(&str, Kept)> {
        plan.keep
            .iter()
            .map(|(i, k)| (i.as_str(), k.clone()))
            .collect()
    }

    #[test]
    fn by_age_the_old_go_and_the_newest_of_a_session_stays() {
        let runs = [
            run(1, "a", 1),
            run(2, "a", 2),
            run(3, "a", 9),
            run(4, "b", 1),
        ];
        let limits = Limits {
            max_age: Some(Duration::from_secs(5 * 86_400)),
            ..Limits::default()
        };
        let p = plan(10 * DAY, &limits, &Filter::default(), &runs);
        assert_eq!(
            ids(&p),
            [("r001", Reason::MaxAge), ("r002", Reason::MaxAge)]
        );
        assert_eq!(kept(&p), [("r004", Kept::NewestOfSession)]);
    }

    #[test]
    fn a_pending_notice_protects_until_max_age() {
        let mut runs = vec![run(1, "a", 1), run(2, "a", 8), run(3, "a", 9)];
        runs[0].notice_pending = true;
        runs[1].notice_pending = true;
        let limits = Limits {
            max_age: Some(Duration::from_secs(5 * 86_400)),
            max_runs: Some(1),
            ..Limits::default()
        };
        let p = plan(10 * DAY, &limits, &Filter::default(), &runs);
        assert_eq!(ids(&p), [("r001", Reason::MaxAge)]);
        assert_eq!(kept(&p), [("r002", Kept::NoticePending)]);
        // With no max_age a pending notice protects for good.
        let forever = Limits {
            max_runs: Some(1),
            ..Limits::default()
        };
        let p = plan(10 * DAY, &forever, &Filter::default(), &runs);
        assert!(p.remove.is_empty(), "{p:?}");
        assert_eq!(p.keep.len(), 2);
    }

    #[test]
    fn a_live_worktree_protects_and_says_how_to_free_it() {
        let mut runs = vec![run(1, "a", 1), run(2, "a", 2), run(3, "a", 3)];
        runs[0].worktree = Some(PathBuf::from("/s/a/worktrees/r001"));
        let limits = Limits {
            max_runs: Some(1),
            ..Limits::default()
        };
        let p = plan(10 * DAY, &limits, &Filter::default(), &runs);
        assert_eq!(ids(&p), [("r002", Reason::MaxRuns)]);
        let (_, why) = &p.keep[0];
        assert_eq!(
            why.to_string(),
            "worktree /s/a/worktrees/r001 exists (subagent worktree rm)"
        );
    }

    #[test]
    fn a_count_keeps_the_newest_and_the_protected_older_ones() {
        let mut runs: Vec<Candidate> = (0..12)
            .map(|i| run(i, if i % 2 == 0 { "a" } else { "b" }, u64::from(i)))
            .collect();
        for r in runs.iter_mut().filter(|r| r.session_id == "b") {
            r.notice_pending = true;
        }
        let limits = Limits {
            max_runs: Some(5),
            ..Limits::default()
        };
        let p = plan(20 * DAY, &limits, &Filter::default(), &runs);
        let removed: Vec<&str> = p.remove.iter().map(|(i, _)| i.as_str()).collect();
        assert_eq!(removed, ["r000", "r002", "r004", "r006"]);
        assert_eq!(
            kept(&p),
            [
                ("r001", Kept::NoticePending),
                ("r003", Kept::NoticePending),
                ("r005", Kept::NoticePending)
            ]
        );
    }

    #[test]
    fn counts_go_overall_then_per_session_oldest_first() {
        let runs = [
            run(1, "a", 1),
            run(2, "b", 2),
            run(3, "a", 3),
            run(4, "a", 4),
            run(5, "b", 5),
            run(6, "a", 6),
        ];
        let limits = Limits {
            max_runs: Some(5),
            max_runs_per_session: Some(2),
            ..Limits::default()
        };
        let p = plan(10 * DAY, &limits, &Filter::default(), &runs);
        assert_eq!(
            ids(&p),
            [
                ("r001", Reason::MaxRuns),
                ("r003", Reason::MaxRunsPerSession)
            ]
        );
        assert!(p.keep.is_empty(), "{p:?}");
    }

    #[test]
    fn bytes_go_oldest_first_until_under_the_cap() {
        let mut runs = vec![
            run(1, "a", 1),
            run(2, "a", 2),
            run(3, "a", 3),
            run(4, "a", 4),
        ];
        runs[0].dir_bytes = 50;
        runs[1].dir_bytes = 500;
        runs[2].dir_bytes = 50;
        runs[3].dir_bytes = 5_000;
        let limits = Limits {
            max_bytes: Some(5_100),
            ..Limits::default()
        };
        let p = plan(10 * DAY, &limits, &Filter::default(), &runs);
        assert_eq!(
            ids(&p),
            [("r001", Reason::MaxBytes), ("r002", Reason::MaxBytes)]
        );
        // The newest alone is over the cap: it stays, and says why.
        let tiny = Limits {
            max_bytes: Some(10),
            ..Limits::default()
        };
        let p = plan(10 * DAY, &tiny, &Filter::default(), &runs);
        assert_eq!(p.remove.len(), 3);
        assert_eq!(kept(&p), [("r004", Kept::NewestOfSession)]);
    }

    #[test]
    fn the_first_rule_that_chooses_a_run_names_it() {
        let runs = [run(1, "a", 1), run(2, "a", 2), run(3, "a", 9)];
        let limits = Limits {
            max_age: Some(Duration::from_secs(86_400 * 5)),
            max_runs: Some(1),
            max_runs_per_session: Some(1),
            max_bytes: Some(1),
        };
        let p = plan(10 * DAY, &limits, &Filter::default(), &runs);
        assert_eq!(
            ids(&p),
            [("r001", Reason::MaxAge), ("r002", Reason::MaxAge)]
        );
    }

    #[test]
    fn on_demand_removes_within_the_filter_only() {
        let mut runs = vec![
            run(1, "a", 1),
            run(2, "a", 2),
            run(3, "a", 3),
            run(4, "b", 1),
            run(5, "b", 2),
        ];
        runs[1].notice_pending = true;
        runs[4].owner_uid = 2000;
        let older = Filter {
            older_than: Some(Duration::ZERO),
            ..Filter::default()
        };
        let p = plan(10 * DAY, &Limits::default(), &older, &runs);
        assert_eq!(
            ids(&p),
            [("r001", Reason::OnDemand), ("r004", Reason::OnDemand)]
        );
        assert_eq!(
            kept(&p),
            [
                ("r002", Kept::NoticePending),
                ("r005", Kept::NewestOfSession),
                ("r003", Kept::NewestOfSession)
            ]
        );
        let session = Filter {
            session: Some("b".into()),
            ..older.clone()
        };
        let p = plan(10 * DAY, &Limits::default(), &session, &runs);
        assert_eq!(ids(&p), [("r004", Reason::OnDemand)]);
        assert_eq!(kept(&p), [("r005", Kept::NewestOfSession)]);
        // Another uid sees and removes only its own runs.
        let mine = Filter {
            requester: Some(Requester {
                uid: 2000,
                gid: 2000,
                groups: vec![],
            }),
            ..older
        };
        let p = plan(10 * DAY, &Limits::default(), &mine, &runs);
        assert!(p.remove.is_empty(), "{p:?}");
        assert_eq!(kept(&p), [("r005", Kept::NewestOfSession)]);
    }

    #[test]
    fn a_filter_narrows_what_the_limits_remove_never_widens_it() {
        let runs = [
            run(1, "a", 1),
            run(2, "b", 2),
            run(3, "b", 3),
            run(4, "a", 4),
        ];
        let limits = Limits {
            max_runs: Some(3),
            ..Limits::default()
        };
        let b = Filter {
            session: Some("b".into()),
            ..Filter::default()
        };
        // The limit wants r001, of session a: nothing of b goes.
        assert_eq!(plan(10 * DAY, &limits, &b, &runs), Plan::default());
        let all = plan(10 * DAY, &limits, &Filter::default(), &runs);
        assert_eq!(ids(&all), [("r001", Reason::MaxRuns)]);
    }

    #[test]
    fn the_order_is_by_end_then_id_whatever_the_input_order() {
        let mut runs = vec![
            run(3, "a", 1),
            run(1, "a", 1),
            run(2, "a", 0),
            run(9, "a", 5),
        ];
        let limits = Limits {
            max_runs: Some(1),
            ..Limits::default()
        };
        let p = plan(10 * DAY, &limits, &Filter::default(), &runs);
        runs.reverse();
        assert_eq!(plan(10 * DAY, &limits, &Filter::default(), &runs), p);
        let order: Vec<&str> = p.remove.iter().map(|(i, _)| i.as_str()).collect();
        assert_eq!(order, ["r002", "r001", "r003"]);
    }

    #[test]
    fn durations_and_sizes_parse_with_their_units() {
        assert_eq!(parse_duration("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_size("10GiB"), Ok(10 << 30));
        assert_eq!(parse_size("512B"), Ok(512));
        assert_eq!(parse_size("3MB"), Ok(3_000_000));
        assert_eq!(parse_size("1TiB"), Ok(1 << 40));
        assert_eq!(parse_size("0"), Ok(0));
        for bad in ["", "d", "30", "30 d", "1.5d", "-1d", "30w", "30D"] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
        for bad in ["10", "10gib", "10G", "GiB", "1.5GiB"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_size("99999999999TiB"),
            Err(ValueError::TooLarge("99999999999TiB".into()))
        );
        assert!(parse_duration("99999999999999999999s").is_err());
        assert_eq!(
            Reason::parse("max_runs_per_session"),
            Some(Reason::MaxRunsPerSession)
        );
        assert_eq!(Reason::parse("nope"), None);
    }

    fn candidates() -> impl Strategy<Value = Vec<Candidate>> {
        let one = (0u32..4, 0u64..40, 0u64..1_000, any::<bool>(), 0u8..10);
        prop::collection::vec(one, 0..40).prop_map(|runs| {
            runs.into_iter()
                .enumerate()
                .map(|(i, (session, day, bytes, notice, wt))| Candidate {
                    run_id: format!("r{i:03}"),
                    session_id: format!("s{session}"),
                    owner_uid: 1000 + session % 2,
                    ended_at_ms: day * DAY,
                    dir_bytes: bytes,
                    notice_pending: notice,
                    worktree: (wt == 0).then(|| PathBuf::from(format!("/w/{i}"))),
                })
                .collect()
        })
    }

    fn limits() -> impl Strategy<Value = Limits> {
        (
            prop::option::of(0u64..40),
            prop::option::of(0u64..30),
            prop::option::of(0u64..10),
            prop::option::of(0u64..20_000),
        )
            .prop_map(|(age, runs, per, bytes)| Limits {
                max_age: age.map(|d| Duration::from_millis(d * DAY)),
                max_runs: runs,
                max_runs_per_session: per,
                max_bytes: bytes,
            })
    }

    /// What keeps a run from the count and byte rules.
    fn protected(c: &Candidate, all: &[Candidate]) -> bool {
        newest(c, all) || c.worktree.is_some() || c.notice_pending
    }

    proptest! {
        #[test]
        fn a_protected_run_is_never_removed(runs in candidates(), l in limits(), older in prop::option::of(0u64..40)) {
            let now = 40 * DAY;
            let filter = Filter { older_than: older.map(|d| Duration::from_millis(d * DAY)), ..Filter::default() };
            let p = plan(now, &l, &filter, &runs);
            for (id, reason) in &p.remove {
                let c = runs.iter().find(|c| &c.run_id == id).unwrap();
                let aged = l.max_age.is_some_and(|a| now - c.ended_at_ms >= a.as_millis() as u64);
                let pending_but_aged = c.notice_pending && *reason == Reason::MaxAge && aged;
                prop_assert!(!protected(c, &runs) || pending_but_aged, "{c:?} removed for {reason:?}");
                prop_assert!(c.worktree.is_none());
            }
            let removed: BTreeSet<&str> = p.remove.iter().map(|(i, _)| i.as_str()).collect();
            prop_assert!(p.keep.iter().all(|(i, _)| !removed.contains(i.as_str())));
            prop_assert_eq!(removed.len(), p.remove.len());
        }

        #[test]
        fn after_the_plan_each_limit_holds_whenever_it_can(runs in candidates(), l in limits()) {
            let now = 40 * DAY;
            let p = plan(now, &l, &Filter::default(), &runs);
            let removed: BTreeSet<&str> = p.remove.iter().map(|(i, _)| i.as_str()).collect();
            let mut left: Vec<&Candidate> = runs.iter().filter(|c| !removed.contains(c.run_id.as_str())).collect();
            left.sort_by_key(|c| age_key(c));
            let free = |c: &&Candidate| !protected(c, &runs);
            if let Some(age) = l.max_age {
                let age = age.as_millis() as u64;
                for c in &left {
                    let old = now - c.ended_at_ms >= age;
                    let kept = newest(c, &runs) || c.worktree.is_some();
                    prop_assert!(!old || kept, "{c:?} is older than max_age");
                }
            }
            // Beyond the newest `max` left, only protected runs.
            let beyond = |runs: &[&Candidate], max: u64| -> bool {
                let over = runs.len().saturating_sub(max as usize);
                runs[..over].iter().all(|c| !free(c))
            };
            if let Some(max) = l.max_runs {
                prop_assert!(beyond(&left, max));
            }
            if let Some(max) = l.max_runs_per_session {
                for s in left.iter().map(|c| &c.session_id).collect::<BTreeSet<_>>() {
                    let mine: Vec<&Candidate> = left.iter().copied().filter(|c| &c.session_id == s).collect();
                    prop_assert!(beyond(&mine, max));
                }
            }
            if let Some(max) = l.max_bytes {
                let total: u64 = left.iter().map(|c| c.dir_bytes).sum();
                prop_assert!(total <= max || !left.iter().any(free));
            }
        }

        #[test]
        fn a_count_limit_removes_the_unprotected_beyond_the_newest(runs in candidates(), max in 0u64..30) {
            let l = Limits { max_runs: Some(max), ..Limits::default() };
            let p = plan(40 * DAY, &l, &Filter::default(), &runs);
            let mut oldest_first: Vec<&Candidate> = runs.iter().collect();
            oldest_first.sort_by_key(|c| age_key(c));
            let over = runs.len().saturating_sub(max as usize);
            let want: Vec<&str> = oldest_first[..over]
                .iter()
                .filter(|c| !protected(c, &runs))
                .map(|c| c.run_id.as_str())
                .collect();
            let got: Vec<&str> = p.remove.iter().map(|(i, _)| i.as_str()).collect();
            prop_assert_eq!(got, want);
        }
    }

    fn newest(c: &Candidate, all: &[Candidate]) -> bool {
        all.iter()
            .filter(|o| o.session_id == c.session_id)
            .all(|o| age_key(o) <= age_key(c))
    }
}
