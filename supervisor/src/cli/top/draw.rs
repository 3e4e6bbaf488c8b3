//! Drawing `subagent top`: a title line, the runs' table (or one run's
//! log), and a line for keys, questions and messages. Every text drawn
//! that a run wrote was escaped before it got here; colour only where the
//! style rule allows it (the selection is shown reversed either way).

use super::model::{App, Mode};
use crate::run::record::RunState;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row as TableRow, Table, TableState};
use ratatui::Frame;

/// The columns: header, width (0: what is left) and rank: a column of
/// rank r is left out when the screen is too narrow for every column of
/// rank r or below and a last line of [`LAST_LINE_MIN`] (rank 0: always).
const COLUMNS: [(&str, u16, u8); 13] = [
    ("RUN", 8, 0),
    ("SESSION", 12, 0),
    ("STATE", 10, 0),
    ("ELAPSED", 7, 0),
    ("CPU", 6, 0),
    ("CPU%", 4, 0),
    ("MEM", 7, 0),
    ("PROCS", 5, 4),
    ("EGRESS", 7, 3),
    ("TOKENS", 11, 1),
    ("COST", 7, 2),
    ("TURNS", 5, 5),
    ("LAST LINE", 0, 0),
];

/// The narrowest last line kept while columns can be left out for it.
const LAST_LINE_MIN: u16 = 24;

/// The columns shown on a screen `width` wide, by index.
fn shown_columns(width: u16) -> Vec<usize> {
    let mut rank = COLUMNS.iter().map(|c| c.2).max().unwrap_or(0);
    loop {
        let cols: Vec<usize> = (0..COLUMNS.len())
            .filter(|&i| COLUMNS[i].2 <= rank)
            .collect();
        let fixed: u16 = cols.iter().map(|&i| COLUMNS[i].1 + 1).sum();
        if fixed + LAST_LINE_MIN <= width || rank == 0 {
            return cols;
        }
        rank -= 1;
    }
}

/// A state's colour on the screen, when colour is on.
fn state_style(state: Option<RunState>, colour: bool) -> Style {
    let code = state.and_then(crate::cli::style::state_colour);
    match code {
        Some(c) if colour => Style::default().fg(match c {
            1 => Color::Red,
            2 => Color::Green,
            3 => Color::Yellow,
            5 => Color::Magenta,
            6 => Color::Cyan,
            _ => Color::Reset,
        }),
        _ => Style::default(),
    }
}

/// Draws the whole screen.
pub fn draw(f: &mut Frame<'_>, app: &App, colour: bool, now_ms: u64) {
    let [title, body, foot] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Fill(1),
        Constraint::Length(1),
    ])
    .areas(f.area());
    f.render_widget(Paragraph::new(title_line(app, now_ms)), title);
    match &app.mode {
        Mode::Log { run_id, path } => {
            let shown = path.as_ref().map_or(String::new(), |p| {
                crate::sanitize::one_line(&p.to_string_lossy())
            });
            let head = format!("log of {run_id}  {shown}");
            let [h, rest] =
                Layout::vertical([Constraint::Length(1), Constraint::Fill(1)]).areas(body);
            let bold = Style::default().add_modifier(Modifier::BOLD);
            f.render_widget(Paragraph::new(Span::styled(head, bold)), h);
            log_lines(f, app, rest);
        }
        _ => table(f, app, colour, now_ms, body),
    }
    f.render_widget(Paragraph::new(foot_line(app)), foot);
}

fn title_line(app: &App, now_ms: u64) -> Line<'static> {
    let live = app.rows.iter().filter(|r| r.live()).count();
    let session = app.session.as_deref().unwrap_or("all");
    let clock = crate::timefmt::rfc3339_ms(now_ms);
    let text = format!(
        "subagent top  {} runs, {live} live  session: {}  state: {}  {}",
        app.rows.len(),
        crate::sanitize::one_line(session),
        app.filter.name(),
        clock.get(11..19).unwrap_or(&clock),
    );
    Line::from(Span::styled(
        text,
        Style::default().add_modifier(Modifier::BOLD),
    ))
}

fn foot_line(app: &App) -> Line<'static> {
    let text = match &app.mode {
        Mode::Confirm { run_id } => format!("cancel run {run_id}? (y/n)"),
        Mode::Session { input } => format!("session (empty: all; Enter, Esc): {input}_"),
        Mode::Log { .. } => "Esc back  q quit".to_owned(),
        Mode::Table => {
            let keys = "↑↓ select  Enter log  c cancel  s session  f state  q quit";
            match &app.message {
                Some(m) => format!("{m}  |  {keys}"),
                None => keys.to_owned(),
            }
        }
    };
    let style = match app.mode {
        Mode::Confirm { .. } => Style::default().add_modifier(Modifier::BOLD),
        _ => Style::default(),
    };
    Line::from(Span::styled(text, style))
}

fn table(f: &mut Frame<'_>, app: &App, colour: bool, now_ms: u64, area: Rect) {
    let cols = shown_columns(area.width);
    let shown = app.visible();
    let rows = shown.iter().map(|r| {
        let cells = [
            r.short_id().to_owned(),
            r.session_id.clone(),
            r.state_cell(),
            r.elapsed(now_ms),
            r.cpu_time_cell(),
            r.cpu_pct_cell(),
            r.memory_cell(),
            r.processes_cell(),
            r.egress_cell(),
            r.tokens_cell(),
            r.cost_cell(),
            r.usage.turns.map_or(String::new(), |t| t.to_string()),
            r.last_line.clone().unwrap_or_default(),
        ];
        TableRow::new(cols.iter().map(|&i| {
            let cell = Cell::from(cells[i].clone());
            if COLUMNS[i].0 == "STATE" {
                cell.style(state_style(r.state, colour))
            } else {
                cell
            }
        }))
    });
    let widths = cols.iter().map(|&i| match COLUMNS[i].1 {
        0 => Constraint::Fill(1),
        w => Constraint::Length(w),
    });
    let header = TableRow::new(cols.iter().map(|&i| COLUMNS[i].0))
        .style(Style::default().add_modifier(Modifier::BOLD | Modifier::UNDERLINED));
    let t = Table::new(rows, widths)
        .header(header)
        .column_spacing(1)
        .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED));
    if shown.is_empty() {
        let none = Paragraph::new("(no runs: live ones, and those ended in the last minute)");
        let [h, rest] = Layout::vertical([Constraint::Length(1), Constraint::Fill(1)]).areas(area);
        f.render_widget(t, h);
        f.render_widget(none, rest);
        return;
    }
    let mut state = TableState::default().with_selected(app.selected_index());
    f.render_stateful_widget(t, area, &mut state);
}

/// The log view's body: the last lines that fit.
fn log_lines(f: &mut Frame<'_>, app: &App, area: Rect) {
    let fit = usize::from(area.height);
    let skip = app.log.len().saturating_sub(fit);
    let lines: Vec<Line<'_>> = app.log[skip..]
        .iter()
        .map(|l| Line::from(l.as_str()))
        .collect();
    f.render_widget(Paragraph::new(lines), area);
}

#[cfg(test)]
mod tests {
    use super::super::data::Row;
    use super::*;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    fn screen(app: &App, colour: bool) -> ratatui::buffer::Buffer {
        let mut t = Terminal::new(TestBackend::new(160, 12)).unwrap();
        t.draw(|f| draw(f, app, colour, 0)).unwrap();
        t.backend().buffer().clone()
    }

    fn text(buf: &ratatui::buffer::Buffer) -> String {
        let mut out = String::new();
        for y in 0..buf.area.height {
            for x in 0..buf.area.width {
                out.push_str(buf[(x, y)].symbol());
            }
            out.push('\n');
        }
        out
    }

    fn app_with(last: &str) -> App {
        let mut app = App::new(None);
        let r = Row::from_json(&serde_json::json!({
            "run_id": "20261201T070327.689340Z-3cdd0df8", "session_id": "s1",
            "state": "running", "last_line": last,
        }))
        .unwrap();
        app.update(vec![r], std::time::Instant::now());
        app
    }

    #[test]
    fn a_hostile_last_line_is_drawn_escaped() {
        let app = app_with("x\u{1b}]0;pwned\u{7}\u{1b}[2J");
        let shown = text(&screen(&app, true));
        assert!(shown.contains("3cdd0df8"), "{shown}");
        assert!(shown.contains("x\\x1b]0;pwned\\x07\\x1b[2J"), "{shown}");
    }

    #[test]
    fn a_narrow_screen_leaves_columns_out_for_the_last_line() {
        let all: Vec<usize> = (0..COLUMNS.len()).collect();
        assert_eq!(shown_columns(160), all);
        let narrow = shown_columns(80);
        let names: Vec<&str> = narrow.iter().map(|&i| COLUMNS[i].0).collect();
        assert_eq!(
            names,
            [
                "RUN",
                "SESSION",
                "STATE",
                "ELAPSED",
                "CPU",
                "CPU%",
                "MEM",
                "LAST LINE"
            ]
        );
        assert_eq!(shown_columns(10).len(), 8, "never fewer than rank 0");
        let mut app = app_with("last words here");
        app.rows[0].usage.input_tokens = Some(5);
        let mut t = Terminal::new(TestBackend::new(80, 6)).unwrap();
        t.draw(|f| draw(f, &app, false, 0)).unwrap();
        let shown = text(t.backend().buffer());
        assert!(shown.contains("last words here"), "{shown}");
        assert!(!shown.contains("TOKENS"), "{shown}");
    }

    #[test]
    fn no_colour_means_no_colour() {
        let app = app_with("hello");
        let colours = |buf: &ratatui::buffer::Buffer| {
            buf.content()
                .iter()
                .filter(|c| c.fg != Color::Reset || c.bg != Color::Reset)
                .count()
        };
        assert!(colours(&screen(&app, true)) > 0, "the state is coloured");
        assert_eq!(colours(&screen(&app, false)), 0);
    }
}
