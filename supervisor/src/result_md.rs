//! result.md: what a finished run leaves for its parent, readable by a
//! person and by a model.

use crate::record::RunRecord;
use crate::timefmt::{human_duration, rfc3339_ms};
use std::fmt::Write as _;
use std::path::Path;

/// At most this many characters of the log's end are shown.
pub const LOG_TAIL_CHARS: usize = 4000;
/// At most this many artifact entries are listed.
pub const MAX_ARTIFACTS_LISTED: usize = 200;

/// One file in the artifact dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    /// Its path relative to the artifact dir.
    pub rel: String,
    /// Its size in bytes (files) or its target (symlinks).
    pub what: String,
}

/// Lists the artifact dir recursively, without following symlinks; returns
/// the entries (sorted) and how many more were not listed.
pub fn list_artifacts(dir: &Path) -> (Vec<Artifact>, usize) {
    let mut out = Vec::new();
    let mut more = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let path = e.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let rel = path
                .strip_prefix(dir)
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            let what = if meta.is_dir() {
                stack.push(path.clone());
                continue;
            } else if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).unwrap_or_default();
                format!("symlink to {}", target.display())
            } else {
                format!("{} bytes", meta.len())
            };
            if out.len() < MAX_ARTIFACTS_LISTED {
                out.push(Artifact { rel, what });
            } else {
                more += 1;
            }
        }
    }
    out.sort_by(|a, b| a.rel.cmp(&b.rel));
    (out, more)
}

/// The last `max` characters of `text`, starting at a line when one begins
/// within the window; and whether anything was cut.
pub fn tail_chars(text: &str, max: usize) -> (&str, bool) {
    let total = text.chars().count();
    if total <= max {
        return (text, false);
    }
    let start = text
        .char_indices()
        .nth(total - max)
        .map(|(i, _)| i)
        .unwrap_or(0);
    let window = &text[start..];
    let from_line = match window.find('\n') {
        Some(nl) if nl + 1 < window.len() => &window[nl + 1..],
        _ => window,
    };
    (from_line, true)
}

/// Reads the end of child.log (the last 16 KiB, as text).
pub fn read_log_tail(path: &Path) -> (String, u64) {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return (String::new(), 0);
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let from = len.saturating_sub(16 * 1024);
    let mut buf = Vec::new();
    if f.seek(SeekFrom::Start(from)).is_ok() {
        let _ = f.read_to_end(&mut buf);
    }
    (String::from_utf8_lossy(&buf).into_owned(), len)
}

fn fence_for(text: &str) -> String {
    let mut longest = 0;
    let mut run = 0;
    for c in text.chars() {
        if c == '`' {
            run += 1;
            longest = longest.max(run);
        } else {
            run = 0;
        }
    }
    "`".repeat((longest + 1).max(3))
}

/// Renders result.md for a run that has ended.
pub fn render(rec: &RunRecord) -> String {
    let files = rec.files();
    let mut s = String::new();
    let _ = writeln!(s, "# Subagent run {}\n", rec.run_id);
    let _ = writeln!(s, "- session: {}", rec.session_id);
    let _ = writeln!(s, "- state: **{}**", rec.state.as_str());
    match (rec.exit_code, rec.signal) {
        (Some(c), _) => {
            let _ = writeln!(s, "- exit code: {c}");
        }
        (None, Some(sig)) => {
            let _ = writeln!(
                s,
                "- signal: {sig} ({})",
                subagent_runner::supervise::signal_name(sig)
            );
        }
        (None, None) => {}
    }
    if let Some(reason) = &rec.reason {
        let _ = writeln!(s, "- reason: {reason}");
    }
    let _ = writeln!(s, "- command: `{}`", rec.command.join(" "));
    let _ = writeln!(s, "- project dir: {}", rec.project_dir.display());
    let _ = writeln!(s, "- created: {}", rfc3339_ms(rec.created_at_ms));
    if let Some(st) = rec.started_at_ms {
        let _ = writeln!(s, "- started: {}", rfc3339_ms(st));
    }
    if let Some(end) = rec.ended_at_ms {
        let _ = writeln!(s, "- ended: {}", rfc3339_ms(end));
        if let Some(st) = rec.started_at_ms {
            let _ = writeln!(s, "- duration: {}", human_duration(end.saturating_sub(st)));
        }
    }
    let _ = writeln!(s, "- log: {}", files.log().display());
    let _ = writeln!(s, "- artifacts: {}", files.artifacts().display());

    let _ = writeln!(s, "\n## Tools and rights\n");
    if let Some(a) = &rec.agent {
        let _ = writeln!(s, "- agent: {a}");
    }
    match &rec.tools {
        Some(t) if t.is_empty() => {
            let _ = writeln!(s, "- tools: (none)");
        }
        Some(t) => {
            let _ = writeln!(s, "- tools: {}", t.join(", "));
        }
        None => {
            let _ = writeln!(s, "- tools: (no tool policy given)");
        }
    }
    if let Some(r) = rec.rights {
        let yes = |b: bool| if b { "yes" } else { "no" };
        let _ = writeln!(
            s,
            "- rights: read project {}, write project {}, run other programs {}, network {}",
            yes(r.read_project),
            yes(r.write_project),
            yes(r.exec),
            yes(r.network)
        );
    }
    let _ = writeln!(s, "\n## Working context\n");
    if let Some(g) = &rec.git {
        let _ = writeln!(s, "- {}", policy::workctx::git_line(g));
    }
    if let Some(w) = &rec.worktree {
        let _ = writeln!(s, "- worktree: {} (branch {})", w.dir.display(), w.branch);
    }
    if let Some(d) = &rec.delta {
        if let Some(n) = &d.note {
            let _ = writeln!(s, "- delta: {n}");
        }
        for v in &d.accepted {
            if let policy::workctx::Outcome::Accepted(p) = &v.outcome {
                let _ = writeln!(s, "- merged into recent files: {}", p.display());
            }
        }
        for v in &d.rejected {
            if let policy::workctx::Outcome::Rejected(why) = &v.outcome {
                let _ = writeln!(s, "- rejected: {} ({why})", v.path);
            }
        }
    }
    if let Some(iso) = &rec.isolation {
        let _ = writeln!(s, "\n## Isolation\n");
        let rows = [
            ("landlock", &iso.landlock),
            ("seccomp", &iso.seccomp),
            ("network", &iso.network),
            ("cgroup", &iso.cgroup),
            ("capabilities", &iso.capabilities),
        ];
        for (name, e) in rows {
            let mark = if e.enforced {
                "enforced"
            } else {
                "NOT enforced"
            };
            let _ = writeln!(s, "- {name}: {mark}: {}", e.detail);
        }
        let _ = writeln!(s, "- user: {}", iso.user);
        let _ = writeln!(s, "- no_new_privs: {}", iso.no_new_privs);
        let _ = writeln!(s, "- rlimits: {}", iso.rlimits.join(", "));
        for n in &iso.notes {
            let _ = writeln!(s, "- note: {n}");
        }
    }
    if let Some(r) = &rec.resources {
        let peak = r.peak_memory_bytes.map_or("unknown".to_owned(), |b| {
            format!("{:.1} MiB", b as f64 / 1048576.0)
        });
        let _ = writeln!(
            s,
            "\n## Resources\n\n- CPU: {} ms user, {} ms system\n- peak memory: {peak}\n- OOM killer: {}",
            r.cpu_user_ms,
            r.cpu_system_ms,
            if r.oom_killed { "fired" } else { "not fired" }
        );
    }

    let _ = writeln!(s, "\n## Artifacts\n");
    let (arts, more) = list_artifacts(&files.artifacts());
    if arts.is_empty() {
        let _ = writeln!(s, "(none)");
    }
    for a in &arts {
        let _ = writeln!(s, "- `{}` ({})", a.rel, a.what);
    }
    if more > 0 {
        let _ = writeln!(s, "- … and {more} more not listed");
    }

    let _ = writeln!(s, "\n## Log tail\n");
    let (text, len) = read_log_tail(&files.log());
    let (tail, cut) = tail_chars(&text, LOG_TAIL_CHARS);
    if len == 0 {
        let _ = writeln!(s, "(the log is empty)");
    } else {
        if cut || len > text.len() as u64 {
            let _ = writeln!(
                s,
                "(cut: the last {} characters of a {len}-byte log; the whole log is at the path above)\n",
                tail.chars().count()
            );
        }
        if rec.log_truncated {
            let _ = writeln!(s, "(the log itself was cut at the output_mb limit)\n");
        }
        let fence = fence_for(tail);
        let _ = writeln!(s, "{fence}text\n{}", tail.trim_end_matches('\n'));
        let _ = writeln!(s, "{fence}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_is_cut_on_a_line_and_char_boundary() {
        let text = "é".repeat(10) + "\nline two\nline three\n";
        let (tail, cut) = tail_chars(&text, 15);
        assert!(cut);
        assert_eq!(tail, "line three\n");
        let (whole, cut) = tail_chars("short\n", 100);
        assert!(!cut);
        assert_eq!(whole, "short\n");
        let one_line = "x".repeat(50);
        let (t, cut) = tail_chars(&one_line, 10);
        assert!(cut);
        assert_eq!(t.len(), 10);
    }

    #[test]
    fn fence_outgrows_backticks_in_the_log() {
        assert_eq!(fence_for("plain"), "```");
        assert_eq!(fence_for("a ```` b"), "`````");
    }
}
