//! A scripted model server on 127.0.0.1 for the driver tests: it speaks
//! Anthropic's Messages API (`POST /v1/messages`, SSE when the request
//! asks for `stream`) and OpenAI's Responses API (`POST /v1/responses`,
//! always SSE), and answers each request with the turn of its script that
//! the request's count of tool results selects, so a retried request gets
//! the same answer. Every request is recorded (path, headers, JSON body)
//! for the test's assertions. A test can hold the answers from one turn on
//! ([`ModelServer::hold_from`]) to look at a run mid-way, then let it go.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// The largest request body read (a Codex request is about 40 KB).
const MAX_BODY: usize = 16 * 1024 * 1024;
/// The largest request head read.
const MAX_HEAD: usize = 64 * 1024;

/// One tool call the model makes.
#[derive(Clone, Debug)]
pub struct ToolCall {
    /// The tool's name as the agent offered it (`Write`, `exec_command`).
    pub name: String,
    /// Its input (Anthropic) or arguments (OpenAI), as JSON.
    pub input: Value,
}

/// What the model answers on one turn.
#[derive(Clone, Debug)]
pub enum Turn {
    /// Calls these tools (the agent sends their results on the next turn).
    Tools(Vec<ToolCall>),
    /// Ends with this text.
    Text(String),
    /// Answers with this HTTP status and an error body of this message.
    Error(u16, String),
}

impl Turn {
    /// A turn calling one tool.
    pub fn tool(name: &str, input: Value) -> Turn {
        Turn::Tools(vec![ToolCall {
            name: name.to_owned(),
            input,
        }])
    }

    /// A final text turn.
    pub fn text(t: &str) -> Turn {
        Turn::Text(t.to_owned())
    }

    /// A turn from its JSON form: `{"tool": NAME, "input": {...}}`,
    /// `{"text": "..."}` or `{"error": STATUS, "message": "..."}`.
    pub fn from_json(v: &Value) -> Option<Turn> {
        if let Some(name) = v["tool"].as_str() {
            return Some(Turn::tool(name, v["input"].clone()));
        }
        if let Some(t) = v["text"].as_str() {
            return Some(Turn::text(t));
        }
        let status = u16::try_from(v["error"].as_u64()?).ok()?;
        Some(Turn::Error(
            status,
            v["message"].as_str().unwrap_or("error").to_owned(),
        ))
    }
}

/// One request the server received.
#[derive(Clone, Debug)]
pub struct Request {
    /// The method (`POST`, `HEAD`, ...).
    pub method: String,
    /// The request target as sent (origin or absolute form).
    pub path: String,
    /// The headers, names lowercased.
    pub headers: Vec<(String, String)>,
    /// The body as JSON (`Null` when empty or not JSON).
    pub body: Value,
}

impl Request {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The system text of an Anthropic request (string or text blocks),
    /// or the developer/system messages of a Responses request.
    pub fn system_text(&self) -> String {
        let mut out = String::new();
        match &self.body["system"] {
            Value::String(s) => out.push_str(s),
            Value::Array(blocks) => blocks.iter().for_each(|b| text_of(b, &mut out)),
            _ => {}
        }
        if let Some(s) = self.body["instructions"].as_str() {
            out.push_str(s);
        }
        for item in self.body["input"].as_array().into_iter().flatten() {
            if matches!(item["role"].as_str(), Some("developer" | "system")) {
                text_of(&item["content"], &mut out);
            }
        }
        out
    }

    /// The text of the user messages, in order.
    pub fn user_text(&self) -> String {
        let mut out = String::new();
        let items = self.body["messages"]
            .as_array()
            .or_else(|| self.body["input"].as_array());
        for m in items.into_iter().flatten() {
            if m["role"] == "user" {
                text_of(&m["content"], &mut out);
            }
        }
        out
    }

    /// The names of the tools the request offers the model.
    pub fn tool_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.body["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["name"].as_str().map(str::to_owned))
            .collect();
        names.sort();
        names
    }

    /// How many tool results the request carries: selects the turn.
    pub fn tool_results(&self) -> usize {
        let anthropic = self.body["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["content"].as_array())
            .flatten()
            .filter(|b| b["type"] == "tool_result")
            .count();
        let openai = self.body["input"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|i| {
                matches!(
                    i["type"].as_str(),
                    Some("function_call_output" | "custom_tool_call_output")
                )
            })
            .count();
        anthropic + openai
    }
}

fn text_of(v: &Value, out: &mut String) {
    match v {
        Value::String(s) => {
            out.push_str(s);
            out.push('\n');
        }
        Value::Array(items) => items.iter().for_each(|i| text_of(i, out)),
        Value::Object(m) => {
            if let Some(t) = m.get("text") {
                text_of(t, out);
            } else if let Some(c) = m.get("content") {
                text_of(c, out);
            }
        }
        _ => {}
    }
}

/// A running scripted model server; it stops serving when dropped (its
/// listener thread lives on, blocked, until the test process ends).
pub struct ModelServer {
    /// The port on 127.0.0.1.
    pub port: u16,
    requests: Arc<Mutex<Vec<Request>>>,
    hold: Arc<Hold>,
}

struct Shared {
    script: Vec<Turn>,
    requests: Arc<Mutex<Vec<Request>>>,
    hold: Arc<Hold>,
}

/// Answers held back: those to requests with at least `from` tool results
/// wait while it is set; `waiting` counts them.
#[derive(Default)]
struct Hold {
    from: Mutex<Option<usize>>,
    changed: Condvar,
    waiting: AtomicUsize,
}

impl Hold {
    /// Waits while the answer to a request with `n` tool results is held.
    fn wait(&self, n: usize) {
        let mut from = self.from.lock().unwrap_or_else(|p| p.into_inner());
        if from.is_none_or(|f| n < f) {
            return;
        }
        self.waiting.fetch_add(1, Ordering::SeqCst);
        while from.is_some_and(|f| n >= f) {
            from = self.changed.wait(from).unwrap_or_else(|p| p.into_inner());
        }
        self.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

impl ModelServer {
    /// Starts a server answering with `script`, turn N for a request with
    /// N tool results (the last turn for more).
    pub fn start(script: Vec<Turn>) -> std::io::Result<ModelServer> {
        Self::start_on("127.0.0.1:0", script)
    }

    /// Starts a server on `addr` (`127.0.0.1:PORT`).
    pub fn start_on(addr: &str, script: Vec<Turn>) -> std::io::Result<ModelServer> {
        let listener = TcpListener::bind(addr)?;
        let port = listener.local_addr()?.port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let hold = Arc::new(Hold::default());
        let shared = Arc::new(Shared {
            script,
            requests: requests.clone(),
            hold: hold.clone(),
        });
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let shared = shared.clone();
                std::thread::spawn(move || serve(stream, &shared));
            }
        });
        Ok(ModelServer {
            port,
            requests,
            hold,
        })
    }

    /// From now on, the answer to a request with `n` or more tool results
    /// (turn `n` of a run and after) waits until [`ModelServer::release`].
    pub fn hold_from(&self, n: usize) {
        *self.hold.from.lock().unwrap_or_else(|p| p.into_inner()) = Some(n);
        self.hold.changed.notify_all();
    }

    /// Answers every held request, and holds no more.
    pub fn release(&self) {
        *self.hold.from.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.hold.changed.notify_all();
    }

    /// How many requests wait for their answer now.
    pub fn held(&self) -> usize {
        self.hold.waiting.load(Ordering::SeqCst)
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The requests so far.
    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// The model requests so far (`POST`s to a messages or responses path).
    pub fn model_requests(&self) -> Vec<Request> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == "POST" && is_model_path(&r.path))
            .collect()
    }
}

fn is_model_path(path: &str) -> bool {
    let p = path.split('?').next().unwrap_or("");
    p.ends_with("/messages") || p.ends_with("/responses")
}

/// Serves the requests of one connection (keep-alive) until it closes.
fn serve(stream: TcpStream, shared: &Shared) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    while let Some(req) = read_request(&mut reader) {
        let close = req
            .header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"));
        if req.method == "POST" && is_model_path(&req.path) {
            shared.hold.wait(req.tool_results());
        }
        let reply = respond(&req, &shared.script);
        if let Ok(mut r) = shared.requests.lock() {
            r.push(req);
        }
        if out.write_all(&reply).is_err() || close {
            return;
        }
    }
}

/// Reads one request: its head with httparse, then a body by
/// Content-Length or chunked transfer coding.
fn read_request(r: &mut BufReader<TcpStream>) -> Option<Request> {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let n = r.read_until(b'\n', &mut head).ok()?;
        if n == 0 || head.len() > MAX_HEAD {
            return None;
        }
    }
    let mut headers = [httparse::EMPTY_HEADER; 128];
    let mut parsed = httparse::Request::new(&mut headers);
    parsed.parse(&head).ok()?;
    let headers: Vec<(String, String)> = parsed
        .headers
        .iter()
        .map(|h| {
            let value = String::from_utf8_lossy(h.value).into_owned();
            (h.name.to_ascii_lowercase(), value)
        })
        .collect();
    let mut req = Request {
        method: parsed.method?.to_owned(),
        path: parsed.path?.to_owned(),
        headers,
        body: Value::Null,
    };
    let body = if req
        .header("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
    {
        read_chunked(r)?
    } else {
        let len: usize = req
            .header("content-length")
            .unwrap_or("0")
            .trim()
            .parse()
            .ok()?;
        if len > MAX_BODY {
            return None;
        }
        let mut b = vec![0; len];
        r.read_exact(&mut b).ok()?;
        b
    };
    req.body = serde_json::from_slice(&body).unwrap_or(Value::Null);
    Some(req)
}

fn read_chunked(r: &mut BufReader<TcpStream>) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line).ok()?;
        let size = usize::from_str_radix(line.trim().split(';').next()?, 16).ok()?;
        if size == 0 {
            let mut end = String::new();
            r.read_line(&mut end).ok()?;
            return Some(body);
        }
        if body.len() + size > MAX_BODY {
            return None;
        }
        let start = body.len();
        body.resize(start + size, 0);
        r.read_exact(&mut body[start..]).ok()?;
        let mut crlf = [0u8; 2];
        r.read_exact(&mut crlf).ok()?;
    }
}

/// The whole HTTP response to one request.
fn respond(req: &Request, script: &[Turn]) -> Vec<u8> {
    if req.method != "POST" || !is_model_path(&req.path) {
        return http(200, "application/json", b"{}");
    }
    let n = req.tool_results();
    let turn = script
        .get(n)
        .or(script.last())
        .cloned()
        .unwrap_or_else(|| Turn::text("done"));
    if let Turn::Error(status, message) = &turn {
        let body = json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}});
        return http(*status, "application/json", body.to_string().as_bytes());
    }
    let model = req.body["model"].as_str().unwrap_or("scripted-model");
    let path = req.path.split('?').next().unwrap_or("");
    if path.ends_with("/responses") {
        return http(200, "text/event-stream", &responses_sse(&turn, n, model));
    }
    if req.body["stream"] == true {
        http(200, "text/event-stream", &messages_sse(&turn, n, model))
    } else {
        let body = message_json(&turn, n, model);
        http(200, "application/json", body.to_string().as_bytes())
    }
}

fn http(status: u16, content_type: &str, body: &[u8]) -> Vec<u8> {
    let reason = if status == 200 { "OK" } else { "Error" };
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nCache-Control: no-cache\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

fn usage() -> Value {
    json!({"input_tokens": 100, "output_tokens": 20, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0})
}

/// The content blocks of a turn, ids numbered by the turn's index.
fn blocks(turn: &Turn, n: usize) -> Vec<Value> {
    match turn {
        Turn::Tools(calls) => calls
            .iter()
            .enumerate()
            .map(|(i, c)| json!({"type": "tool_use", "id": format!("toolu_{n}_{i}"), "name": c.name, "input": c.input}))
            .collect(),
        Turn::Text(t) => vec![json!({"type": "text", "text": t})],
        Turn::Error(..) => Vec::new(),
    }
}

fn stop_reason(turn: &Turn) -> &'static str {
    match turn {
        Turn::Tools(_) => "tool_use",
        _ => "end_turn",
    }
}

fn message_json(turn: &Turn, n: usize, model: &str) -> Value {
    json!({
        "id": format!("msg_{n}"), "type": "message", "role": "assistant", "model": model,
        "content": blocks(turn, n), "stop_reason": stop_reason(turn), "stop_sequence": null,
        "usage": usage(),
    })
}

fn event(out: &mut Vec<u8>, data: &Value) {
    let kind = data["type"].as_str().unwrap_or("message");
    out.extend_from_slice(format!("event: {kind}\ndata: {data}\n\n").as_bytes());
}

/// A Messages API stream: message_start, each block as start, one delta
/// and stop, then message_delta and message_stop.
fn messages_sse(turn: &Turn, n: usize, model: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut start = message_json(turn, n, model);
    start["content"] = json!([]);
    start["stop_reason"] = Value::Null;
    event(
        &mut out,
        &json!({"type": "message_start", "message": start}),
    );
    for (i, b) in blocks(turn, n).into_iter().enumerate() {
        let (empty, delta) = if b["type"] == "tool_use" {
            let mut e = b.clone();
            e["input"] = json!({});
            let partial = b["input"].to_string();
            (
                e,
                json!({"type": "input_json_delta", "partial_json": partial}),
            )
        } else {
            let text = b["text"].clone();
            (
                json!({"type": "text", "text": ""}),
                json!({"type": "text_delta", "text": text}),
            )
        };
        event(
            &mut out,
            &json!({"type": "content_block_start", "index": i, "content_block": empty}),
        );
        event(
            &mut out,
            &json!({"type": "content_block_delta", "index": i, "delta": delta}),
        );
        event(&mut out, &json!({"type": "content_block_stop", "index": i}));
    }
    event(
        &mut out,
        &json!({"type": "message_delta", "delta": {"stop_reason": stop_reason(turn), "stop_sequence": null}, "usage": {"output_tokens": 20}}),
    );
    event(&mut out, &json!({"type": "message_stop"}));
    out
}

/// A Responses API stream: response.created, each output item as
/// output_item.done, then response.completed with usage.
fn responses_sse(turn: &Turn, n: usize, model: &str) -> Vec<u8> {
    let id = format!("resp_{n}");
    let mut out = Vec::new();
    event(
        &mut out,
        &json!({"type": "response.created", "response": {"id": id, "model": model, "status": "in_progress", "output": []}}),
    );
    let items: Vec<Value> = match turn {
        Turn::Tools(calls) => calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let args = c.input.to_string();
                json!({"type": "function_call", "id": format!("fc_{n}_{i}"), "call_id": format!("call_{n}_{i}"), "name": c.name, "arguments": args, "status": "completed"})
            })
            .collect(),
        Turn::Text(t) => vec![
            json!({"type": "message", "id": format!("msg_{n}"), "role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": t, "annotations": []}]}),
        ],
        Turn::Error(..) => Vec::new(),
    };
    for (i, item) in items.into_iter().enumerate() {
        event(
            &mut out,
            &json!({"type": "response.output_item.done", "output_index": i, "item": item}),
        );
    }
    let usage = json!({"input_tokens": 100, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 20, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 120});
    event(
        &mut out,
        &json!({"type": "response.completed", "response": {"id": id, "model": model, "status": "completed", "usage": usage}}),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post(port: u16, path: &str, body: &Value) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let b = body.to_string();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
            b.len()
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn the_turn_follows_the_tool_results_and_requests_are_recorded() {
        let server = ModelServer::start(vec![
            Turn::tool("Write", json!({"file_path": "/p/a", "content": "x"})),
            Turn::text("all done"),
        ])
        .unwrap();
        let first = json!({"model": "m", "stream": true, "system": [{"type": "text", "text": "SYS"}],
            "tools": [{"name": "Write"}, {"name": "Read"}],
            "messages": [{"role": "user", "content": "do it"}]});
        let a = post(server.port, "/v1/messages?beta=true", &first);
        assert!(a.contains("event: content_block_start"), "{a}");
        assert!(a.contains("\"tool_use\""), "{a}");
        // A retry of the first request gets the same turn.
        assert!(post(server.port, "/v1/messages", &first).contains("tool_use"));
        let mut second = first.clone();
        second["messages"] = json!([{"role": "user", "content": "do it"},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_0_0", "content": "ok"}]}]);
        let b = post(server.port, "/v1/messages", &second);
        assert!(b.contains("all done") && b.contains("end_turn"), "{b}");
        let reqs = server.model_requests();
        assert_eq!(reqs.len(), 3);
        assert_eq!(reqs[0].system_text().trim(), "SYS");
        assert_eq!(reqs[0].tool_names(), ["Read", "Write"]);
        assert!(reqs[0].user_text().contains("do it"));
    }

    #[test]
    fn a_held_turn_is_answered_once_released() {
        let server =
            ModelServer::start(vec![Turn::tool("Read", json!({})), Turn::text("ok")]).unwrap();
        server.hold_from(1);
        let first = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
        assert!(
            post(server.port, "/v1/messages", &first).contains("tool_use"),
            "turn 0 is not held"
        );
        let mut second = first.clone();
        second["messages"] = json!([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]}]);
        let port = server.port;
        let answer = std::thread::spawn(move || post(port, "/v1/messages", &second));
        crate::wait_until(Duration::from_secs(10), "the held request", || {
            server.held() == 1
        });
        assert!(!answer.is_finished());
        server.release();
        assert!(answer.join().unwrap().contains("end_turn"));
        assert_eq!(server.held(), 0);
    }

    #[test]
    fn responses_stream_function_calls_then_text() {
        let server = ModelServer::start(vec![
            Turn::tool("exec_command", json!({"cmd": "true"})),
            Turn::text("fin"),
        ])
        .unwrap();
        let req = json!({"model": "m", "stream": true, "input": [{"role": "developer", "content": [{"type": "input_text", "text": "DEV"}]}]});
        let a = post(server.port, "/v1/responses", &req);
        assert!(
            a.contains("function_call") && a.contains("response.completed"),
            "{a}"
        );
        let mut next = req.clone();
        next["input"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "function_call_output", "call_id": "call_0_0", "output": "ok"}));
        assert!(post(server.port, "/v1/responses", &next).contains("fin"));
        assert!(server.model_requests()[0].system_text().contains("DEV"));
        let e = ModelServer::start(vec![Turn::Error(400, "nope".into())]).unwrap();
        assert!(post(e.port, "/v1/messages", &req).starts_with("HTTP/1.1 400"));
    }
}
