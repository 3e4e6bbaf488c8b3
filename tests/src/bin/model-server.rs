//! The scripted model server of the driver tests as a program, for
//! scripts/demo and trying an agent by hand: `model-server [--port N]
//! SCRIPT.json`, where the script is a JSON array of turns (`{"tool":
//! NAME, "input": {...}}`, `{"text": "..."}`, `{"error": 400, "message":
//! "..."}`). It prints `listening on http://127.0.0.1:PORT`, then one line
//! per model request (path, tools offered, tool results), until killed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use subagentd_e2e::modelserver::{ModelServer, Turn};

fn main() {
    let mut args = std::env::args().skip(1);
    let mut port = 0u16;
    let mut script = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--port" => port = args.next().and_then(|p| p.parse().ok()).expect("--port N"),
            "-h" | "--help" => {
                println!("usage: model-server [--port N] SCRIPT.json");
                return;
            }
            _ => script = Some(a),
        }
    }
    let script = script.expect("usage: model-server [--port N] SCRIPT.json");
    let text = std::fs::read_to_string(&script).expect("the script file");
    let value: serde_json::Value = serde_json::from_str(&text).expect("the script is JSON");
    let turns: Vec<Turn> = value
        .as_array()
        .expect("the script is a JSON array of turns")
        .iter()
        .map(|t| Turn::from_json(t).unwrap_or_else(|| panic!("not a turn: {t}")))
        .collect();
    let server = ModelServer::start_on(&format!("127.0.0.1:{port}"), turns).expect("bind");
    println!("listening on {}", server.base_url());
    let mut seen = 0;
    loop {
        let reqs = server.model_requests();
        for r in &reqs[seen..] {
            println!(
                "{} {} tools={:?} tool_results={}",
                r.method,
                r.path,
                r.tool_names(),
                r.tool_results()
            );
        }
        seen = reqs.len();
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
