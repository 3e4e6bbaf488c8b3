//! Human output: a status block, the `ls` table, notices. Every value is
//! shown on one line with control characters visible
//! ([`crate::sanitize::one_line`]), an agent's answer quoted
//! ([`crate::sanitize::quoted`]): a child's text cannot add a line or
//! drive the terminal.

use crate::sanitize::{one_line, quoted};
use crate::status::RunStatus;
use crate::timefmt::{human_duration, now_ms, parse_rfc3339_ms};
use std::fmt::Write as _;

/// A status as `key: value` lines.
pub fn status_block(s: &RunStatus) -> String {
    let mut out = String::new();
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let num = |v: Option<i32>| v.map_or("-".into(), |n| n.to_string());
    let rows = [
        ("run", s.run_id.clone()),
        ("session", s.session_id.clone()),
        ("state", s.state.as_str().to_owned()),
        ("exit_code", num(s.exit_code)),
        ("signal", num(s.signal)),
        ("reason", opt(&s.reason)),
        ("command", s.command.join(" ")),
        ("project_dir", s.project_dir.display().to_string()),
        ("created_at", s.created_at.clone()),
        ("started_at", opt(&s.started_at)),
        ("ended_at", opt(&s.ended_at)),
        ("temp_dir", s.temp_dir.display().to_string()),
        ("artifact_dir", s.artifact_dir.display().to_string()),
        ("log_path", s.log_path.display().to_string()),
        ("result_path", s.result_path.display().to_string()),
    ];
    let colour = super::style::stdout_colour();
    for (k, v) in rows {
        let v = one_line(&v);
        let v = if k == "state" {
            super::style::paint_state(&v, colour)
        } else {
            v
        };
        let _ = writeln!(out, "{k:<13}{v}");
    }
    if s.cancel_requested && !s.state.is_terminal() {
        let _ = writeln!(out, "{:<13}yes", "cancelling");
    }
    if let Some(b) = s.backend {
        let _ = writeln!(out, "{:<13}{}", "backend", b.describe());
    }
    if let Some(d) = s.driver.as_ref().filter(|d| d.driver.streams()) {
        let _ = writeln!(out, "{:<13}{}", "driver", d.driver.as_str());
        if let Some(u) = &s.usage {
            let so_far = if s.state.is_terminal() {
                ""
            } else {
                " (so far)"
            };
            let _ = writeln!(
                out,
                "{:<13}{}{so_far}",
                "usage",
                crate::view::usage::line(u)
            );
        }
        if let Some(b) = &d.budget {
            let _ = writeln!(out, "{:<13}{}", "budget", b.describe());
        }
        if let Some(text) = d.report.as_ref().and_then(|r| r.final_text.as_deref()) {
            // The agent's words: quoted on one line, and only its start.
            let start: String = text.chars().take(200).collect();
            let _ = writeln!(out, "{:<13}the agent's words: {}", "answer", quoted(&start));
        }
    }
    out
}

fn age(s: &RunStatus, now: u64) -> String {
    parse_rfc3339_ms(&s.created_at).map_or("-".into(), |c| human_duration(now.saturating_sub(c)))
}

fn duration(s: &RunStatus, now: u64) -> String {
    let start = s.started_at.as_deref().and_then(parse_rfc3339_ms);
    let end = s
        .ended_at
        .as_deref()
        .and_then(parse_rfc3339_ms)
        .unwrap_or(now);
    start.map_or("-".into(), |st| human_duration(end.saturating_sub(st)))
}

/// The `ls` table: run, session, state, age, duration, a driver run's
/// turns, tokens (in/out) and cost, command.
pub fn table(runs: &[RunStatus]) -> String {
    let mut widths = TABLE_HEADER.map(str::len);
    table_page(runs, &mut widths, true)
}

/// How many columns the `ls` table has.
pub const COLUMNS: usize = 10;

/// The `ls` table's columns.
pub const TABLE_HEADER: [&str; COLUMNS] = [
    "RUN", "SESSION", "STATE", "AGE", "DURATION", "WHERE", "TURNS", "TOKENS", "COST", "COMMAND",
];

/// One page of the `ls` table, its header first when `header`. `widths`
/// carries the columns' widths from page to page: they only grow, so a
/// streamed table stays aligned unless a later page has a wider cell.
pub fn table_page(runs: &[RunStatus], widths: &mut [usize; COLUMNS], header: bool) -> String {
    let now = now_ms();
    let rows: Vec<[String; COLUMNS]> = runs
        .iter()
        .map(|r| {
            let mut cmd = one_line(&r.command.join(" "));
            if cmd.chars().count() > 60 {
                cmd = cmd.chars().take(59).collect::<String>() + "…";
            }
            let [turns, tokens, cost] = crate::view::usage::cells(r.usage.as_ref());
            [
                one_line(&r.run_id),
                one_line(&r.session_id),
                r.state.as_str().to_owned(),
                age(r, now),
                duration(r, now),
                r.backend
                    .map_or_else(|| "local".to_owned(), |b| b.describe()),
                turns,
                tokens,
                cost,
                cmd,
            ]
        })
        .collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let colour = super::style::stdout_colour();
    let mut line = |cells: &[String]| {
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                l.push_str(c);
            } else if TABLE_HEADER[i] == "STATE" {
                let cell = format!("{:<w$}", c, w = widths[i]);
                let _ = write!(l, "{}  ", super::style::paint_state(&cell, colour));
            } else {
                let _ = write!(l, "{:<w$}  ", c, w = widths[i]);
            }
        }
        let _ = writeln!(out, "{}", l.trim_end());
    };
    if header {
        line(&TABLE_HEADER.map(String::from));
    }
    for row in &rows {
        line(row);
    }
    out
}

/// The `agents` listing: each definition's name, source file, tools,
/// description and warnings; then the shadowed ones, the files that could
/// not be used and what was not walked.
pub fn agents_table(
    found: &crate::agents::Found,
    policy: &policy::toolpolicy::ToolPolicy,
) -> String {
    let mut out = String::new();
    if found.agents.is_empty() {
        let _ = writeln!(out, "(no subagent definitions found)");
    }
    for a in &found.agents {
        let d = &a.definition;
        let tools = match a.shown_tools(policy) {
            None => "(any the parent may delegate)".to_owned(),
            Some(t) if t.is_empty() => "(none)".to_owned(),
            Some(t) => t.join(", "),
        };
        let _ = writeln!(
            out,
            "{}\n  source:      {}\n  tools:       {}",
            one_line(&d.name),
            one_line(&d.source.to_string_lossy()),
            one_line(&tools),
        );
        let mut row = |key: &str, value: String| {
            let _ = writeln!(out, "  {key:<12} {}", one_line(&value));
        };
        if a.tools.allow.is_none() && !a.tools.deny.is_empty() {
            row("not:", a.tools.deny.join(", "));
        }
        if !a.tools.patterns.is_empty() {
            let p: Vec<&str> = a
                .tools
                .patterns
                .iter()
                .map(|p| p.written.as_str())
                .collect();
            row("patterns:", p.join(", "));
        }
        if let Some(m) = &d.model {
            row("model:", m.clone());
        }
        row("description:", d.description.clone());
        for w in &a.warnings {
            row("warning:", w.clone());
        }
    }
    for dup in &found.duplicates {
        let over = if dup.over_user {
            ", a project definition over a user-level one"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "shadowed: {}: {} (the one used: {}{over})",
            one_line(&dup.name),
            one_line(&dup.shadowed.to_string_lossy()),
            one_line(&dup.winner.to_string_lossy())
        );
    }
    for e in &found.errors {
        let _ = writeln!(out, "error: {}", one_line(&e.to_string()));
    }
    for n in &found.notes {
        let _ = writeln!(out, "note: {}", one_line(n));
    }
    out
}

/// `subagent context`: how the context reached the agent, each layer with
/// its sizes, the totals, the stable prefix, what was left out; with
/// `tools`, the schemas' sizes.
pub fn context_table(
    plan: &policy::compose::Plan,
    delivered: &str,
    tools: Option<&[(String, usize)]>,
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "delivered: {}", one_line(delivered));
    let _ = writeln!(out, "attempt {} of {}", plan.attempt, plan.max_attempts);
    let _ = writeln!(
        out,
        "{:<22} {:<17} {:>9} {:>9} {:>8}  SOURCE",
        "LAYER", "FILE", "RAW", "COMPOSED", "~TOKENS"
    );
    for l in &plan.layers {
        let cut = if l.truncated { " (truncated)" } else { "" };
        let _ = writeln!(
            out,
            "{:<22} {:<17} {:>9} {:>9} {:>8}  {}{cut}",
            one_line(&l.name),
            one_line(&l.file),
            l.raw_chars,
            l.injected_chars,
            l.approx_tokens,
            one_line(&l.source)
        );
    }
    let _ = writeln!(
        out,
        "{:<22} {:<17} {:>9} {:>9} {:>8}",
        "total", "", plan.total_raw_chars, plan.total_injected_chars, plan.total_approx_tokens
    );
    let _ = writeln!(out, "stable_prefix: {}", plan.stable_prefix);
    let _ = writeln!(
        out,
        "caps: {} chars per layer, {} in all",
        plan.caps.max_file_chars, plan.caps.max_total_chars
    );
    for o in &plan.omitted {
        let _ = writeln!(
            out,
            "omitted: {} ({})",
            one_line(&o.name),
            one_line(&o.reason)
        );
    }
    if let Some(tools) = tools {
        let _ = writeln!(out, "\ntool schemas (largest first):");
        for (name, chars) in tools {
            let name = one_line(name);
            let _ = writeln!(out, "  {name:<20} {chars:>7} chars  ~{} tokens", chars / 4);
        }
    }
    out
}
