//! `subagent top`: a full-screen view of the live runs (and those ended in
//! the last minute), refreshed every second from `sample_agent_runs`,
//! with keys to follow a run's log, cancel it, and filter.
//!
//! - [`data`]: a run as the view reads it (leniently) and its cells.
//! - [`model`]: the view's state and its keys (pure).
//! - [`draw`]: the screen, with ratatui.
//!
//! The terminal is put back as it was (raw mode off, the main screen,
//! the cursor shown) when the view ends, however it ends: by a key, an
//! error (the guard's drop) or a panic (a hook that restores before the
//! message is printed).

pub mod data;
pub mod draw;
pub mod model;

use super::args::TopArgs;
use crate::client::Client;
use anyhow::{bail, Context, Result};
use model::{Action, App, Mode};
use ratatui::crossterm::event::{self, Event, KeyEventKind};
use ratatui::crossterm::{cursor, execute, terminal};
use serde_json::json;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// How often the runs are fetched (and a followed log read again).
const REFRESH: Duration = Duration::from_secs(1);
/// How much of a followed log's end is read.
const LOG_TAIL_BYTES: u64 = 256 * 1024;
/// The most lines of it kept.
const LOG_TAIL_LINES: usize = 1000;

/// Puts the terminal back: raw mode off, the main screen, the cursor
/// shown. Safe to call more than once.
fn restore() {
    let _ = terminal::disable_raw_mode();
    let _ = execute!(
        std::io::stdout(),
        terminal::LeaveAlternateScreen,
        cursor::Show
    );
}

/// The terminal in raw mode on the alternate screen, until dropped.
struct Screen;

impl Screen {
    fn enter() -> Result<Screen> {
        terminal::enable_raw_mode().context("raw mode")?;
        // From here on a failure must put the terminal back: the guard does.
        let screen = Screen;
        execute!(
            std::io::stdout(),
            terminal::EnterAlternateScreen,
            cursor::Hide
        )
        .context("the alternate screen")?;
        Ok(screen)
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        restore();
    }
}

/// Installs a panic hook that runs `restore` before the previous hook
/// prints the panic, so the message lands on a usable terminal.
fn hook_panics(restore: fn()) {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        restore();
        previous(info);
    }));
}

/// Runs the view until `q` or Ctrl-C.
/// Each call goes over a connection from `connect`, kept until a call
/// fails.
pub fn main(connect: &Connect<'_>, args: &TopArgs) -> Result<u8> {
    let term = std::env::var_os("TERM");
    if !std::io::stdout().is_terminal() || term.as_deref() == Some("dumb".as_ref()) {
        bail!("top needs a terminal; `subagent ls --watch` prints plain lines");
    }
    if let Some(s) = &args.session {
        crate::ids::check_session_id(s).map_err(|e| anyhow::anyhow!("--session: {e}"))?;
    }
    let colour = super::style::stdout_colour();
    hook_panics(restore);
    let screen = Screen::enter()?;
    let backend = ratatui::backend::CrosstermBackend::new(std::io::stdout());
    let mut tui = ratatui::Terminal::new(backend).context("the terminal")?;
    tui.clear()?;
    let mut app = App::new(args.session.clone());
    let result = run(connect, &mut tui, &mut app, colour);
    drop(screen);
    result.map(|()| 0)
}

/// Makes a new connection to the daemon.
pub type Connect<'a> = dyn Fn() -> Result<Client> + 'a;

type Tui = ratatui::Terminal<ratatui::backend::CrosstermBackend<std::io::Stdout>>;

/// The loop: fetch every [`REFRESH`], draw, and wait for a key until the
/// next fetch is due.
fn run(connect: &Connect<'_>, tui: &mut Tui, app: &mut App, colour: bool) -> Result<()> {
    let mut client: Option<Client> = None;
    let mut due = Instant::now();
    loop {
        if Instant::now() >= due {
            refresh(connect, &mut client, app);
            due = Instant::now() + REFRESH;
        }
        let now_ms = crate::timefmt::now_ms();
        tui.draw(|f| draw::draw(f, app, colour, now_ms))?;
        let wait = due.saturating_duration_since(Instant::now());
        if !event::poll(wait)? {
            continue;
        }
        let Event::Key(key) = event::read()? else {
            continue;
        };
        if key.kind != KeyEventKind::Press {
            continue;
        }
        match app.on_key(key) {
            Action::Quit => return Ok(()),
            Action::None => {
                if matches!(app.mode, Mode::Log { .. }) && app.log.is_empty() {
                    read_log(app);
                }
            }
            Action::Refresh => due = Instant::now(),
            Action::Cancel(run_id) => {
                app.message = Some(cancel(connect, &mut client, &run_id));
                due = Instant::now();
            }
        }
    }
}

/// One call on the daemon, over the kept connection or a new one; a
/// failed call drops the connection so the next makes a new one.
fn call(
    connect: &Connect<'_>,
    client: &mut Option<Client>,
    method: &str,
    params: serde_json::Value,
) -> Result<serde_json::Value> {
    let c = match client {
        Some(c) => c,
        None => client.insert(connect()?),
    };
    let out = c.call(method, params);
    if out.is_err() {
        *client = None;
    }
    Ok(out?)
}

/// Fetches the runs (and the followed log); a failure is shown and the
/// last runs kept.
fn refresh(connect: &Connect<'_>, client: &mut Option<Client>, app: &mut App) {
    let params = json!({ "session_id": app.session });
    match call(connect, client, "sample_agent_runs", params) {
        Ok(v) => {
            let rows = v["runs"]
                .as_array()
                .map(|a| a.iter().filter_map(data::Row::from_json).collect())
                .unwrap_or_default();
            app.update(rows, Instant::now());
            if app
                .message
                .as_deref()
                .is_some_and(|m| m.starts_with("daemon:"))
            {
                app.message = None;
            }
        }
        Err(e) => {
            let why = crate::sanitize::one_line(&format!("{e:#}"));
            app.message = Some(format!("daemon: {why}"));
        }
    }
    if matches!(app.mode, Mode::Log { .. }) {
        read_log(app);
    }
}

/// Reads the followed run's log end again (bounded, escaped).
fn read_log(app: &mut App) {
    let Mode::Log { path, .. } = &app.mode else {
        return;
    };
    app.log = match path {
        None => vec!["(the daemon gave no log path)".to_owned()],
        Some(p) => match crate::livesample::tail_lines(p, LOG_TAIL_BYTES, LOG_TAIL_LINES) {
            Ok(lines) if lines.is_empty() => vec!["(nothing written yet)".to_owned()],
            Ok(lines) => lines,
            Err(e) if e.is_missing() => vec!["(nothing written yet)".to_owned()],
            Err(e) => vec![crate::sanitize::one_line(&format!("cannot read it: {e}"))],
        },
    };
}

/// Cancels `run_id`; what happened, for the message line.
fn cancel(connect: &Connect<'_>, client: &mut Option<Client>, run_id: &str) -> String {
    match call(
        connect,
        client,
        "cancel_agent_run",
        json!({ "run_id": run_id }),
    ) {
        Ok(_) => format!("cancel requested: {run_id}"),
        Err(e) => crate::sanitize::one_line(&format!("cancel {run_id}: {e:#}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static RESTORED: AtomicUsize = AtomicUsize::new(0);

    fn count_restore() {
        RESTORED.fetch_add(1, Ordering::SeqCst);
    }

    #[test]
    fn a_panic_restores_before_it_is_reported() {
        let before = RESTORED.load(Ordering::SeqCst);
        hook_panics(count_restore);
        let caught = std::panic::catch_unwind(|| panic!("boom"));
        let _ = std::panic::take_hook();
        assert!(caught.is_err());
        assert!(RESTORED.load(Ordering::SeqCst) > before);
    }
}
