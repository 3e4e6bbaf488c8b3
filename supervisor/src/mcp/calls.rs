//! What each MCP tool does: the socket calls it makes and the result it
//! gives back.

use super::context::{args, Inner, ToolError, ToolResult};
use super::render::{self, clean, line_of, status_result};
use super::tools::{ListArgs, LogArgs, NoArgs, RunArgs, SpawnArgs, UsageArgs, WaitArgs};
use super::tools::{DEFAULT_TAIL_LINES, DEFAULT_WAIT_S, MAX_TAIL_LINES, MAX_WAIT_S};
use crate::sanitize::{one_line, quoted};
use rmcp::model::{CallToolRequestParams, ProgressNotificationParam};
use rmcp::service::RequestContext;
use rmcp::RoleServer;
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// Runs the tool `request` names.
pub async fn dispatch(
    inner: &Inner,
    request: CallToolRequestParams,
    ctx: &RequestContext<RoleServer>,
) -> ToolResult {
    let a = request.arguments;
    let name = request.name.as_ref();
    let work = async {
        match name {
            "spawn_agent" => spawn(inner, args(name, a)?).await,
            "wait_agent_run" => wait(inner, args(name, a)?, ctx).await,
            "check_agent_run" => status_of(inner, "check_agent_run", args(name, a)?).await,
            "cancel_agent_run" => status_of(inner, "cancel_agent_run", args(name, a)?).await,
            "list_agent_runs" => list(inner, args(name, a)?).await,
            "read_agent_log" => read_log(inner, args(name, a)?).await,
            "agent_usage" => usage(inner, args(name, a)?).await,
            "take_notices" => notices(inner, args(name, a)?).await,
            "list_agents" => agents(inner, args(name, a)?).await,
            "working_context" => working_context(inner, args(name, a)?).await,
            other => Err(ToolError::UnknownTool(other.to_owned())),
        }
    };
    tokio::select! {
        r = work => r,
        // The client gave up on this call; nobody reads the answer.
        _ = ctx.ct.cancelled() => Err(ToolError::Refused("the call was cancelled".into())),
    }
}

/// The parent's tools the daemon is told of: all it holds, or `wanted`,
/// which may only narrow them (a tool not held is refused, naming it).
fn child_tools(inner: &Inner, wanted: Option<Vec<String>>) -> Result<Vec<String>, ToolError> {
    let held = &inner.settings.tools;
    let Some(wanted) = wanted else {
        return Ok(held.clone());
    };
    let missing: Vec<&str> = wanted
        .iter()
        .filter(|t| !held.contains(t))
        .map(String::as_str)
        .collect();
    if !missing.is_empty() {
        return Err(ToolError::Refused(format!(
            "tools: you may only delegate tools you hold; not held: {}; held: {}",
            missing.join(", "),
            held.join(", ")
        )));
    }
    Ok(wanted)
}

/// Refuses a `network_allow` entry of the model's that does not lie within
/// the server's `--network-allow`: the operator's list bounds it.
fn check_network(inner: &Inner, asked: &[String]) -> Result<(), ToolError> {
    use policy::sandbox::network::parse_entry;
    let held = &inner.settings.network_allow;
    let caps: Vec<_> = held.iter().filter_map(|e| parse_entry(e).ok()).collect();
    let within = |e: &String| parse_entry(e).is_ok_and(|a| caps.iter().any(|c| a.within(c)));
    let outside: Vec<&str> = asked
        .iter()
        .filter(|e| !within(e))
        .map(String::as_str)
        .collect();
    if outside.is_empty() {
        return Ok(());
    }
    let held = if held.is_empty() {
        "none (the user starts this server with --network-allow HOST:PORT to give some)".to_owned()
    } else {
        held.join(", ")
    };
    Err(ToolError::Refused(format!(
        "network_allow: you may only give hosts this server holds; not held: {}; held: {held}",
        outside.join(", ")
    )))
}

/// The socket params of a spawn, as JSON: fields the daemon defaults are
/// left out, so a daemon with more optional fields reads them the same.
fn spawn_params(inner: &Inner, a: SpawnArgs) -> Result<Value, ToolError> {
    let s = &inner.settings;
    let mut v = json!({
        "session": {
            "id": inner.session(None),
            "audience": s.audience,
            "project_dir": s.project_dir,
            "tools": child_tools(inner, a.tools)?,
        },
        "task": a.task,
    });
    let mut put = |key: &str, value: Option<Value>| {
        if let Some(value) = value {
            v[key] = value;
        }
    };
    put("context", a.context.map(Value::from));
    put("agent", a.agent.map(Value::from));
    // Passed on as given: the daemon knows which drivers it has.
    put("driver", a.driver.map(Value::from));
    put("command", a.command.map(|c| json!(c)));
    put(
        "isolation",
        a.worktree.filter(|w| *w).map(|_| json!("worktree")),
    );
    put("limits", a.wall_time_s.map(|w| json!({ "wall_time_s": w })));
    let mut sandbox = serde_json::Map::new();
    if let Some(w) = a.write_project {
        sandbox.insert("write_project".into(), json!(w));
    }
    if let Some(n) = a.network_allow {
        check_network(inner, &n)?;
        sandbox.insert("network_allow".into(), json!(n));
    }
    put(
        "sandbox",
        (!sandbox.is_empty()).then_some(Value::Object(sandbox)),
    );
    Ok(v)
}

async fn spawn(inner: &Inner, a: SpawnArgs) -> ToolResult {
    let params = spawn_params(inner, a)?;
    let r = inner.link.call("spawn_agent", params).await?;
    let run_id = r["run_id"].as_str().unwrap_or_default().to_owned();
    // The run exists now: a failing look at it must not read as a failed
    // spawn, which the model would retry.
    let status = match inner
        .link
        .call("check_agent_run", json!({ "run_id": run_id }))
        .await
    {
        Ok(s) => s,
        Err(e) => {
            let id = one_line(&run_id);
            tracing::warn!("run {id} was spawned, but its status could not be read: {e}");
            r.clone()
        }
    };
    let text = format!(
        "spawned run {} ({}).\nlog: {}\nresult (written when it ends): {}\n\
         Call wait_agent_run with this run_id to wait for it.",
        one_line(&run_id),
        line_of(&status, "state"),
        line_of(&status, "log_path"),
        line_of(&status, "result_path"),
    );
    let (run_id, status) = (clean(json!(run_id)), clean(status));
    let data = json!({
        "run_id": run_id,
        "state": status["state"],
        "session_id": status["session_id"],
        "log_path": status["log_path"],
        "result_path": status["result_path"],
        "artifact_dir": status["artifact_dir"],
        "message": "spawned; call wait_agent_run with this run_id to wait for it",
    });
    Ok(render::ok(text, data))
}

async fn wait(inner: &Inner, a: WaitArgs, ctx: &RequestContext<RoleServer>) -> ToolResult {
    let limit = Duration::from_secs(a.timeout_s.unwrap_or(DEFAULT_WAIT_S).min(MAX_WAIT_S));
    let token = ctx.meta.get_progress_token();
    let every = inner.settings.progress_every.max(Duration::from_millis(10));
    let begun = Instant::now();
    let deadline = begun + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let chunk = if token.is_some() {
            left.min(every)
        } else {
            left
        };
        let params = json!({"run_id": a.run_id, "timeout_ms": chunk.as_millis() as u64});
        let status = inner.link.call("wait_agent_run", params).await?;
        if render::is_terminal(&status) {
            return Ok(status_result(status, Some("the run has ended.")).await);
        }
        if Instant::now() >= deadline {
            let lead = format!(
                "still running after waiting {} s; call wait_agent_run again to keep waiting.",
                begun.elapsed().as_secs()
            );
            return Ok(status_result(status, Some(&lead)).await);
        }
        if let Some(t) = &token {
            let msg = progress_message(&status).await;
            let p = ProgressNotificationParam::new(t.clone(), begun.elapsed().as_secs_f64())
                .with_total(limit.as_secs_f64())
                .with_message(msg);
            if let Err(e) = ctx.peer.notify_progress(p).await {
                tracing::debug!("progress notification not sent: {e}");
            }
        }
    }
}

/// What a progress notification says: the state and the last log line.
async fn progress_message(status: &Value) -> String {
    let last = render::log_tail_off_runtime(status["log_path"].as_str().unwrap_or(""), 1).await;
    let last = match last.trim_end() {
        "" => "no output yet".to_owned(),
        l => format!("last output (the child's): {}", quoted(l)),
    };
    let head = render::status_text(status);
    format!("{}; {last}", head.lines().next().unwrap_or(""))
}

async fn status_of(inner: &Inner, method: &str, a: RunArgs) -> ToolResult {
    let status = inner
        .link
        .call(method, json!({ "run_id": a.run_id }))
        .await?;
    Ok(status_result(status, None).await)
}

/// The runs one `list_agent_runs` tool call shows when it asks for no limit.
const DEFAULT_LIST_LIMIT: u64 = 50;

async fn list(inner: &Inner, a: ListArgs) -> ToolResult {
    let session = match a.session.as_deref() {
        None => Some(inner.session(None).to_owned()),
        Some("*") => None,
        Some(s) => Some(s.to_owned()),
    };
    let v = inner
        .link
        .call(
            "list_agent_runs",
            json!({
                "session_id": session,
                "state": a.state,
                "limit": a.limit.unwrap_or(DEFAULT_LIST_LIMIT),
                "cursor": a.cursor,
            }),
        )
        .await?;
    let runs: Vec<Value> = v["runs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(render::summary)
        .collect();
    let mut text = format!("{} run(s)\n", runs.len());
    for r in &runs {
        text.push_str(render::status_text(r).lines().next().unwrap_or(""));
        text.push('\n');
    }
    let next = v["next_cursor"].as_str().map(one_line);
    if let Some(c) = &next {
        text.push_str(&format!(
            "more runs follow: call list_agent_runs again with cursor {c:?}\n"
        ));
    }
    let runs: Vec<Value> = runs.into_iter().map(clean).collect();
    Ok(render::ok(
        text,
        json!({ "runs": runs, "next_cursor": next }),
    ))
}

async fn usage(inner: &Inner, a: UsageArgs) -> ToolResult {
    let session = match a.session.as_deref() {
        None => Some(inner.session(None).to_owned()),
        Some("*") => None,
        Some(s) => Some(s.to_owned()),
    };
    let params = json!({"session_id": session, "since": a.since, "until": a.until});
    let v = inner.link.call("usage", params).await?;
    let sum: crate::usage::UsageSummary = serde_json::from_value(v.clone())
        .map_err(|e| ToolError::Refused(format!("the daemon's usage answer is not one: {e}")))?;
    Ok(render::ok(crate::view::usage::table(&sum), clean(v)))
}

async fn read_log(inner: &Inner, a: LogArgs) -> ToolResult {
    let status = inner
        .link
        .call("check_agent_run", json!({ "run_id": a.run_id }))
        .await?;
    let path = Path::new(status["log_path"].as_str().unwrap_or("")).to_path_buf();
    let (run, state) = (one_line(&a.run_id), line_of(&status, "state"));
    let status = clean(status);
    let tail = a.tail.unwrap_or(DEFAULT_TAIL_LINES).min(MAX_TAIL_LINES);
    let offset = a.offset;
    let read = tokio::task::spawn_blocking(move || read_log_file(&path, offset, tail))
        .await
        .map_err(|e| ToolError::Refused(format!("reading the log failed: {e}")))??;
    let Some((from, text, next, size)) = read else {
        let text = format!("run {run} has written no output yet ({state}).");
        return Ok(render::ok(
            text,
            json!({"run_id": a.run_id, "text": "", "offset": 0, "next_offset": 0, "size": 0, "state": status["state"]}),
        ));
    };
    let more = if next < size {
        format!("[{} more bytes: read on from offset {next}]", size - next)
    } else {
        String::new()
    };
    // Indented: no line of the child's can pass for one of these.
    let body = format!(
        "log of run {run} (bytes {from}..{next} of {size}, {state}; the child's output, each line indented):\n{}{more}",
        render::indent(&text)
    );
    let data = json!({"run_id": a.run_id, "text": text, "offset": from, "next_offset": next, "size": size, "state": status["state"]});
    Ok(render::ok(body, data))
}

/// Reads one chunk of the log at `path`: from `offset`, else from its last
/// `tail` lines (looking back one chunk at most). `None`: no log yet.
fn read_log_file(
    path: &Path,
    offset: Option<u64>,
    tail: usize,
) -> Result<Option<(u64, String, u64, u64)>, render::LogError> {
    let fail = |source| render::LogError::Read {
        path: path.display().to_string(),
        source,
    };
    let mut f = match render::open_log(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        other => other.map_err(fail)?,
    };
    let from = match offset {
        Some(o) => o,
        None => crate::view::logtail::tail_offset_of(&mut f, tail, render::LOG_CHUNK).unwrap_or(0),
    };
    let (text, next, size) = render::log_chunk_of(&mut f, from).map_err(fail)?;
    Ok(Some((from, text, next, size)))
}

async fn notices(inner: &Inner, _a: NoArgs) -> ToolResult {
    let session = inner.session(None).to_owned();
    let v = inner
        .link
        .call("take_notices", json!({ "session_id": session }))
        .await?;
    let list = v["notices"].as_array().cloned().unwrap_or_default();
    let mut text = format!("{} run(s) ended since the last call\n", list.len());
    for n in &list {
        text.push_str(&format!(
            "run {} {}: {}\n",
            line_of(n, "run_id"),
            line_of(n, "state"),
            line_of(n, "result_path")
        ));
    }
    Ok(render::ok(text, clean(json!({ "notices": list }))))
}

async fn agents(inner: &Inner, _a: NoArgs) -> ToolResult {
    let dir = inner.settings.project_dir.clone();
    let found = tokio::task::spawn_blocking(move || definitions(&dir))
        .await
        .map_err(|e| ToolError::Agents(e.to_string()))??;
    let list = found["agents"].as_array().cloned().unwrap_or_default();
    let mut text = format!(
        "{} subagent definition(s), each name and description quoted from its file:\n",
        list.len()
    );
    for a in &list {
        text.push_str(&format!(
            "- {}: {}\n",
            quoted(a["name"].as_str().unwrap_or("")),
            quoted(a["description"].as_str().unwrap_or(""))
        ));
    }
    for e in found["errors"].as_array().into_iter().flatten() {
        text.push_str(&format!("error: {}\n", one_line(e.as_str().unwrap_or(""))));
    }
    Ok(render::ok(text, clean(found)))
}

/// The definitions found for `dir`, as `subagent agents --json` lists them.
fn definitions(dir: &Path) -> Result<Value, ToolError> {
    let explicit = std::env::var_os("SUBAGENTD_CONFIG").map(std::path::PathBuf::from);
    let (_, settings) = crate::paths::load_config(explicit.as_deref())
        .map_err(|e| ToolError::Agents(e.to_string()))?;
    let tools = settings
        .tool_policy()
        .map_err(|e| ToolError::Agents(e.to_string()))?;
    let found = crate::agents::discover(dir, &tools, settings.context.max_file_chars);
    Ok(crate::view::agents::agents_json(&found, &tools))
}

async fn working_context(inner: &Inner, _a: NoArgs) -> ToolResult {
    let session = inner.session(None).to_owned();
    let v = clean(
        inner
            .link
            .call("working_context", json!({ "session_id": session }))
            .await?,
    );
    let text = v["block"].as_str().unwrap_or("").to_owned();
    Ok(render::ok(text, v))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::mcp::daemon::Link;
    use crate::mcp::Settings;

    fn inner(tools: Option<&[&str]>) -> Inner {
        let settings = Settings {
            session: Some("parent-1".into()),
            tools: tools
                .unwrap_or(crate::mcp::DEFAULT_TOOLS)
                .iter()
                .map(|s| s.to_string())
                .collect(),
            network_allow: vec!["a.example:443".into(), "*.pypi.org:443".into()],
            audience: policy::Audience::Team,
            project_dir: "/tmp".into(),
            progress_every: Duration::from_secs(10),
        };
        Inner::new(
            Link::new("/nonexistent/s.sock".into(), None, false),
            settings,
        )
    }

    fn spawn_args(v: Value) -> SpawnArgs {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_spawn_carries_the_session_and_maps_each_argument() {
        let a = spawn_args(
            json!({"task": "t", "context": "c", "agent": "rev", "driver": "claude",
            "command": ["x"], "write_project": true, "network_allow": ["a.example:443"],
            "wall_time_s": 60, "worktree": true}),
        );
        let v = spawn_params(&inner(Some(&["file_read", "shell"])), a).unwrap();
        assert_eq!(
            v["session"],
            json!({"id": "parent-1", "audience": "team", "project_dir": "/tmp",
                   "tools": ["file_read", "shell"]})
        );
        assert_eq!(v["driver"], "claude");
        assert_eq!(v["isolation"], "worktree");
        assert_eq!(v["limits"]["wall_time_s"], 60);
        assert_eq!(v["sandbox"]["write_project"], true);
        assert_eq!(v["sandbox"]["network_allow"], json!(["a.example:443"]));
        assert!(
            v.get("env").is_none(),
            "nothing of the server reaches the child"
        );
        // It decodes as the daemon decodes it (`driver` aside).
        let mut plain = v.clone();
        plain.as_object_mut().unwrap().remove("driver");
        let p: crate::protocol::SpawnParams = serde_json::from_value(plain).unwrap();
        assert_eq!(p.command, ["x"]);
        assert_eq!(p.context.as_deref(), Some("c"));
        assert_eq!(p.agent.as_deref(), Some("rev"));
        let bare = spawn_params(&inner(None), spawn_args(json!({"task": "t"}))).unwrap();
        assert_eq!(
            bare,
            json!({"session": {"id": "parent-1", "audience": "team", "project_dir": "/tmp",
                               "tools": ["file_read", "glob", "grep"]}, "task": "t"})
        );
    }

    #[test]
    fn the_model_lists_hosts_only_within_the_servers() {
        let held = inner(None);
        let ask = |list: &[&str]| {
            let a = spawn_args(json!({"task": "t", "network_allow": list}));
            spawn_params(&held, a)
        };
        assert!(ask(&["a.example:443", "files.pypi.org:443"]).is_ok());
        for bad in ["127.0.0.1:22", "a.example:80", "*.example:443", "nonsense"] {
            let e = ask(&["a.example:443", bad]).unwrap_err().to_string();
            assert!(e.contains(&format!("not held: {bad};")), "{bad}: {e}");
        }
        let mut bare = inner(None);
        bare.settings.network_allow.clear();
        let a = spawn_args(json!({"task": "t", "network_allow": ["a.example:443"]}));
        let e = spawn_params(&bare, a).unwrap_err().to_string();
        assert!(e.contains("--network-allow"), "{e}");
    }

    #[test]
    fn a_child_gets_at_most_the_parent_tools() {
        let held = inner(Some(&["file_read", "shell"]));
        assert_eq!(
            child_tools(&held, None).unwrap(),
            vec!["file_read".to_owned(), "shell".into()]
        );
        assert_eq!(
            child_tools(&held, Some(vec!["shell".into()])).unwrap(),
            vec!["shell".to_owned()]
        );
        let e = child_tools(&held, Some(vec!["web_fetch".into(), "shell".into()])).unwrap_err();
        assert!(e.to_string().contains("not held: web_fetch"), "{e}");
        // Without --tools the parent holds the read-only default; the
        // model's list narrows it and widens nothing.
        let none = inner(None);
        assert_eq!(
            child_tools(&none, None).unwrap(),
            vec!["file_read".to_owned(), "glob".into(), "grep".into()]
        );
        assert_eq!(
            child_tools(&none, Some(vec!["grep".into()])).unwrap(),
            vec!["grep".to_owned()]
        );
        let e = child_tools(&none, Some(vec!["web_fetch".into(), "shell".into()])).unwrap_err();
        assert!(e.to_string().contains("not held: web_fetch, shell"), "{e}");
    }
}
