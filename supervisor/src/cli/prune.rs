//! What `subagent prune` prints of a `prune_runs` answer: one line per
//! run removed and per run a limit wanted but that was kept, with why.

use crate::protocol::PruneResult;
use crate::sanitize::one_line;

/// The text: each removed run (id, session, ended, size, reason), each
/// kept one with why, then the total.
pub fn lines(r: &PruneResult) -> String {
    let mut out = String::new();
    for p in &r.removed {
        out.push_str(&format!(
            "{}  {}  {}  {:>9}  {}\n",
            one_line(&p.run_id),
            one_line(&p.session_id),
            one_line(&p.ended_at),
            size(p.bytes),
            p.reason.as_str()
        ));
    }
    for k in &r.kept {
        out.push_str(&format!(
            "{}  kept: {}\n",
            one_line(&k.run_id),
            one_line(&k.why)
        ));
    }
    let total = size(r.removed.iter().map(|p| p.bytes).sum());
    let n = r.removed.len();
    let runs = if n == 1 { "run" } else { "runs" };
    if r.dry_run {
        out.push_str(&format!(
            "dry run: would remove {n} {runs} ({total}); nothing removed\n"
        ));
    } else {
        out.push_str(&format!("removed {n} {runs} ({total})\n"));
    }
    out
}

/// Bytes for people: `512 B`, `12.0 KiB`, `3.4 GiB`.
fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{KeptRun, PrunedRun};
    use policy::retention::Reason;

    #[test]
    fn one_line_per_run_then_the_total() {
        let r = PruneResult {
            removed: vec![PrunedRun {
                run_id: "20261201T070317.792757Z-5fe54002".into(),
                session_id: "ci\u{1b}[2J".into(),
                ended_at: "2026-12-01T07:03:17.900Z".into(),
                bytes: 12 * 1024,
                reason: Reason::MaxRuns,
            }],
            kept: vec![KeptRun {
                run_id: "20261201T070318.000000Z-00000000".into(),
                why: "the newest run of its session".into(),
            }],
            dry_run: true,
        };
        let text = lines(&r);
        let want = "20261201T070317.792757Z-5fe54002  ci\\x1b[2J  2026-12-01T07:03:17.900Z   12.0 KiB  max_runs\n\
                    20261201T070318.000000Z-00000000  kept: the newest run of its session\n\
                    dry run: would remove 1 run (12.0 KiB); nothing removed\n";
        assert_eq!(text, want);
        let none = PruneResult::default();
        assert_eq!(lines(&none), "removed 0 runs (0 B)\n");
        assert_eq!(size(3 << 30), "3.0 GiB");
        assert_eq!(size(1023), "1023 B");
    }
}
