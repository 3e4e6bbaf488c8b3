//! Faults of the state database through the real daemon: a state dir that
//! turns read-only under it, a corrupt, foreign or newer state.db at start,
//! and the mark a clean stop leaves for the next start.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use subagentd_e2e::{
    is_root, pids_with, runnable, session, unsafe_kill, wait_until, Conn, Daemon, DaemonOpts,
};

fn ok(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// An ext4 image mounted (no journal, `errors=remount-ro`) as a state dir,
/// which the kernel can be made to turn read-only while files are open
/// for writing: a tmpfs or a bind mount refuses `remount,ro` then (EBUSY).
struct Ext4State {
    dir: tempfile::TempDir,
    image: PathBuf,
    state: PathBuf,
}

impl Ext4State {
    /// `None` (after `SKIPPED: …`) when this host cannot mount one.
    fn mount() -> Option<Ext4State> {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("state.img");
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        let made = is_root()
            && ok(Command::new("truncate").args(["-s", "64M"]).arg(&image))
            && ok(Command::new("mkfs.ext4")
                .args(["-q", "-F", "-O", "^has_journal"])
                .arg(&image));
        let s = Ext4State { dir, image, state };
        let mounted = made && s.attach();
        let trigger = mounted && s.trigger().is_some_and(|t| t.exists());
        if !runnable(
            trigger,
            "ext4_loop",
            "a read-only state dir needs root, loop devices, mkfs.ext4 and ext4's trigger_fs_error",
        ) {
            return None;
        }
        Some(s)
    }

    fn attach(&self) -> bool {
        ok(Command::new("mount")
            .args(["-o", "loop,errors=remount-ro"])
            .arg(&self.image)
            .arg(&self.state))
    }

    /// The file that makes ext4 report an error (and so go read-only).
    fn trigger(&self) -> Option<PathBuf> {
        let out = Command::new("findmnt")
            .args(["-n", "-o", "SOURCE"])
            .arg(&self.state)
            .output()
            .ok()?;
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let name = Path::new(&dev).file_name()?.to_str()?.to_owned();
        Some(PathBuf::from(format!(
            "/sys/fs/ext4/{name}/trigger_fs_error"
        )))
    }

    /// Turns the mounted file system read-only, as a failing disk does.
    fn go_read_only(&self) {
        std::fs::write(self.trigger().unwrap(), "test: read-only state dir\n").unwrap();
        let probe = self.state.join("probe");
        let e = std::fs::write(&probe, b"x").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    }

    /// Unmounts (waiting for the last user to go), repairs the file
    /// system's error mark and mounts it again, writable.
    fn remount_writable(&self) {
        wait_until(Duration::from_secs(20), "the state dir to unmount", || {
            ok(Command::new("umount").arg(&self.state))
        });
        // 0: clean; 1: the error mark (and only it) repaired.
        let fsck = Command::new("e2fsck")
            .arg("-fy")
            .arg(&self.image)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(matches!(fsck.code(), Some(0 | 1)), "e2fsck: {fsck:?}");
        assert!(self.attach(), "mounting the state dir again");
    }
}

impl Drop for Ext4State {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.state).status();
    }
}

fn start(socket: &Path, state: &Path, dir: &Path) -> Child {
    let child = Daemon::spawn_process(socket, state, dir, &DaemonOpts::default());
    wait_until(Duration::from_secs(20), "the daemon", || {
        Conn::try_connect(socket).is_some_and(|mut c| c.call("ping", json!({})).is_ok())
    });
    child
}

fn kill(child: &mut Child) {
    unsafe_kill(child.id() as i32, libc::SIGKILL);
    let _ = child.wait();
}

/// What a finished run leaves that must survive: its status, log and
/// result.md.
fn kept(c: &mut Conn, run: &str) -> (Value, String, String) {
    let st = c
        .call("check_agent_run", json!({"run_id": run}))
        .unwrap_or_else(|e| panic!("check_agent_run {run}: {e}"));
    let log = std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap();
    let result = std::fs::read_to_string(st["result_path"].as_str().unwrap()).unwrap();
    (st, log, result)
}

fn read_only_refusal(e: &Value, state: &Path, what: &str) {
    assert_eq!(e["code"], -32002, "{what}: {e}");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.starts_with("state dir: "), "{what}: {msg}");
    assert!(msg.contains(&*state.to_string_lossy()), "{what}: {msg}");
    assert!(msg.to_lowercase().contains("read-only"), "{what}: {msg}");
}

#[test]
fn a_state_dir_that_turns_read_only_refuses_writes_and_keeps_serving() {
    let Some(fs) = Ext4State::mount() else {
        return;
    };
    let (socket, state) = (fs.dir.path().join("s.sock"), fs.state.clone());
    let mut daemon = start(&socket, &state, fs.dir.path());
    let mut c = Conn::connect(&socket);
    let s = session("ro");
    let done: Vec<String> = (0..2)
        .map(|i| {
            let run = c.spawn(&s, &["sh", "-c", &format!("echo earlier-{i}")], json!({}));
            assert_eq!(c.wait(&run)["state"], "succeeded");
            run
        })
        .collect();
    let before: Vec<_> = done.iter().map(|r| kept(&mut c, r)).collect();
    // A run still going when the disk turns read-only: its cancel must be
    // committed, so it meets the failure at commit time.
    let marker = session("mark");
    let live = c.spawn(
        &s,
        &["sh", "-c", &format!("sleep 4; : {marker}")],
        json!({}),
    );
    wait_until(Duration::from_secs(20), "the run to start", || {
        !pids_with(&marker).is_empty()
    });
    fs.go_read_only();
    let spawn = json!({"session": {"id": s, "audience": "personal", "project_dir": "/tmp"},
                       "task": "t", "command": ["true"]});
    for _ in 0..2 {
        let e = c.call("spawn_agent", spawn.clone()).unwrap_err();
        read_only_refusal(&e, &state, "spawn");
    }
    let e = c
        .call("cancel_agent_run", json!({"run_id": live}))
        .unwrap_err();
    read_only_refusal(&e, &state, "cancel");
    assert!(e["message"].as_str().unwrap().contains("state.db"), "{e}");
    // It goes on serving what it has.
    assert!(c.call("ping", json!({})).is_ok());
    for (run, was) in done.iter().zip(&before) {
        assert_eq!(&kept(&mut c, run), was, "run {run}");
    }
    assert_eq!(c.list_all(json!({"session_id": s})).len(), 3);
    wait_until(Duration::from_secs(20), "the sleep to end", || {
        pids_with(&marker).is_empty()
    });
    assert!(c.call("ping", json!({})).is_ok(), "after the run's end");
    assert!(subagentd_e2e::alive(daemon.id() as i32));
    // Writable again (this kernel keeps an ext4 that failed read-only
    // until it is unmounted): nothing was lost, and spawns work.
    kill(&mut daemon);
    fs.remount_writable();
    let mut daemon = start(&socket, &state, fs.dir.path());
    let mut c = Conn::connect(&socket);
    for (run, was) in done.iter().zip(&before) {
        assert_eq!(&kept(&mut c, run), was, "run {run} after the restart");
    }
    let run = c.spawn(&s, &["sh", "-c", "echo again"], json!({}));
    assert_eq!(c.wait(&run)["state"], "succeeded");
    assert!(kept(&mut c, &run).1.contains("again"));
    let st = c.wait(&live);
    assert!(st["state"].as_str().is_some(), "{st}");
    kill(&mut daemon);
}

/// Starts a daemon over `state` (holding a prepared state.db) and returns
/// its exit status and stderr, failing when it has not exited in 20 s.
fn start_refused(dir: &Path, state: &Path) -> (std::process::ExitStatus, String) {
    let mut child = Daemon::spawn_process(&dir.join("s.sock"), state, dir, &DaemonOpts::default());
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(20) {
            kill(&mut child);
            panic!("the daemon did not exit over a bad state.db");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let log = std::fs::read_to_string(dir.join("daemon.log")).unwrap_or_default();
    (status, log)
}

/// A state.db made by this subagentd, its daemon stopped.
fn made_db(dir: &Path) -> PathBuf {
    let layout = subagentd::paths::StateLayout::new(dir.into());
    drop(subagentd::store::Store::open(&layout).unwrap());
    dir.join("state.db")
}

fn sqlite(db: &Path, sql: &str) {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.execute_batch(sql).unwrap();
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
}

#[test]
fn a_corrupt_foreign_or_newer_state_db_stops_the_start_untouched() {
    type Make = fn(&Path) -> PathBuf;
    let cases: [(&str, Make, &str); 3] = [
        (
            "random bytes",
            |dir| {
                let db = dir.join("state.db");
                let mut bytes = vec![0u8; 64 * 1024];
                let mut x: u32 = 0x9e37_79b9;
                for b in &mut bytes {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    *b = x as u8;
                }
                std::fs::write(&db, bytes).unwrap();
                db
            },
            "restore it from a backup",
        ),
        (
            "another program's SQLite file",
            |dir| {
                let db = dir.join("state.db");
                sqlite(
                    &db,
                    "PRAGMA application_id = 1234; CREATE TABLE notes (id INTEGER, body TEXT);
                     INSERT INTO notes VALUES (1, 'theirs');",
                );
                db
            },
            "Move it away",
        ),
        (
            "a newer schema",
            |dir| {
                let db = made_db(dir);
                sqlite(&db, "PRAGMA user_version = 99;");
                db
            },
            "restore a backup",
        ),
    ];
    for (what, make, advice) in cases {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        let db = make(&state);
        for ext in ["-wal", "-shm"] {
            let _ = std::fs::remove_file(state.join(format!("state.db{ext}")));
        }
        let bytes = std::fs::read(&db).unwrap();
        let t0 = Instant::now();
        let (status, log) = start_refused(dir.path(), &state);
        assert!(!status.success(), "{what}: {status:?}\n{log}");
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{what}: {:?}",
            t0.elapsed()
        );
        assert!(log.contains(&*db.to_string_lossy()), "{what}: {log}");
        assert!(log.contains(advice), "{what}: {log}");
        assert_eq!(std::fs::read(&db).unwrap(), bytes, "{what}: changed");
        assert!(
            !dir.path().join("s.sock").exists(),
            "{what}: the socket is left"
        );
    }
}

/// The daemon's log from byte `from` on, once it holds `needle`.
fn log_after(d: &Daemon, from: usize, needle: &str) -> String {
    let mut got = String::new();
    wait_until(Duration::from_secs(20), needle, || {
        got = d.log().get(from..).unwrap_or_default().to_owned();
        got.contains(needle)
    });
    got
}

#[test]
fn a_clean_stop_skips_the_next_check_and_a_kill_does_not() {
    let mut d = Daemon::start();
    let mut c = d.conn();
    let s = session("clean");
    let run = c.spawn(&s, &["true"], json!({}));
    assert_eq!(c.wait(&run)["state"], "succeeded");
    drop(c);
    assert!(d.stop().success(), "{}", d.log());
    assert!(d.log().contains("state database marked as cleanly stopped"));
    let from = d.log().len();
    d.restart();
    let log = log_after(&d, from, "subagentd listening");
    assert!(
        log.contains("the last stop was clean: integrity check skipped"),
        "{log}"
    );
    assert!(!log.contains("integrity check ran"), "{log}");
    // A kill leaves no mark: the next start checks.
    unsafe_kill(d.pid(), libc::SIGKILL);
    let _ = d.child.wait();
    let from = d.log().len();
    d.restart();
    let log = log_after(&d, from, "subagentd listening");
    assert!(log.contains("the last stop was not clean"), "{log}");
    assert!(log.contains("integrity check ran in"), "{log}");
    let mut c = d.conn();
    assert_eq!(
        c.call("check_agent_run", json!({"run_id": run})).unwrap()["state"],
        "succeeded"
    );
}
