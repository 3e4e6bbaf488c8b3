//! Usage for people: the `ls` table's turns, tokens and cost cells, a
//! status's usage line (the CLI's and the MCP server's), and the table of
//! `subagent usage`. Figures are numbers the daemon parsed; a missing one
//! is shown blank or as `-`.

use crate::usage::{UsageSummary, UsageTotals};
use policy::usage::Usage;
use std::fmt::Write as _;

/// A count for a narrow column: exact below 10,000, else `12.3k`, `4.5M`.
pub fn count(n: u64) -> String {
    match n {
        0..10_000 => n.to_string(),
        10_000..10_000_000 => format!("{:.1}k", n as f64 / 1e3),
        _ => format!("{:.1}M", n as f64 / 1e6),
    }
}

/// A cost in US dollars: four decimals below $1, else two.
pub fn cost(usd: f64) -> String {
    if usd < 1.0 {
        format!("${usd:.4}")
    } else {
        format!("${usd:.2}")
    }
}

/// The `ls` table's TURNS, TOKENS (in/out) and COST cells: blank for a
/// figure not reported (and for a run without a driver).
pub fn cells(u: Option<&Usage>) -> [String; 3] {
    let Some(u) = u else {
        return Default::default();
    };
    let tokens = match (u.input_tokens, u.output_tokens) {
        (None, None) => String::new(),
        (i, o) => format!(
            "{}/{}",
            i.map_or("-".into(), count),
            o.map_or("-".into(), count)
        ),
    };
    [
        u.turns.map(|t| t.to_string()).unwrap_or_default(),
        tokens,
        u.cost_usd.map(cost).unwrap_or_default(),
    ]
}

/// One line for a status: `3 turns, 300 in / 60 out tokens, $0.0024`,
/// or `none reported`.
pub fn line(u: &Usage) -> String {
    if !u.any() {
        return "none reported".into();
    }
    let n = |v: Option<u64>| v.map_or("?".into(), |v| v.to_string());
    let mut out = format!(
        "{} turns, {} in / {} out tokens",
        n(u.turns),
        n(u.input_tokens),
        n(u.output_tokens)
    );
    if let Some(c) = u.cost_usd {
        let _ = write!(out, ", {}", cost(c));
    }
    out
}

/// `subagent usage`'s text: what was summed, then one row per driver and
/// the total.
pub fn table(s: &UsageSummary) -> String {
    let mut out = String::new();
    let scope = match &s.session_id {
        Some(id) => format!("session {}", crate::sanitize::one_line(id)),
        None => "every session".to_owned(),
    };
    let mut range = String::new();
    if let Some(t) = &s.since {
        let _ = write!(range, " since {}", crate::sanitize::one_line(t));
    }
    if let Some(t) = &s.until {
        let _ = write!(range, " until {}", crate::sanitize::one_line(t));
    }
    let _ = writeln!(
        out,
        "runs of {scope}{range}: {}, {} reported usage (as each agent reported it)",
        s.totals.runs, s.totals.reported
    );
    let _ = writeln!(
        out,
        "{:<12} {:>6} {:>9} {:>7} {:>12} {:>12} {:>10}",
        "DRIVER", "RUNS", "REPORTED", "TURNS", "TOKENS IN", "TOKENS OUT", "COST"
    );
    let mut row = |name: &str, t: &UsageTotals| {
        let n = |v: Option<u64>| v.map_or("-".into(), |v| v.to_string());
        let _ = writeln!(
            out,
            "{:<12} {:>6} {:>9} {:>7} {:>12} {:>12} {:>10}",
            crate::sanitize::one_line(name),
            t.runs,
            t.reported,
            n(t.turns),
            n(t.input_tokens),
            n(t.output_tokens),
            t.cost_usd.map_or("-".into(), cost)
        );
    };
    for (name, t) in &s.by_driver {
        row(name, t);
    }
    row("total", &s.totals);
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn cells_are_short_and_blank_when_unknown() {
        assert_eq!(cells(None), ["", "", ""]);
        assert_eq!(cells(Some(&Usage::default())), ["", "", ""]);
        let u = Usage {
            turns: Some(3),
            input_tokens: Some(123_456),
            output_tokens: Some(60),
            cost_usd: Some(0.0024000000000000002),
        };
        assert_eq!(cells(Some(&u)), ["3", "123.5k/60", "$0.0024"]);
        assert_eq!(count(9_999), "9999");
        assert_eq!(count(12_345_678), "12.3M");
        assert_eq!(cost(12.345), "$12.35");
        assert_eq!(line(&u), "3 turns, 123456 in / 60 out tokens, $0.0024");
        assert_eq!(line(&Usage::default()), "none reported");
    }

    #[test]
    fn the_table_has_a_row_per_driver_and_a_total() {
        let claude = UsageTotals {
            runs: 2,
            reported: 2,
            turns: Some(6),
            input_tokens: Some(600),
            output_tokens: Some(120),
            cost_usd: Some(0.0048),
        };
        let mut s = UsageSummary {
            session_id: Some("s1".into()),
            since: Some("2026-01-01T00:00:00Z".into()),
            ..Default::default()
        };
        s.totals.add(&claude);
        s.by_driver.insert("claude-code".into(), claude);
        let t = table(&s);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "runs of session s1 since 2026-01-01T00:00:00Z: 2, 2 reported usage (as each agent reported it)"
        );
        assert!(lines[2].starts_with("claude-code") && lines[2].ends_with("$0.0048"));
        assert!(lines[3].starts_with("total"), "{t}");
        assert_eq!(lines.len(), 4);
    }
}
