//! `subagent top`'s state and its keys: the runs last fetched, the
//! selection (kept on the same run across refreshes), the filters, and
//! what the screen shows (the table, a run's log, a question). Pure: the
//! loop in `mod.rs` does the calls and the drawing.

use super::data::{cpu_percent, Row};
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

/// Which runs the table shows by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StateFilter {
    #[default]
    All,
    /// Accepted or running.
    Live,
    /// Ended (they stay about a minute after their end).
    Ended,
}

impl StateFilter {
    pub fn name(self) -> &'static str {
        match self {
            StateFilter::All => "all",
            StateFilter::Live => "live",
            StateFilter::Ended => "ended",
        }
    }

    fn next(self) -> StateFilter {
        match self {
            StateFilter::All => StateFilter::Live,
            StateFilter::Live => StateFilter::Ended,
            StateFilter::Ended => StateFilter::All,
        }
    }

    fn admits(self, r: &Row) -> bool {
        match self {
            StateFilter::All => true,
            StateFilter::Live => r.live(),
            StateFilter::Ended => !r.live(),
        }
    }
}

/// What the screen shows.
#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    /// The runs.
    Table,
    /// One run's log, following its end.
    Log {
        run_id: String,
        path: Option<PathBuf>,
    },
    /// "Cancel this run? y/n".
    Confirm { run_id: String },
    /// Typing a session to filter by.
    Session { input: String },
}

/// What the loop must do after a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    None,
    Quit,
    /// Fetch now (a filter changed).
    Refresh,
    /// Cancel this run (confirmed).
    Cancel(String),
}

/// The longest session id typed.
const SESSION_MAX: usize = 64;

/// The view's state.
#[derive(Debug)]
pub struct App {
    /// Every run last fetched, oldest first.
    pub rows: Vec<Row>,
    /// The selected run, by id.
    pub selected: Option<String>,
    /// Only this session's runs (asked of the daemon).
    pub session: Option<String>,
    pub filter: StateFilter,
    pub mode: Mode,
    /// A line for the bottom of the screen (an error, what a key did).
    pub message: Option<String>,
    /// The log's lines in the log view, escaped.
    pub log: Vec<String>,
    /// Each run's CPU time at the previous sample, and when it came.
    cpu_before: HashMap<String, (u64, Instant)>,
}

impl App {
    pub fn new(session: Option<String>) -> App {
        App {
            rows: Vec::new(),
            selected: None,
            session,
            filter: StateFilter::All,
            mode: Mode::Table,
            message: None,
            log: Vec::new(),
            cpu_before: HashMap::new(),
        }
    }

    /// The runs the table shows, in order.
    pub fn visible(&self) -> Vec<&Row> {
        self.rows.iter().filter(|r| self.filter.admits(r)).collect()
    }

    /// The index of the selected run among [`App::visible`]'s, the first
    /// when the selected one is not shown.
    pub fn selected_index(&self) -> Option<usize> {
        let shown = self.visible();
        if shown.is_empty() {
            return None;
        }
        let at = self
            .selected
            .as_ref()
            .and_then(|id| shown.iter().position(|r| &r.run_id == id));
        Some(at.unwrap_or(0))
    }

    fn selected_row(&self) -> Option<&Row> {
        let i = self.selected_index()?;
        self.visible().get(i).copied()
    }

    /// Takes a new fetch (made at `at`): each run's CPU use since the
    /// last one, and the selection kept on its run while it is shown.
    pub fn update(&mut self, mut rows: Vec<Row>, at: Instant) {
        let mut before = HashMap::new();
        for r in &mut rows {
            if let Some(s) = r.sample {
                if let Some((cpu, then)) = self.cpu_before.get(&r.run_id) {
                    let ms = at.saturating_duration_since(*then).as_millis() as u64;
                    r.cpu_pct = cpu_percent(*cpu, s.cpu_ms, ms);
                }
                before.insert(r.run_id.clone(), (s.cpu_ms, at));
            }
        }
        self.cpu_before = before;
        self.rows = rows;
        self.selected = self.selected_row().map(|r| r.run_id.clone());
    }

    fn select_by(&mut self, delta: isize) {
        let shown = self.visible();
        let Some(i) = self.selected_index() else {
            return;
        };
        let last = shown.len().saturating_sub(1) as isize;
        let j = (i as isize + delta).clamp(0, last) as usize;
        self.selected = shown.get(j).map(|r| r.run_id.clone());
    }

    /// What `key` does.
    pub fn on_key(&mut self, key: KeyEvent) -> Action {
        let ctrl_c =
            key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c');
        if ctrl_c {
            return Action::Quit;
        }
        match self.mode.clone() {
            Mode::Table => self.table_key(key.code),
            Mode::Log { .. } => match key.code {
                KeyCode::Esc | KeyCode::Left | KeyCode::Backspace => {
                    self.mode = Mode::Table;
                    self.log.clear();
                    Action::None
                }
                KeyCode::Char('q') => Action::Quit,
                _ => Action::None,
            },
            Mode::Confirm { run_id } => match key.code {
                KeyCode::Char('y' | 'Y') => {
                    self.mode = Mode::Table;
                    Action::Cancel(run_id)
                }
                KeyCode::Char('n' | 'N' | 'q') | KeyCode::Esc => {
                    self.mode = Mode::Table;
                    self.message = Some("not cancelled".into());
                    Action::None
                }
                _ => Action::None,
            },
            Mode::Session { input } => self.session_key(key.code, input),
        }
    }

    fn table_key(&mut self, code: KeyCode) -> Action {
        match code {
            KeyCode::Char('q') => return Action::Quit,
            KeyCode::Up | KeyCode::Char('k') => self.select_by(-1),
            KeyCode::Down | KeyCode::Char('j') => self.select_by(1),
            KeyCode::PageUp => self.select_by(-10),
            KeyCode::PageDown => self.select_by(10),
            KeyCode::Home | KeyCode::Char('g') => self.select_by(isize::MIN / 2),
            KeyCode::End | KeyCode::Char('G') => self.select_by(isize::MAX / 2),
            KeyCode::Enter | KeyCode::Right | KeyCode::Char('l') => {
                if let Some(r) = self.selected_row() {
                    self.mode = Mode::Log {
                        run_id: r.run_id.clone(),
                        path: r.log_path.clone(),
                    };
                }
            }
            KeyCode::Char('c') => match self.selected_row() {
                Some(r) if r.live() => {
                    self.mode = Mode::Confirm {
                        run_id: r.run_id.clone(),
                    }
                }
                Some(r) => self.message = Some(format!("run {} has ended", r.short_id())),
                None => {}
            },
            KeyCode::Char('s' | '/') => {
                self.mode = Mode::Session {
                    input: self.session.clone().unwrap_or_default(),
                }
            }
            KeyCode::Char('f') => {
                self.filter = self.filter.next();
                self.selected = self.selected_row().map(|r| r.run_id.clone());
            }
            KeyCode::Esc => self.message = None,
            _ => {}
        }
        Action::None
    }

    fn session_key(&mut self, code: KeyCode, mut input: String) -> Action {
        match code {
            KeyCode::Esc => self.mode = Mode::Table,
            KeyCode::Enter => {
                let typed = input.trim();
                if typed.is_empty() {
                    self.session = None;
                } else if let Err(e) = crate::ids::check_session_id(typed) {
                    self.message = Some(format!("not a session id: {e}"));
                    return Action::None;
                } else {
                    self.session = Some(typed.to_owned());
                }
                self.mode = Mode::Table;
                self.message = None;
                return Action::Refresh;
            }
            KeyCode::Backspace => {
                input.pop();
                self.mode = Mode::Session { input };
            }
            KeyCode::Char(c) if !c.is_control() && input.chars().count() < SESSION_MAX => {
                input.push(c);
                self.mode = Mode::Session { input };
            }
            _ => {}
        }
        Action::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::record::RunState;

    fn row(id: &str, state: RunState) -> Row {
        Row {
            run_id: format!("20261201T070327.689340Z-{id}"),
            state: Some(state),
            state_name: state.as_str().into(),
            ..Row::default()
        }
    }

    fn key(c: KeyCode) -> KeyEvent {
        KeyEvent::new(c, KeyModifiers::NONE)
    }

    #[test]
    fn the_selection_follows_its_run_and_the_filter() {
        let mut app = App::new(None);
        let now = Instant::now();
        app.update(
            vec![row("a", RunState::Running), row("b", RunState::Succeeded)],
            now,
        );
        assert_eq!(app.selected_index(), Some(0));
        app.on_key(key(KeyCode::Down));
        assert!(app.selected.as_deref().unwrap().ends_with("-b"));
        // A run before it appears: the selection stays on b.
        app.update(
            vec![
                row("0", RunState::Running),
                row("a", RunState::Running),
                row("b", RunState::Succeeded),
            ],
            now,
        );
        assert_eq!(app.selected_index(), Some(2));
        app.on_key(key(KeyCode::Char('f')));
        assert_eq!(app.filter, StateFilter::Live);
        assert_eq!(app.visible().len(), 2);
        app.on_key(key(KeyCode::Char('f')));
        assert_eq!(app.filter, StateFilter::Ended);
        assert_eq!(app.visible().len(), 1);
        app.on_key(key(KeyCode::Char('f')));
        assert_eq!(app.filter, StateFilter::All);
    }

    #[test]
    fn cancel_asks_first_and_only_for_a_live_run() {
        let mut app = App::new(None);
        app.update(
            vec![row("a", RunState::Running), row("b", RunState::Failed)],
            Instant::now(),
        );
        app.on_key(key(KeyCode::Char('c')));
        let id = app.rows[0].run_id.clone();
        assert_eq!(app.mode, Mode::Confirm { run_id: id.clone() });
        assert_eq!(app.on_key(key(KeyCode::Char('x'))), Action::None);
        assert_eq!(app.on_key(key(KeyCode::Char('n'))), Action::None);
        assert_eq!(app.mode, Mode::Table);
        app.on_key(key(KeyCode::Char('c')));
        assert_eq!(app.on_key(key(KeyCode::Char('y'))), Action::Cancel(id));
        app.on_key(key(KeyCode::Down));
        app.on_key(key(KeyCode::Char('c')));
        assert_eq!(app.mode, Mode::Table, "an ended run is not asked about");
        assert!(app.message.as_deref().unwrap().contains("has ended"));
    }

    #[test]
    fn keys_for_the_log_the_session_and_quitting() {
        let mut app = App::new(Some("s1".into()));
        app.update(vec![row("a", RunState::Running)], Instant::now());
        app.on_key(key(KeyCode::Enter));
        assert!(matches!(app.mode, Mode::Log { .. }));
        app.on_key(key(KeyCode::Esc));
        assert_eq!(app.mode, Mode::Table);
        app.on_key(key(KeyCode::Char('/')));
        assert_eq!(app.mode, Mode::Session { input: "s1".into() });
        for c in [KeyCode::Backspace, KeyCode::Backspace] {
            app.on_key(key(c));
        }
        app.on_key(key(KeyCode::Char('x')));
        assert_eq!(app.on_key(key(KeyCode::Enter)), Action::Refresh);
        assert_eq!(app.session.as_deref(), Some("x"));
        app.on_key(key(KeyCode::Char('s')));
        app.on_key(key(KeyCode::Char('/')));
        assert_eq!(app.on_key(key(KeyCode::Enter)), Action::None, "x/ is no id");
        app.on_key(key(KeyCode::Esc));
        assert_eq!(app.session.as_deref(), Some("x"));
        assert_eq!(app.on_key(key(KeyCode::Char('q'))), Action::Quit);
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        app.on_key(key(KeyCode::Enter));
        assert_eq!(app.on_key(ctrl_c), Action::Quit, "also in the log view");
    }

    #[test]
    fn cpu_percent_comes_from_two_samples() {
        let mut app = App::new(None);
        let t0 = Instant::now();
        let mut r = row("a", RunState::Running);
        r.sample = Some(super::super::data::Sample {
            cpu_ms: 1000,
            ..Default::default()
        });
        app.update(vec![r.clone()], t0);
        assert_eq!(app.rows[0].cpu_pct, None);
        r.sample = Some(super::super::data::Sample {
            cpu_ms: 1500,
            ..Default::default()
        });
        app.update(vec![r], t0 + std::time::Duration::from_secs(1));
        assert_eq!(app.rows[0].cpu_pct, Some(50.0));
    }
}
