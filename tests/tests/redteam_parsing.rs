//! Red team: files a child can write that the daemon parses or compares.
//!
//! A planted definition whose YAML aliases expand to millions of nodes
//! (a few KB of text), and index entries flagged for git to skip before
//! the child edits them. Each attack runs as a real child through the
//! real daemon and is judged from outside: how long the next spawn and
//! `subagent agents` take, the daemon's peak memory, another project's
//! spawn meanwhile, what the run's observation and result.md show.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use subagentd_e2e::{bin, runnable, session, wait_until, Daemon};

/// How long a run of a few commands may take to be final.
const RUN_LIMIT: Duration = Duration::from_secs(30);
/// The daemon's peak resident memory must stay under this.
const HWM_BOUND_KIB: u64 = 200 * 1024;
/// A spawn or a listing must answer within this (the bomb made it 3 to
/// 12 s, and 1.6 GB).
const ANSWER_LIMIT: Duration = Duration::from_secs(2);
/// The address space `subagent agents` is given (the bomb needs more).
const CLI_AS_BYTES: u64 = 1 << 30;

/// A daemon and a project dir for one attack.
struct Env {
    d: Daemon,
    project: tempfile::TempDir,
}

/// A daemon for one attack; `None` (after `SKIPPED: …`) when the host
/// cannot enforce the default requirements.
fn env() -> Option<Env> {
    for m in subagentd_e2e::missing_mechanisms() {
        if !runnable(false, &m, &format!("this host cannot enforce {m}")) {
            return None;
        }
    }
    let d = Daemon::start();
    let project = public_dir("sa-rtp-proj-");
    Some(Env { d, project })
}

/// A temp dir under /tmp that others may traverse and read (0755), so a
/// child running as another uid can still name what is in it.
fn public_dir(prefix: &str) -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

impl Env {
    fn params(&self, project: &Path, command: Value, extra: Value) -> Value {
        let mut p = json!({
            "session": {"id": session("rtp"), "audience": "personal", "project_dir": project},
            "task": "red team",
            "command": command,
        });
        if let Value::Object(m) = extra {
            for (k, v) in m {
                p[k] = v;
            }
        }
        p
    }

    /// Runs a shell script as a child with the write right, to its end.
    fn sh_writing(&self, script: &str, env: Value) -> (Value, String) {
        let extra = json!({"sandbox": {"write_project": true}, "env": env});
        let p = self.params(self.project.path(), json!(["sh", "-c", script]), extra);
        let mut c = self.d.conn();
        let r = c
            .call("spawn_agent", p)
            .unwrap_or_else(|e| panic!("spawn refused: {e}"));
        let run = r["run_id"].as_str().unwrap().to_owned();
        let st = c
            .call(
                "wait_agent_run",
                json!({"run_id": run, "timeout_ms": RUN_LIMIT.as_millis() as u64}),
            )
            .unwrap();
        let log = std::fs::read(st["log_path"].as_str().unwrap())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        println!("run {run}: {}\n{log}", st["state"]);
        (st, log)
    }

    /// Asks to spawn definition `agent` in `project`: the answer and how
    /// long it took.
    fn spawn_agent(&self, project: &Path, agent: &str) -> (Result<Value, Value>, Duration) {
        let p = self.params(project, json!(["true"]), json!({"agent": agent}));
        let started = Instant::now();
        let r = self.d.conn().call("spawn_agent", p);
        (r, started.elapsed())
    }
}

/// A field of /proc/PID/status (e.g. `VmHWM`), as a number.
fn proc_status(pid: i32, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// A definition of 25 KB whose `y` is 2,500 aliases of a list of 5,000
/// scalars: 12.5 million nodes to a parser that expands aliases.
fn bomb(name: &str) -> String {
    let x = vec!["a"; 5000].join(", ");
    let y = vec!["*x"; 2500].join(", ");
    format!("---\nname: {name}\ndescription: expands\nx: &x [{x}]\ny: [{y}]\n---\nBody.\n")
}

/// Plants `files` (path in the project, text) through a child with the
/// write right.
fn plant(e: &Env, files: &[(&str, String)]) {
    let mut script = String::new();
    let mut vars = serde_json::Map::new();
    for (i, (path, text)) in files.iter().enumerate() {
        script.push_str(&format!(
            "mkdir -p \"$(dirname {path})\" && printf '%s' \"$F{i}\" > {path} && "
        ));
        vars.insert(format!("F{i}"), json!(text));
    }
    script.push_str("echo planted");
    let (_, log) = e.sh_writing(&script, Value::Object(vars));
    assert!(log.contains("planted"), "{log}");
}

/// `subagent --json agents` for `project` within [`CLI_AS_BYTES`] of
/// address space: the listing (None if it printed none), exit code, time.
fn agents_listing(project: &Path) -> (Option<Value>, Option<i32>, Duration) {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(bin("subagent"));
    cmd.args(["--json", "agents", "--project-dir"])
        .arg(project)
        .env_remove("SUBAGENTD_CONFIG")
        .stdin(Stdio::null());
    // SAFETY: setrlimit is async-signal-safe and touches only the limit
    // struct on this stack frame.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: CLI_AS_BYTES,
                rlim_max: CLI_AS_BYTES,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let started = Instant::now();
    let out = cmd.output().unwrap();
    let took = started.elapsed();
    println!("subagent agents: {}", String::from_utf8_lossy(&out.stderr));
    (
        serde_json::from_slice(&out.stdout).ok(),
        out.status.code(),
        took,
    )
}

/// A child with the write right leaves a 25 KB alias bomb in
/// `.subagents/bomb.md` and another in `.claude/agents/bomb2.md`. The next
/// spawn of it in that project and `subagent agents` there (with 1 GiB
/// of address space) must answer within 2 s, both files refused for
/// their aliases, and the daemon's peak memory stay under 200 MiB.
#[test]
fn a_planted_alias_bomb_is_refused_quickly_in_bounded_memory() {
    let Some(e) = env() else { return };
    plant(
        &e,
        &[
            (".subagents/bomb.md", bomb("bomb")),
            (".claude/agents/bomb2.md", bomb("bomb2")),
        ],
    );
    let (r, took) = e.spawn_agent(e.project.path(), "bomb");
    println!("spawn of the bomb: {took:?}: {r:?}");
    let err = r
        .expect_err("a definition that uses aliases was run")
        .to_string();
    assert!(err.contains("aliases"), "{err}");
    assert!(took < ANSWER_LIMIT, "the spawn took {took:?}");
    let hwm = proc_status(e.d.pid(), "VmHWM").unwrap();
    println!("daemon VmHWM: {hwm} KiB");
    assert!(hwm < HWM_BOUND_KIB, "the daemon's peak memory: {hwm} KiB");
    let (listing, code, took) = agents_listing(e.project.path());
    println!("subagent agents: {took:?}, exit {code:?}");
    let listing = listing.expect("subagent agents printed no listing");
    let errors = listing["errors"].to_string();
    for file in ["bomb.md", "bomb2.md"] {
        assert!(errors.contains(file), "{file}: {errors}");
    }
    assert!(errors.matches("aliases").count() >= 2, "{errors}");
    assert_eq!(code, Some(1), "{listing}");
    assert!(took < ANSWER_LIMIT, "subagent agents took {took:?}");
}

/// While the daemon reads four planted alias bombs of one project (a
/// spawn there, on a thread), a spawn of a plain definition in another
/// project, from another session, must answer within 2 s: no lock is
/// held across one project's parse.
#[test]
fn a_bomb_parse_holds_up_no_other_projects_spawn() {
    let Some(e) = env() else { return };
    let files: Vec<(String, String)> = (1..=4)
        .map(|i| (format!(".subagents/bomb{i}.md"), bomb(&format!("bomb{i}"))))
        .collect();
    let refs: Vec<(&str, String)> = files.iter().map(|(p, t)| (p.as_str(), t.clone())).collect();
    plant(&e, &refs);
    let other = public_dir("sa-rtp-other-");
    let good = "---\nname: good\ndescription: plain\n---\nBody.\n";
    std::fs::create_dir_all(other.path().join(".subagents")).unwrap();
    std::fs::write(other.path().join(".subagents/good.md"), good).unwrap();
    let env = std::sync::Arc::new(e);
    let bombing = {
        let env = env.clone();
        std::thread::spawn(move || env.spawn_agent(env.project.path(), "bomb1"))
    };
    // Until the bomb's parse has visibly started, or already ended.
    let pid = env.d.pid();
    let base = proc_status(pid, "VmRSS").unwrap_or(0);
    wait_until(Duration::from_secs(20), "the bomb's spawn", || {
        bombing.is_finished() || proc_status(pid, "VmRSS").unwrap_or(0) > base + 50 * 1024
    });
    let (r, took) = env.spawn_agent(other.path(), "good");
    println!("the other project's spawn: {took:?}: {r:?}");
    assert_eq!(r.unwrap()["state"], "accepted");
    assert!(
        took < ANSWER_LIMIT,
        "the other project's spawn took {took:?}"
    );
    let (r, _) = bombing.join().unwrap();
    assert!(r.unwrap_err().to_string().contains("aliases"));
}

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@t"])
        .args(["-c", "init.defaultBranch=main"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
}

/// The project as a repository with `a.txt` and `b.txt` committed.
fn repository(e: &Env) {
    for f in ["a.txt", "b.txt"] {
        std::fs::write(e.project.path().join(f), "clean\n").unwrap();
    }
    git(e.project.path(), &["init", "-q"]);
    git(e.project.path(), &["add", "."]);
    git(e.project.path(), &["commit", "-qm", "init"]);
}

fn listed(o: &Value, list: &str, path: &str) -> bool {
    o[list].as_array().is_some_and(|l| l.contains(&json!(path)))
}

/// A child with the write right marks `a.txt` assume-unchanged and
/// `b.txt` skip-worktree, then edits both: `git status` shows nothing.
/// The run's observation and result.md's files table must list both as
/// modified, and `.git/index` too.
#[test]
fn index_flags_hide_no_edit_from_the_observation() {
    let Some(e) = env() else { return };
    repository(&e);
    let (st, log) = e.sh_writing(
        "git update-index --assume-unchanged a.txt && echo evil >> a.txt \
         && git update-index --skip-worktree b.txt && echo evil >> b.txt \
         && echo \"status: [$(git status --porcelain)]\" && echo planted",
        json!({}),
    );
    assert!(log.contains("planted"), "{log}");
    assert!(
        log.contains("status: []"),
        "git status showed the edits: {log}"
    );
    let o = &st["observed"];
    for path in ["a.txt", "b.txt", ".git/index"] {
        assert!(listed(o, "modified", path), "{path}: {o}");
    }
    let result = std::fs::read_to_string(st["result_path"].as_str().unwrap()).unwrap();
    for path in ["a.txt", "b.txt"] {
        let row = format!("| `{path}` | - | - | modified |");
        assert!(result.contains(&row), "{row}\n{result}");
    }
}

/// A child with the write right only flags an index entry, editing
/// nothing: the changed `.git/index` is reported, the file is not.
#[test]
fn a_changed_index_is_reported() {
    let Some(e) = env() else { return };
    repository(&e);
    let (st, log) = e.sh_writing(
        "git update-index --assume-unchanged a.txt && echo planted",
        json!({}),
    );
    assert!(log.contains("planted"), "{log}");
    let o = &st["observed"];
    assert!(listed(o, "modified", ".git/index"), "{o}");
    assert!(!listed(o, "modified", "a.txt"), "{o}");
}
