//! A terminal for tests of full-screen programs: a tmux server of its own
//! (`-L`, no config) with one detached session of a fixed size running a
//! plain bash; keys are sent with `send-keys`, the screen is read with
//! `capture-pane`, and each wait polls the screen until a deadline,
//! failing with the last screen seen.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// How long a screen is waited for.
pub const SCREEN_WAIT: Duration = Duration::from_secs(30);

/// One tmux server and its session; the server is killed on drop.
pub struct Tmux {
    server: String,
}

/// Whether tmux is on this host.
pub fn available() -> bool {
    Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
}

impl Tmux {
    /// A session of `cols` x `rows` running bash (no rc files, prompt
    /// `$ `, NO_COLOR unset) in `/tmp`, with `env` set; `None` (after
    /// `SKIPPED: …`, or failing under CI) when tmux is missing.
    pub fn start(cols: u16, rows: u16, env: &[(&str, &str)]) -> Option<Tmux> {
        if !crate::runnable(available(), "tmux", "tmux is not installed") {
            return None;
        }
        let t = Tmux {
            server: crate::session("sa-tmux"),
        };
        let mut shell = vec!["env".to_owned(), "-u".into(), "NO_COLOR".into()];
        shell.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
        shell.extend(["PS1=$ ", "bash", "--norc", "--noprofile"].map(String::from));
        let out = t.run(
            &[
                "new-session",
                "-d",
                "-s",
                "t",
                "-x",
                &cols.to_string(),
                "-y",
                &rows.to_string(),
                "-c",
                "/tmp",
            ],
            &shell,
        );
        assert!(out.status.success(), "tmux new-session: {out:?}");
        // capture-pane drops the prompt's trailing space.
        t.wait_for("the shell's prompt", |s| {
            s.lines().any(|l| l.trim_end() == "$")
        });
        Some(t)
    }

    fn run(&self, args: &[&str], rest: &[String]) -> Output {
        Command::new("tmux")
            .args(["-L", &self.server, "-f", "/dev/null"])
            .args(args)
            .args(rest)
            .output()
            .unwrap()
    }

    /// `send-keys` of each key name (`Enter`, `Escape`, `y`, …).
    pub fn keys(&self, keys: &[&str]) {
        let rest: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
        let out = self.run(&["send-keys", "-t", "t"], &rest);
        assert!(out.status.success(), "send-keys {keys:?}: {out:?}");
    }

    /// Types `line` literally, then Enter.
    pub fn type_line(&self, line: &str) {
        let out = self.run(&["send-keys", "-t", "t", "-l"], &[line.to_owned()]);
        assert!(out.status.success(), "send-keys -l: {out:?}");
        self.keys(&["Enter"]);
    }

    /// The screen as text.
    pub fn screen(&self) -> String {
        let out = self.run(&["capture-pane", "-p", "-t", "t"], &[]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The screen with its attributes as escape sequences (`-e`), from
    /// `from` lines of history on (0: the visible screen).
    pub fn screen_styled(&self, from: i32) -> String {
        let start = from.to_string();
        let out = self.run(&["capture-pane", "-p", "-e", "-S", &start, "-t", "t"], &[]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A `display -p` format (`#{alternate_on}`) of the pane.
    pub fn display(&self, format: &str) -> String {
        let out = self.run(&["display", "-p", "-t", "t"], &[format.to_owned()]);
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Polls the screen until `cond` holds; fails after [`SCREEN_WAIT`]
    /// showing the last screen. Returns the screen that matched.
    pub fn wait_for(&self, what: &str, cond: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + SCREEN_WAIT;
        loop {
            let s = self.screen();
            if cond(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {SCREEN_WAIT:?} waiting for {what}; the screen:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Polls `display -p format` until it is `want`.
    pub fn wait_display(&self, format: &str, want: &str) {
        let deadline = Instant::now() + SCREEN_WAIT;
        loop {
            let got = self.display(format);
            if got == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {format} to be {want} (it is {got}); the screen:\n{}",
                self.screen()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The command line that runs `subagent` against the daemon at
    /// `socket` with state dir `state`.
    pub fn subagent(socket: &Path, state: &Path) -> String {
        format!(
            "{} --socket {} --state-dir {}",
            crate::bin("subagent").display(),
            socket.display(),
            state.display()
        )
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"], &[]);
    }
}
