//! `subagent ls`: runs fetched a page of `list_agent_runs` at a time and
//! printed as each page arrives, so a long history streams.

use super::args::LsArgs;
use super::{show, stdout};
use crate::client::Client;
use crate::run::record::RunState;
use crate::sanitize::json_text;
use crate::status::RunStatus;
use anyhow::{anyhow, bail, Result};
use serde_json::{json, Value};

/// Lists the runs `args` selects over `client`: one page with `--limit`
/// alone, else every page; JSON when `json`.
pub fn list(mut client: Client, json: bool, args: &LsArgs) -> Result<u8> {
    if let Some(s) = &args.state {
        RunState::parse(s).ok_or_else(|| anyhow!("--state {s:?} is not a run state"))?;
    }
    let now = crate::timefmt::now_ms();
    let mut params = json!({
        "session_id": args.session,
        "state": args.state,
        "since": args.since.as_deref().map(|w| when("--since", w, now)).transpose()?,
        "until": args.until.as_deref().map(|w| when("--until", w, now)).transpose()?,
        "order": if args.desc { "desc" } else { "asc" },
        "limit": args.limit.unwrap_or(crate::paging::MAX_LIMIT),
    });
    if args.limit.is_some() && !args.all {
        let v = client.call("list_agent_runs", params)?;
        return one_page(json, &v);
    }
    let mut out = Output::new(json);
    loop {
        let v = client.call("list_agent_runs", params.clone())?;
        let runs: Vec<RunStatus> = serde_json::from_value(v["runs"].clone())?;
        out.page(&runs)?;
        match v["next_cursor"].as_str() {
            Some(c) => params["cursor"] = json!(c),
            None => break,
        }
    }
    out.end()?;
    Ok(0)
}

/// `ls --watch`: the list again every `--interval` seconds, over a new
/// connection from `connect` each time, after a line with the time, until
/// interrupted. A call that fails is
/// told on stderr and tried again at the next interval (a daemon restart
/// does not end the watch); a reader that goes away does.
pub fn watch(connect: &dyn Fn() -> Result<Client>, json: bool, args: &LsArgs) -> Result<u8> {
    let secs = args.interval.unwrap_or(2.0);
    if !(secs.is_finite() && (0.1..=86_400.0).contains(&secs)) {
        bail!("--interval must be from 0.1 to 86400 seconds");
    }
    if let Some(s) = &args.state {
        RunState::parse(s).ok_or_else(|| anyhow!("--state {s:?} is not a run state"))?;
    }
    let once = LsArgs {
        watch: false,
        ..args.clone()
    };
    loop {
        if !json {
            let now = crate::timefmt::rfc3339_ms(crate::timefmt::now_ms());
            stdout::line(&format!("=== {now} ==="))?;
        }
        match connect().and_then(|c| list(c, json, &once)) {
            Err(e) if stdout::closed(&e) => return Err(e),
            Err(e) => eprintln!(
                "subagent: {}",
                crate::sanitize::for_terminal(&format!("{e:#}"))
            ),
            Ok(_) => {}
        }
        std::thread::sleep(std::time::Duration::from_secs_f64(secs));
    }
}

/// Prints one page; says on stderr when more runs follow it.
fn one_page(json: bool, v: &Value) -> Result<u8> {
    if json {
        stdout::line(&json_text(&serde_json::to_string_pretty(v)?))?;
        return Ok(0);
    }
    let runs: Vec<RunStatus> = serde_json::from_value(v["runs"].clone())?;
    stdout::write(&show::table(&runs))?;
    if v["next_cursor"].is_string() {
        eprintln!("more runs follow; `subagent ls --all` lists them all");
    }
    Ok(0)
}

/// An age (`90s`, `10m`, `2h`, `7d`) in ms.
pub(super) fn age_ms(w: &str) -> Option<u64> {
    let unit = |c: char| match c {
        's' => Some(1_000u64),
        'm' => Some(60_000),
        'h' => Some(3_600_000),
        'd' => Some(86_400_000),
        _ => None,
    };
    w.char_indices()
        .last()
        .and_then(|(i, c)| Some((w.get(..i)?.parse::<u64>().ok()?, unit(c)?)))
        .and_then(|(n, ms)| n.checked_mul(ms))
}

/// An RFC 3339 time for `--since`/`--until`: an age before `now` (`90s`,
/// `10m`, `2h`, `7d`) or a time given as one.
pub(super) fn when(flag: &str, w: &str, now: u64) -> Result<String> {
    if crate::paging::parse_time(w).is_some() {
        return Ok(w.to_owned());
    }
    match age_ms(w) {
        Some(ms) => Ok(crate::timefmt::rfc3339_ms(now.saturating_sub(ms))),
        None => bail!("{flag} {w:?} is neither an age (90s, 10m, 2h, 7d) nor an RFC 3339 time"),
    }
}

/// The streamed output: the table with one header, or one JSON document
/// `{"runs": [...], "next_cursor": null}` written run by run.
struct Output {
    json: bool,
    widths: [usize; show::COLUMNS],
    printed: usize,
}

impl Output {
    fn new(json: bool) -> Output {
        Output {
            json,
            widths: show::TABLE_HEADER.map(str::len),
            printed: 0,
        }
    }

    fn page(&mut self, runs: &[RunStatus]) -> Result<()> {
        if !self.json {
            let text = show::table_page(runs, &mut self.widths, self.printed == 0);
            self.printed += runs.len().max(1);
            return stdout::write(&text);
        }
        let mut text = String::new();
        for r in runs {
            text.push_str(if self.printed == 0 {
                "{\n  \"runs\": [\n"
            } else {
                ",\n"
            });
            let one = serde_json::to_string_pretty(r)?;
            let indented: Vec<String> = one.lines().map(|l| format!("    {l}")).collect();
            text.push_str(&indented.join("\n"));
            self.printed += 1;
        }
        stdout::write(&json_text(&text))
    }

    fn end(&mut self) -> Result<()> {
        match (self.json, self.printed) {
            (false, _) => Ok(()),
            (true, 0) => stdout::line("{\n  \"runs\": [],\n  \"next_cursor\": null\n}"),
            (true, _) => stdout::line("\n  ],\n  \"next_cursor\": null\n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_and_times_become_rfc_3339() {
        let now = crate::timefmt::parse_rfc3339_ms("2026-01-31T12:00:00.000Z").unwrap();
        assert_eq!(
            when("--since", "10m", now).unwrap(),
            "2026-01-31T11:50:00.000Z"
        );
        assert_eq!(
            when("--since", "2h", now).unwrap(),
            "2026-01-31T10:00:00.000Z"
        );
        assert_eq!(
            when("--since", "7d", now).unwrap(),
            "2026-01-24T12:00:00.000Z"
        );
        assert_eq!(
            when("--since", "90s", now).unwrap(),
            "2026-01-31T11:58:30.000Z"
        );
        let t = "2026-01-01T00:00:00Z";
        assert_eq!(when("--until", t, now).unwrap(), t);
        for bad in ["", "m", "10", "10w", "-1h", "yesterday"] {
            let e = when("--since", bad, now).unwrap_err().to_string();
            assert!(e.contains("--since"), "{bad:?}: {e}");
        }
    }
}
