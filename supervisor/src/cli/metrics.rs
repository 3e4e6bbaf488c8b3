//! `subagent metrics`: the daemon's metrics, as its `metrics` method
//! gives them (`--json`: the method's result).

use super::stdout;
use anyhow::{Context, Result};
use serde_json::{json, Value};

/// The method's params: Prometheus text, or OpenMetrics with
/// `openmetrics`.
pub fn params(openmetrics: bool) -> Value {
    let format = if openmetrics {
        crate::metrics::Format::OpenMetrics
    } else {
        crate::metrics::Format::Prometheus
    };
    json!({ "format": format })
}

/// Prints the method's result `v`: its text, the daemon's own (metric
/// names, fixed label values and numbers, nothing a child wrote); with
/// `json`, the result itself.
pub fn print(v: &Value, json: bool) -> Result<u8> {
    if json {
        stdout::line(&serde_json::to_string_pretty(v)?)?;
        return Ok(0);
    }
    let text = v["text"]
        .as_str()
        .context("bad metrics result from the daemon: no text")?;
    stdout::write(text)?;
    Ok(0)
}
