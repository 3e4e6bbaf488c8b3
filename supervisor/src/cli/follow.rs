//! Reading a run's child.log from the file itself, so it works for ended
//! runs and while the daemon is down. Following stops once the run has
//! ended and everything it wrote has been printed.

use super::linetimes::{LineTimes, Stamper, Stamping};
use crate::run::record::{RunRecord, RunState};
use crate::sanitize::TerminalWriter;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use std::fs::File;
use std::io::{IsTerminal, Read, Seek, SeekFrom, Write};
use std::os::fd::AsFd;
use std::path::Path;

/// Whether the run in `dir` has ended, judged without the daemon: the
/// runner wrote exit.json (after the last byte of the log), its state dir's
/// database says it is in a terminal state, or says running but the
/// runner's lock is free (the runner died without an exit.json). A free
/// lock alone proves nothing: the daemon creates it just before it starts
/// the runner. The database is the state dir's above `dir`, else `db`
/// (run folders of a Slurm backend live in its shared dir).
pub fn run_ended(dir: &Path, db: Option<&Path>) -> bool {
    if dir.join("exit.json").exists() {
        return true;
    }
    match stored(dir, db) {
        Some(r) if r.state().is_terminal() => true,
        Some(r) if r.state() == RunState::Running => {
            crate::lockfile::is_held(&dir.join("runner.lock")) == Some(false)
        }
        _ => false,
    }
}

/// The record of the run in `dir`, read from its state dir's database
/// (else from `db`).
fn stored(dir: &Path, db: Option<&Path>) -> Option<RunRecord> {
    let id = crate::ids::RunId::parse(dir.file_name()?.to_str()?)?;
    let above = crate::paths::StateLayout::of_run_dir(dir)
        .map(|l| l.db())
        .filter(|p| p.exists());
    let db = above.or_else(|| db.map(Path::to_path_buf))?;
    let store = crate::store::Store::open_read_only(&db).ok()?;
    match store.get(&id).ok()?? {
        crate::store::Stored::Live(r) => Some(*r),
        crate::store::Stored::Pruned { .. } => None,
    }
}

fn copy_from(f: &mut File, out: &mut dyn Write, buf: &mut [u8]) -> std::io::Result<u64> {
    let mut total = 0;
    loop {
        let n = f.read(buf)?;
        if n == 0 {
            out.flush()?;
            return Ok(total);
        }
        out.write_all(&buf[..n])?;
        total += n as u64;
    }
}

/// Where a run's log is: its folder, and the daemon's database for when
/// the folder is not in the state dir (see [`run_ended`]).
#[derive(Debug, Clone, Copy)]
pub struct RunLog<'a> {
    /// The run folder.
    pub dir: &'a Path,
    /// The daemon's state.db.
    pub db: Option<&'a Path>,
}

/// Prints child.log of the run in `at` from byte `from`; with `follow`,
/// keeps printing what is appended until the run has ended and the log is
/// drained.
pub fn print_log(
    at: RunLog<'_>,
    from: u64,
    follow: bool,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let dir = at.dir;
    let log = dir.join("child.log");
    let mut buf = vec![0u8; 256 * 1024];
    let inotify = if follow {
        Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .and_then(|i| {
                i.add_watch(
                    dir,
                    AddWatchFlags::IN_MODIFY
                        | AddWatchFlags::IN_CREATE
                        | AddWatchFlags::IN_MOVED_TO
                        | AddWatchFlags::IN_CLOSE_WRITE
                        | AddWatchFlags::IN_ATTRIB,
                )
                .map(|_| i)
            })
            .ok()
    } else {
        None
    };
    let mut file: Option<File> = None;
    loop {
        if file.is_none() {
            if let Ok(mut f) = File::open(&log) {
                f.seek(SeekFrom::Start(from))?;
                file = Some(f);
            }
        }
        // Check for the end before draining: whatever the run wrote before
        // it ended is then certainly read below.
        let ended = !follow || run_ended(dir, at.db);
        if let Some(f) = file.as_mut() {
            copy_from(f, out, &mut buf)?;
        }
        if ended {
            return Ok(());
        }
        match &inotify {
            Some(i) => {
                let mut fds = [PollFd::new(i.as_fd(), PollFlags::POLLIN)];
                let _ = poll(&mut fds, PollTimeout::from(250u16));
                while let Ok(events) = i.read_events() {
                    if events.is_empty() {
                        break;
                    }
                }
            }
            None => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    }
}

/// Prints child.log as [`print_log`] does, to stdout: on a terminal its
/// control characters and escape sequences are shown visibly (see
/// [`crate::sanitize`]) unless `raw`; to a pipe or file the bytes pass
/// unchanged.
pub fn print_log_to_stdout(
    at: RunLog<'_>,
    from: u64,
    follow: bool,
    raw: bool,
) -> std::io::Result<()> {
    print_log_stamped(at, from, follow, raw, None)
}

/// [`print_log_to_stdout`], each line with its time or from a time on
/// when `stamps` says so (`from` is then a line start).
pub fn print_log_stamped(
    dir: RunLog<'_>,
    from: u64,
    follow: bool,
    raw: bool,
    stamps: Option<(LineTimes, Stamping)>,
) -> std::io::Result<()> {
    let stdout = std::io::stdout();
    let terminal = !raw && stdout.is_terminal();
    let mut out = stdout.lock();
    if !terminal {
        return print_through(dir, from, follow, &mut out, stamps);
    }
    let mut shown = TerminalWriter::new(out);
    let printed = print_through(dir, from, follow, &mut shown, stamps);
    // A sequence cut at the very end is shown as its bytes.
    let finished = shown.finish();
    printed.and(finished)
}

/// [`print_log`] to `out`, through a [`Stamper`] when `stamps` says so.
fn print_through(
    dir: RunLog<'_>,
    from: u64,
    follow: bool,
    out: &mut dyn Write,
    stamps: Option<(LineTimes, Stamping)>,
) -> std::io::Result<()> {
    match stamps {
        Some((times, how)) => {
            print_log(dir, from, follow, &mut Stamper::new(out, times, how, from))
        }
        None => print_log(dir, from, follow, out),
    }
}
