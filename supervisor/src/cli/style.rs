//! When the CLI uses colour, and which: only for a terminal whose TERM is
//! not `dumb`, and never while NO_COLOR is set to anything but the empty
//! string (no-color.org). A run's state has one colour everywhere (`ls`,
//! `check`, `top`).

use crate::run::record::RunState;
use std::ffi::OsStr;
use std::io::IsTerminal;

/// The rule itself: colour for a terminal (`terminal`) whose `term` is not
/// `dumb`, with `no_color` unset or empty.
pub fn colour_allowed(terminal: bool, term: Option<&OsStr>, no_color: Option<&OsStr>) -> bool {
    terminal && term != Some(OsStr::new("dumb")) && no_color.is_none_or(OsStr::is_empty)
}

/// Whether stdout gets colour, by [`colour_allowed`] and this process's
/// environment.
pub fn stdout_colour() -> bool {
    colour_allowed(
        std::io::stdout().is_terminal(),
        std::env::var_os("TERM").as_deref(),
        std::env::var_os("NO_COLOR").as_deref(),
    )
}

/// A state's colour: one of the eight ANSI colours (30 + this is its SGR
/// foreground code), `None` to leave it plain.
pub fn state_colour(state: RunState) -> Option<u8> {
    match state {
        RunState::Accepted => Some(3),                       // yellow
        RunState::Running => Some(6),                        // cyan
        RunState::Succeeded => Some(2),                      // green
        RunState::Failed | RunState::Lost => Some(1),        // red
        RunState::TimedOut | RunState::Cancelled => Some(5), // magenta
    }
}

/// `text` (a state's name, perhaps padded) in the colour of the state it
/// names when `colour`; anything else unchanged.
pub fn paint_state(text: &str, colour: bool) -> String {
    let code = RunState::parse(text.trim()).and_then(state_colour);
    match code {
        Some(c) if colour => {
            let name = text.trim_end();
            let pad = &text[name.len()..];
            format!("\x1b[{}m{name}\x1b[0m{pad}", 30 + u32::from(c))
        }
        _ => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_that_is_not_dumb_without_no_color() {
        let os = |s: &'static str| Some(OsStr::new(s));
        assert!(colour_allowed(true, os("xterm-256color"), None));
        assert!(colour_allowed(true, None, None));
        assert!(colour_allowed(true, os("screen"), os("")), "empty NO_COLOR");
        assert!(!colour_allowed(false, os("xterm"), None), "a pipe");
        assert!(!colour_allowed(true, os("dumb"), None));
        assert!(!colour_allowed(true, os("xterm"), os("1")));
        assert!(!colour_allowed(true, os("xterm"), os("0")), "any value");
    }

    #[test]
    fn a_state_is_painted_inside_its_padding() {
        assert_eq!(paint_state("running  ", true), "\x1b[36mrunning\x1b[0m  ");
        assert_eq!(paint_state("failed", true), "\x1b[31mfailed\x1b[0m");
        assert_eq!(paint_state("running  ", false), "running  ");
        assert_eq!(paint_state("STATE", true), "STATE", "not a state");
    }
}
