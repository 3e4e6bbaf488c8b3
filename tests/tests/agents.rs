//! Subagent definitions as people publish them for Claude Code: found in
//! nested folders and through links that stay in their folder, read as
//! leniently as Claude Code reads them, their tool names mapped, and never
//! a spawn refused because of a tool name. The last test runs the shared
//! sample of published files (outside the repository) when it is there.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use subagentd_e2e::{bin, session, Daemon, DaemonOpts};

/// A daemon whose home (for `~/.claude/agents`) is a folder of the test's.
struct Env {
    d: Daemon,
    home: tempfile::TempDir,
    project: tempfile::TempDir,
}

fn env() -> Env {
    let home = tempfile::Builder::new()
        .prefix("sa-ag-home-")
        .tempdir_in("/tmp")
        .unwrap();
    let d = Daemon::start_with(DaemonOpts {
        env: home_env(home.path()),
        ..Default::default()
    });
    let project = tempfile::Builder::new()
        .prefix("sa-ag-proj-")
        .tempdir_in("/tmp")
        .unwrap();
    Env { d, home, project }
}

fn home_env(home: &Path) -> Vec<(String, String)> {
    let h = home.display().to_string();
    vec![
        ("HOME".into(), h.clone()),
        ("XDG_CONFIG_HOME".into(), format!("{h}/.config")),
    ]
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn def(name: &str, extra: &str, body: &str) -> String {
    format!("---\nname: {name}\ndescription: The {name} helper.\n{extra}---\n{body}\n")
}

/// Every catalog tool: a parent holding everything.
fn all_tools() -> Vec<String> {
    policy::tools::builtin()
        .into_iter()
        .map(|t| t.name)
        .collect()
}

impl Env {
    fn p(&self, rel: &str) -> PathBuf {
        self.project.path().join(rel)
    }

    /// `subagent --json agents` for `project`: the listing and the exit code.
    fn agents(&self, project: &Path) -> (Value, i32) {
        let out = Command::new(bin("subagent"))
            .args(["--json", "agents", "--project-dir"])
            .arg(project)
            .envs(home_env(self.home.path()))
            .env_remove("SUBAGENTD_CONFIG")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
        });
        (v, out.status.code().unwrap())
    }

    /// Spawns `agent` in `project` with `tools` as the parent's; waits.
    fn spawn(&self, project: &Path, agent: &str, tools: &[String]) -> Result<Value, Value> {
        let mut c = self.d.conn();
        let params = json!({
            "session": {"id": session("agents"), "audience": "team", "project_dir": project, "tools": tools},
            "task": "t", "agent": agent, "command": ["true"],
        });
        let r = c.call("spawn_agent", params)?;
        Ok(c.wait(r["run_id"].as_str().unwrap()))
    }
}

fn names(listing: &Value) -> Vec<String> {
    let mut n: Vec<String> = listing["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap().to_owned())
        .collect();
    n.sort();
    n
}

fn agent<'a>(listing: &'a Value, name: &str) -> &'a Value {
    listing["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == name)
        .unwrap_or_else(|| panic!("{name} is not listed: {listing:#}"))
}

fn context_file(st: &Value, name: &str) -> String {
    let dir = Path::new(st["log_path"].as_str().unwrap())
        .parent()
        .unwrap();
    std::fs::read_to_string(dir.join("context").join(name)).unwrap()
}

#[test]
fn nested_folders_links_within_and_precedence_as_claude_code_has_them() {
    let e = env();
    let secret = "SECRET-OUTSIDE-THE-FOLDER";
    let outside = tempfile::tempdir().unwrap();
    write(&outside.path().join("spy.md"), &def("spy", "", secret));
    write(
        &e.p(".claude/agents/team/backend/api.md"),
        &def("api", "", "claude api"),
    );
    write(&e.p(".subagents/api.md"), &def("api", "", "ours api"));
    write(
        &e.p(".claude/agents/UPPER.MD"),
        &def("upper", "", "project upper"),
    );
    write(&e.p(".claude/agents/a/dup.md"), &def("dup", "", "first"));
    write(&e.p(".claude/agents/b/dup.md"), &def("dup", "", "second"));
    write(
        &e.p(".claude/agents/store/reviewer.txt"),
        &def("reviewer", "", "linked"),
    );
    let agents = e.p(".claude/agents");
    std::os::unix::fs::symlink("store/reviewer.txt", agents.join("reviewer.md")).unwrap();
    std::os::unix::fs::symlink("team", agents.join("team-again")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("spy.md"), agents.join("spy.md")).unwrap();
    std::os::unix::fs::symlink("../../../escape.md", agents.join("rel-spy.md")).unwrap();
    write(
        &e.project.path().parent().unwrap().join("escape.md"),
        &def("escape", "", secret),
    );
    let user = e.home.path().join(".claude/agents");
    write(
        &user.join("mine/user-only.md"),
        &def("user-only", "", "user"),
    );
    write(&user.join("upper.md"), &def("upper", "", "user upper"));

    let (listing, code) = e.agents(e.project.path());
    assert_eq!(code, 1, "the links out are errors: {listing:#}");
    assert_eq!(
        names(&listing),
        ["api", "dup", "reviewer", "upper", "user-only"]
    );
    let source = |n: &str| agent(&listing, n)["source"].as_str().unwrap().to_owned();
    assert_eq!(
        source("api"),
        e.p(".subagents/api.md").display().to_string()
    );
    assert_eq!(
        source("upper"),
        e.p(".claude/agents/UPPER.MD").display().to_string()
    );
    assert_eq!(
        source("dup"),
        e.p(".claude/agents/a/dup.md").display().to_string()
    );
    assert_eq!(
        source("reviewer"),
        agents.join("reviewer.md").display().to_string()
    );
    let mut dups: Vec<(String, String, String)> = listing["duplicates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            let s = |k: &str| d[k].as_str().unwrap().to_owned();
            (s("name"), s("used"), s("shadowed"))
        })
        .collect();
    dups.sort();
    let p = |r: &str| e.p(r).display().to_string();
    assert_eq!(
        dups,
        [
            (
                "api".into(),
                p(".subagents/api.md"),
                p(".claude/agents/team/backend/api.md")
            ),
            (
                "dup".into(),
                p(".claude/agents/a/dup.md"),
                p(".claude/agents/b/dup.md")
            ),
            (
                "upper".into(),
                p(".claude/agents/UPPER.MD"),
                user.join("upper.md").display().to_string()
            ),
        ],
        "the linked folder team-again holds the same files: no duplicate"
    );
    let errors = listing["errors"].to_string();
    assert!(
        errors.contains("spy.md: leads out of") && errors.contains("rel-spy.md: leads out of"),
        "{errors}"
    );
    assert!(!listing.to_string().contains(secret), "{listing:#}");
    // The one used runs; a link out blocks its name.
    let st = e.spawn(e.project.path(), "api", &all_tools()).unwrap();
    assert_eq!(st["state"], "succeeded", "{st}");
    assert!(context_file(&st, "system.md").contains("ours api"));
    let st = e.spawn(e.project.path(), "reviewer", &all_tools()).unwrap();
    assert!(context_file(&st, "system.md").contains("linked"));
    let err = e.spawn(e.project.path(), "spy", &all_tools()).unwrap_err();
    assert!(
        err["message"].as_str().unwrap().contains("leads out of"),
        "{err}"
    );
    assert!(!err.to_string().contains(secret));
}

#[test]
fn front_matter_claude_code_accepts_is_read_with_a_warning_naming_the_line() {
    let e = env();
    let file = e.p(".claude/agents/review.md");
    write(
        &file,
        "---\nname: Code Reviewer.v2\ndescription: Use this agent when: a diff is ready.\\n\\nExamples: none\ntools: Read, Grep\n---\nReview.\n",
    );
    write(
        &e.p(".claude/agents/bold.md"),
        "---\nname: bold\ndescription: **Bold** reviewer\n---\nBe bold.\n",
    );
    write(
        &e.p(".claude/agents/nameless.md"),
        "---\ndescription: no name\n---\n",
    );
    write(
        &e.p(".claude/agents/late.md"),
        "\n---\nname: late\ndescription: d\n---\n",
    );
    let (listing, code) = e.agents(e.project.path());
    assert_eq!(code, 1);
    let a = agent(&listing, "Code Reviewer.v2");
    assert_eq!(
        a["description"],
        "Use this agent when: a diff is ready.\n\nExamples: none"
    );
    let w = a["warnings"].to_string();
    assert!(
        w.contains(&format!(
            "{}:3: `description` is not valid YAML",
            file.display()
        )),
        "{w}"
    );
    assert_eq!(agent(&listing, "bold")["description"], "**Bold** reviewer");
    let errors = listing["errors"].to_string();
    assert!(errors.contains("nameless.md:2: name: required"), "{errors}");
    assert!(
        errors.contains("late.md:1: expected YAML front matter opening with ---"),
        "{errors}"
    );
    let st = e
        .spawn(e.project.path(), "Code Reviewer.v2", &all_tools())
        .unwrap();
    assert_eq!(
        (st["state"].as_str(), st["agent"].as_str()),
        (Some("succeeded"), Some("Code Reviewer.v2"))
    );
    assert_eq!(st["tools"], json!(["file_read", "grep"]));
}

#[test]
fn claude_code_tool_names_patterns_and_mcp_names_never_fail_a_spawn() {
    let e = env();
    let claude: Vec<&str> = policy::agenttools::CLAUDE_TOOLS
        .iter()
        .map(|(c, _)| *c)
        .collect();
    let tools = format!(
        "tools: {}, read, Bash(git diff:*), mcp__context7__get-library-docs, mcp__github, teleport\n",
        claude.join(", ")
    );
    write(&e.p(".claude/agents/all.md"), &def("all", &tools, "All."));
    let (listing, code) = e.agents(e.project.path());
    assert_eq!(code, 0, "{listing:#}");
    let a = agent(&listing, "all");
    let warnings = a["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0]
            .as_str()
            .unwrap()
            .ends_with(":4: tools: unknown tools dropped: teleport"),
        "{warnings:?}"
    );
    assert_eq!(a["tool_patterns"][0]["written"], "Bash(git diff:*)");
    assert_eq!(a["tool_patterns"][0]["tool"], "shell");
    let mut parent = all_tools();
    parent.extend(
        [
            "mcp__context7__get-library-docs",
            "mcp__github__create_issue",
            "mcp__other__x",
        ]
        .map(String::from),
    );
    let st = e.spawn(e.project.path(), "all", &parent).unwrap();
    assert_eq!(st["state"], "succeeded", "{st}");
    assert_eq!(
        st["tools"],
        json!([
            "file_read",
            "file_write",
            "file_edit",
            "glob",
            "grep",
            "shell",
            "web_fetch",
            "web_search",
            "todo_write",
            "mcp__context7__get-library-docs",
            "mcp__github__create_issue"
        ])
    );
    let schemas: Value = serde_json::from_str(&context_file(&st, "tools.json")).unwrap();
    let mcp = schemas
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "mcp__github__create_issue")
        .unwrap();
    assert_eq!(mcp["class"], "mcp");
    // The parent talks to us in our names: Claude Code's are unknown there.
    let err = e
        .spawn(e.project.path(), "all", &["Read".to_owned()])
        .unwrap_err();
    assert_eq!(
        err["message"],
        "invalid params: session.tools: unknown tools: Read"
    );
}

#[test]
fn disallowed_tools_subtract_and_empty_tools_mean_none() {
    let e = env();
    write(
        &e.p(".claude/agents/ro.md"),
        &def("ro", "disallowedTools: Write, Edit, MultiEdit, Bash\n", ""),
    );
    for (name, line) in [
        ("none-list", "tools: []\n"),
        ("none-string", "tools: \"\"\n"),
        ("none-only", "tools: Task, SendMessage\n"),
    ] {
        write(
            &e.p(&format!(".claude/agents/{name}.md")),
            &def(name, line, ""),
        );
    }
    let st = e.spawn(e.project.path(), "ro", &all_tools()).unwrap();
    assert_eq!(
        st["tools"],
        json!([
            "file_read",
            "glob",
            "grep",
            "web_fetch",
            "web_search",
            "memory_search",
            "memory_write",
            "todo_write"
        ])
    );
    assert_eq!(
        (
            st["rights"]["write_project"].as_bool(),
            st["rights"]["exec"].as_bool()
        ),
        (Some(false), Some(false))
    );
    for name in ["none-list", "none-string", "none-only"] {
        let st = e.spawn(e.project.path(), name, &all_tools()).unwrap();
        assert_eq!(st["state"], "succeeded", "{name}: {st}");
        assert_eq!(st["tools"], json!([]), "{name}");
        assert_eq!(
            st["rights"],
            json!({"read_project": false, "write_project": false, "exec": false, "network": false}),
            "{name}"
        );
    }
    let (listing, _) = e.agents(e.project.path());
    assert_eq!(
        agent(&listing, "ro")["disallowed_tools"],
        json!(["file_write", "file_edit", "shell"])
    );
    assert_eq!(agent(&listing, "none-list")["tools"], json!([]));
}

#[test]
fn a_big_body_is_given_whole_with_a_warning() {
    let e = env();
    let body = "x".repeat(30_000);
    write(&e.p(".claude/agents/big.md"), &def("big", "", &body));
    let (listing, _) = e.agents(e.project.path());
    let a = agent(&listing, "big");
    assert_eq!(a["body_chars"], 30_000);
    assert!(
        a["warnings"]
            .to_string()
            .contains("the body is 30000 characters, over the per-layer cap of 20000"),
        "{a}"
    );
    let st = e.spawn(e.project.path(), "big", &all_tools()).unwrap();
    assert!(context_file(&st, "system.md").contains(&body));
    let out =
        e.d.cli(&["--json", "context", st["run_id"].as_str().unwrap()]);
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    let layer = plan["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "agent")
        .unwrap();
    assert_eq!(
        (layer["raw_chars"].as_u64(), layer["truncated"].as_bool()),
        (Some(30_000), Some(false))
    );
}

#[test]
fn warnings_are_logged_once_per_file_content_not_per_spawn() {
    let e = env();
    let file = e.p(".claude/agents/w.md");
    write(&file, &def("w", "flavour: mint\n", "One."));
    let said = |d: &Daemon| d.log().matches("unknown field `flavour` ignored").count();
    for _ in 0..3 {
        assert_eq!(
            e.spawn(e.project.path(), "w", &all_tools()).unwrap()["state"],
            "succeeded"
        );
    }
    assert_eq!(said(&e.d), 1, "{}", e.d.log());
    write(&file, &def("w", "flavour: mint\n", "Two, longer."));
    e.spawn(e.project.path(), "w", &all_tools()).unwrap();
    assert_eq!(said(&e.d), 2, "a changed file is read again: {}", e.d.log());
}

/// Where the shared sample of published definitions is:
/// `SUBAGENT_AGENT_SAMPLES`, else `<repo>/../shared/fixtures/`.
fn sample_tarball() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("SUBAGENT_AGENT_SAMPLES") {
        let p = PathBuf::from(p);
        // Asked for by name: missing is a failure, not a skip.
        assert!(
            p.is_file(),
            "SUBAGENT_AGENT_SAMPLES={} is not a file",
            p.display()
        );
        return Ok(p);
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let p = repo.join("../shared/fixtures/claude-agents-sample.tgz");
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "the shared sample of Claude Code definitions is not at {} (set SUBAGENT_AGENT_SAMPLES to the tarball)",
            p.display()
        ))
    }
}

/// The `*.md` files beneath `dir`.
fn md_files(dir: &Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let t = e.file_type().unwrap();
        if t.is_dir() {
            n += md_files(&e.path());
        } else if e
            .path()
            .extension()
            .is_some_and(|x| x.eq_ignore_ascii_case("md"))
        {
            n += 1;
        }
    }
    n
}

#[test]
fn the_published_sample_lists_all_but_its_malformed_file_and_every_one_spawns() {
    let tarball = match sample_tarball() {
        Ok(t) => t,
        Err(why) => {
            // Outside the repository, so a clean clone in CI lacks it: no
            // failure, but said where CI logs show it (not captured).
            let _ = writeln!(std::io::stderr(), "SKIPPED: {why}");
            println!("SKIPPED: {why}");
            return;
        }
    };
    let e = env();
    let unpacked = tempfile::tempdir().unwrap();
    let tar = Command::new("tar")
        .arg("xzf")
        .arg(&tarball)
        .arg("-C")
        .arg(unpacked.path())
        .status()
        .unwrap();
    assert!(tar.success());
    let (mut files, mut listed, mut errors) = (0, 0, Vec::new());
    let mut runs = Vec::new();
    let mut c = e.d.conn();
    for repo in std::fs::read_dir(unpacked.path()).unwrap() {
        let project = repo.unwrap().path();
        files += md_files(&project.join(".claude/agents"));
        let (listing, _) = e.agents(&project);
        listed += listing["agents"].as_array().unwrap().len();
        errors.extend(listing["errors"].as_array().unwrap().iter().cloned());
        assert_eq!(listing["duplicates"], json!([]), "{}", project.display());
        for name in names(&listing) {
            let params = json!({
                "session": {"id": session("sample"), "audience": "team", "project_dir": project, "tools": all_tools()},
                "task": "t", "agent": name, "command": ["true"],
            });
            let r = c
                .call("spawn_agent", params)
                .unwrap_or_else(|err| panic!("{name} in {}: {err}", project.display()));
            runs.push((name, r["run_id"].as_str().unwrap().to_owned()));
        }
    }
    assert_eq!((files, listed), (339, 338), "{errors:?}");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0]
            .as_str()
            .unwrap()
            .contains("sqs-expert.md:1: expected YAML front matter"),
        "{errors:?}"
    );
    for (name, run) in runs {
        let st = c.wait(&run);
        assert_eq!(
            (st["state"].as_str(), st["agent"].as_str()),
            (Some("succeeded"), Some(name.as_str())),
            "{st}"
        );
    }
}

#[test]
fn a_file_name_cannot_forge_a_log_line() {
    let e = env();
    let forged = "x\n1999-12-01T00:00:00Z  INFO subagentd: FORGED line.md";
    write(
        &e.p(&format!(".claude/agents/{forged}")),
        &def("forger", "flavour: mint\n", "Forge."),
    );
    let st = e.spawn(e.project.path(), "forger", &all_tools()).unwrap();
    assert_eq!(st["state"], "succeeded", "{st}");
    let log = e.d.log();
    assert!(log.contains("unknown field `flavour` ignored"), "{log}");
    assert!(
        !log.lines().any(|l| l.starts_with("1999-12-01")),
        "a forged line: {log}"
    );
    assert!(log.contains("x\\n1999-12-01"), "{log}");
}

/// Lowers the soft open-files limit of process `pid` to `n`.
fn limit_open_files(pid: i32, n: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit writes the current limits into `lim` and sets none.
    let rc = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, std::ptr::null(), &mut lim) };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
    lim.rlim_cur = n;
    // SAFETY: prlimit reads `lim` and writes nothing (old is null).
    let rc = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, &lim, std::ptr::null_mut()) };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
}

#[test]
fn many_definitions_are_read_one_open_file_at_a_time() {
    let e = env();
    for i in 0..400 {
        write(
            &e.p(&format!(".claude/agents/a{i:03}.md")),
            &def(&format!("a{i:03}"), "", "Many."),
        );
    }
    let open = std::fs::read_dir(format!("/proc/{}/fd", e.d.pid()))
        .unwrap()
        .count() as u64;
    limit_open_files(e.d.pid(), open + 200);
    let st = e.spawn(e.project.path(), "a399", &all_tools()).unwrap();
    assert_eq!(st["state"], "succeeded", "{st}");
}

#[test]
fn a_search_folder_that_cannot_be_opened_blocks_the_names_after_it() {
    let e = env();
    write(
        &e.p("real-claude/agents/reviewer.md"),
        &def("reviewer", "", "project"),
    );
    std::os::unix::fs::symlink("real-claude", e.p(".claude")).unwrap();
    let user = e.home.path().join(".claude/agents");
    write(&user.join("reviewer.md"), &def("reviewer", "", "user"));
    write(&e.p(".subagents/first.md"), &def("first", "", "first"));
    let (listing, code) = e.agents(e.project.path());
    assert_eq!(code, 1, "{listing:#}");
    let notes = listing["notes"].to_string();
    assert!(
        notes.contains(&format!(
            "{}: cannot be opened",
            e.p(".claude/agents").display()
        )),
        "{notes}"
    );
    let err = e
        .spawn(e.project.path(), "reviewer", &all_tools())
        .unwrap_err();
    let msg = err["message"].as_str().unwrap();
    assert!(
        msg.contains(".claude/agents") && msg.contains("cannot be opened"),
        "{msg}"
    );
    assert!(e.d.log().contains("cannot be opened"), "{}", e.d.log());
    // A folder before it is read as usual.
    let st = e.spawn(e.project.path(), "first", &all_tools()).unwrap();
    assert_eq!(st["state"], "succeeded", "{st}");
}

#[test]
fn past_the_file_limit_one_note_is_given() {
    let e = env();
    let dir = e.p(".subagents");
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..1_010 {
        std::fs::write(
            dir.join(format!("f{i:04}.md")),
            def(&format!("f{i:04}"), "", ""),
        )
        .unwrap();
    }
    let (listing, _) = e.agents(e.project.path());
    let notes: Vec<&Value> = listing["notes"].as_array().unwrap().iter().collect();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0]
        .as_str()
        .unwrap()
        .contains("only the first 1000 definition files"));
}

#[test]
fn a_definition_changed_through_a_shared_mapping_is_read_again() {
    use std::os::fd::AsRawFd;
    let e = env();
    let file = e.p(".claude/agents/m.md");
    write(&file, &def("m", "", "BODY-AAAA"));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&file)
        .unwrap();
    let len = f.metadata().unwrap().len() as usize;
    // SAFETY: a new shared mapping of the whole file, unmapped below.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    // SAFETY: the mapping is `len` bytes, writable, and only this test
    // touches it.
    let bytes = unsafe { std::slice::from_raw_parts_mut(map.cast::<u8>(), len) };
    let at = bytes.windows(4).position(|w| w == b"AAAA").unwrap();
    let body = |e: &Env| {
        let st = e.spawn(e.project.path(), "m", &all_tools()).unwrap();
        let sys = context_file(&st, "system.md");
        sys[sys.find("BODY-").unwrap()..][..9].to_owned()
    };
    bytes[at] = b'B';
    assert_eq!(body(&e), "BODY-BAAA");
    // The page is writable already: this write changes no time stamp.
    bytes[at + 1] = b'B';
    assert_eq!(
        body(&e),
        "BODY-BBAA",
        "the content, not its metadata, decides"
    );
    // SAFETY: `map` is the mapping made above, of `len` bytes.
    unsafe { libc::munmap(map, len) };
}

#[test]
fn a_megabyte_of_stray_front_matter_is_an_error_not_half_a_million_warnings() {
    let e = env();
    let junk = format!(
        "---\nname: junk\ndescription: d\n{}---\n",
        "x\n".repeat(520_000)
    );
    write(&e.p(".claude/agents/junk.md"), &junk);
    let keys: String = (0..40_000).map(|i| format!("k{i}: v\n")).collect();
    write(
        &e.p(".claude/agents/keys.md"),
        &format!("---\nname: keys\ndescription: d\n{keys}---\n"),
    );
    write(&e.p(".claude/agents/ok.md"), &def("ok", "", "Fine."));
    let started = std::time::Instant::now();
    let st = e.spawn(e.project.path(), "ok", &all_tools()).unwrap();
    assert_eq!(st["state"], "succeeded", "{st}");
    let took = started.elapsed();
    assert!(
        e.d.log().len() < 64 << 10,
        "{} bytes of log",
        e.d.log().len()
    );
    for (name, why) in [
        ("junk", "the front matter is over the limit of 65536 bytes"),
        ("keys", "the front matter is over the limit of 65536 bytes"),
    ] {
        let err = e.spawn(e.project.path(), name, &all_tools()).unwrap_err();
        assert!(err["message"].as_str().unwrap().contains(why), "{err}");
    }
    let (listing, _) = e.agents(e.project.path());
    assert!(listing.to_string().len() < 64 << 10);
    assert!(took < std::time::Duration::from_secs(3), "{took:?}");
}

#[test]
fn one_discovery_reads_at_most_16_mib() {
    let e = env();
    let body = "b".repeat(1_000_000);
    for i in 0..20 {
        write(
            &e.p(&format!(".subagents/big{i:02}.md")),
            &def(&format!("big{i:02}"), "", &body),
        );
    }
    let (listing, _) = e.agents(e.project.path());
    let errors = listing["errors"].to_string();
    assert!(
        errors
            .contains("big16.md: not read: the definitions one discovery reads are at most 16 MiB"),
        "{errors}"
    );
    assert_eq!(names(&listing).len(), 16, "{listing:#}");
    let err = e
        .spawn(e.project.path(), "big19", &all_tools())
        .unwrap_err();
    assert!(err["message"].as_str().unwrap().contains("16 MiB"), "{err}");
}

#[test]
fn a_definition_of_more_than_256_tool_entries_is_an_error_for_its_name() {
    let e = env();
    let many: Vec<String> = (0..300).map(|i| format!("mcp__s__t{i:06}")).collect();
    write(
        &e.p(".claude/agents/many.md"),
        &def("many", &format!("tools: {}\n", many.join(", ")), ""),
    );
    let fine: Vec<String> = (0..256).map(|i| format!("mcp__s__t{i:06}")).collect();
    write(
        &e.p(".claude/agents/fine.md"),
        &def("fine", &format!("tools: {}\n", fine.join(", ")), ""),
    );
    let err = e.spawn(e.project.path(), "many", &all_tools()).unwrap_err();
    let msg = err["message"].as_str().unwrap();
    assert!(
        msg.contains("many.md:4: tools: more than 256 entries"),
        "{msg}"
    );
    let mut parent = all_tools();
    parent.push("mcp__s__t000255".into());
    let st = e.spawn(e.project.path(), "fine", &parent).unwrap();
    assert_eq!(st["tools"], json!(["mcp__s__t000255"]), "{st}");
}

#[test]
fn a_project_definition_gets_no_egress_the_config_does_not_cap() {
    let e = env();
    let allow = "network_allow: [\"exfil.example.net:443\"]\n";
    write(
        &e.p(".claude/agents/reviewer.md"),
        &def("reviewer", allow, "planted"),
    );
    let user = e.home.path().join(".claude/agents");
    write(
        &user.join("reviewer.md"),
        &def("reviewer", "", "the user's"),
    );
    write(
        &user.join("fetcher.md"),
        &def("fetcher", allow, "the user's"),
    );
    let (listing, _) = e.agents(e.project.path());
    let w = agent(&listing, "reviewer")["warnings"].to_string();
    assert!(w.contains("network_allow is ignored"), "{w}");
    let st = e
        .spawn(e.project.path(), "reviewer", &["file_read".to_owned()])
        .unwrap();
    assert_eq!(st["network"], "none", "{st}");
    assert_eq!(st["network_allow"], Value::Null, "{st}");
    let notes = st["notes"].to_string();
    assert!(notes.contains("network_allow is ignored"), "{notes}");
    assert!(
        notes.contains(&format!(
            "shadows the user-level {}",
            user.join("reviewer.md").display()
        )),
        "{notes}"
    );
    let result = std::fs::read_to_string(st["result_path"].as_str().unwrap()).unwrap();
    assert!(result.contains("network_allow is ignored"), "{result}");
    // A user-level definition is the user's own: its list is honoured.
    let st = e
        .spawn(e.project.path(), "fetcher", &["file_read".to_owned()])
        .unwrap();
    assert_eq!(st["network"], "allowlist", "{st}");
    assert_eq!(st["network_allow"], json!(["exfil.example.net:443"]));
    assert_eq!(st["notes"], Value::Null, "{st}");
}

#[test]
fn a_project_definitions_egress_is_honoured_within_the_audiences_cap() {
    let home = tempfile::tempdir_in("/tmp").unwrap();
    let cfg = home.path().join("config.toml");
    std::fs::write(
        &cfg,
        "[audiences.team]\nnetwork_allow = [\"*.example.com:443\"]\n",
    )
    .unwrap();
    let d = Daemon::start_with(DaemonOpts {
        env: home_env(home.path()),
        args: vec!["--config".into(), cfg.display().to_string()],
        ..Default::default()
    });
    let project = tempfile::tempdir_in("/tmp").unwrap();
    let e = Env { d, home, project };
    write(
        &e.p(".subagents/api.md"),
        &def("api", "network_allow: [\"api.example.com:443\"]\n", ""),
    );
    write(
        &e.p(".subagents/out.md"),
        &def("out", "network_allow: [\"exfil.example.net:443\"]\n", ""),
    );
    let st = e
        .spawn(e.project.path(), "api", &["file_read".to_owned()])
        .unwrap();
    assert_eq!(st["network"], "allowlist", "{st}");
    assert_eq!(st["network_allow"], json!(["api.example.com:443"]));
    let err = e
        .spawn(e.project.path(), "out", &["file_read".to_owned()])
        .unwrap_err();
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("outside what the audience may reach"),
        "{err}"
    );
}
