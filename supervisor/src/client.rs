//! A blocking client for the control socket, used by the `subagent` CLI.

use crate::protocol::RpcError;
use crate::trust::{Trust, TrustError};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

/// A call over the socket failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing answers on the socket, or what does is not trusted.
    #[error(transparent)]
    Connect(#[from] TrustError),
    /// The connection broke.
    #[error("socket i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The daemon answered with an error.
    #[error("{} (code {})", .0.message, .0.code)]
    Rpc(RpcError),
    /// The daemon's answer made no sense.
    #[error("protocol: {0}")]
    Protocol(String),
}

/// One connection to the daemon.
pub struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    next_id: u64,
}

impl Client {
    /// Connects to the socket at `path`, once its directories and its
    /// listener pass the checks of [`crate::trust`].
    pub fn connect(path: &Path, trust: &Trust) -> Result<Client, ClientError> {
        let stream = crate::trust::connect(path, trust)?;
        let writer = stream.try_clone()?;
        Ok(Client {
            reader: BufReader::new(stream),
            writer,
            next_id: 1,
        })
    }

    /// Calls `method` with `params` and returns its result. Notifications
    /// arriving meanwhile are skipped.
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        let mut line = serde_json::to_vec(&json!({
            "jsonrpc": "2.0", "id": id, "method": method, "params": params,
        }))
        .map_err(|e| ClientError::Protocol(e.to_string()))?;
        line.push(b'\n');
        self.writer.write_all(&line)?;
        loop {
            let mut buf = String::new();
            if self.reader.read_line(&mut buf)? == 0 {
                return Err(ClientError::Protocol(
                    "the daemon closed the connection".into(),
                ));
            }
            let msg: Value = serde_json::from_str(&buf)
                .map_err(|e| ClientError::Protocol(format!("bad response: {e}")))?;
            if msg.get("id") != Some(&json!(id)) {
                continue;
            }
            if let Some(err) = msg.get("error") {
                let err: RpcError = serde_json::from_value(err.clone())
                    .map_err(|e| ClientError::Protocol(format!("bad error object: {e}")))?;
                return Err(ClientError::Rpc(err));
            }
            return msg
                .get("result")
                .cloned()
                .ok_or_else(|| ClientError::Protocol("response without result".into()));
        }
    }
}
