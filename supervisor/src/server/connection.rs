//! One handler per connection: reads request lines (at most 1 MiB each),
//! runs requests concurrently (responses carry their ids, so they may be
//! pipelined), writes responses and notifications through one writer.

use super::dispatch;
use crate::engine::Supervisor;
use crate::protocol::{self, codes, Call, Decoded, RpcError, MAX_LINE};
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::{broadcast, mpsc, watch, Notify, Semaphore};
use tokio::task::JoinSet;

/// Outgoing lines buffered per connection; a subscriber that lets this
/// fill up is disconnected rather than slowing anyone else.
const OUTBOX: usize = 1024;
/// Requests in flight per connection; more wait for one to finish.
const IN_FLIGHT: usize = 64;

/// Resolves once the daemon is shutting down (also if it already is).
async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

enum Line {
    Complete,
    TooLong,
    Eof,
}

/// Reads one line into `buf` (without the newline). Cancel-safe: partial
/// data stays in `buf` until a line completes.
async fn read_line(
    r: &mut BufReader<tokio::net::unix::OwnedReadHalf>,
    buf: &mut Vec<u8>,
) -> std::io::Result<Line> {
    loop {
        let avail = r.fill_buf().await?;
        if avail.is_empty() {
            return Ok(if buf.is_empty() {
                Line::Eof
            } else {
                Line::Complete
            });
        }
        match avail.iter().position(|&b| b == b'\n') {
            Some(i) => {
                let fits = buf.len() + i <= MAX_LINE;
                if fits {
                    buf.extend_from_slice(&avail[..i]);
                }
                r.consume(i + 1);
                return Ok(if fits { Line::Complete } else { Line::TooLong });
            }
            None => {
                let n = avail.len();
                if buf.len() + n > MAX_LINE {
                    r.consume(n);
                    return Ok(Line::TooLong);
                }
                buf.extend_from_slice(avail);
                r.consume(n);
            }
        }
    }
}

/// Answers a connection from inside a run with one -32006 error (id null:
/// nothing it sends is read) and closes it at once, so such connections
/// never linger.
pub async fn refuse(stream: UnixStream) {
    let (_rd, mut wr) = stream.into_split();
    let e = RpcError::new(codes::NOT_PERMITTED, "not permitted from a subagent");
    let _ = wr
        .write_all(&protocol::error_response(&Value::Null, &e))
        .await;
    let _ = wr.shutdown().await;
}

/// Answers a connection from a uid that may not use the daemon with one
/// -32007 error and closes it.
pub async fn refuse_uid(stream: UnixStream, uid: Option<u32>) {
    let (_rd, mut wr) = stream.into_split();
    let who = uid.map_or("an unknown uid".to_owned(), |u| format!("uid {u}"));
    let e = RpcError::new(
        codes::UID_NOT_ALLOWED,
        format!("permission denied: {who} may not use this daemon (allow_uids)"),
    );
    let _ = wr
        .write_all(&protocol::error_response(&Value::Null, &e))
        .await;
    let _ = wr.shutdown().await;
}

/// Serves one connection until the peer closes it, it breaks the rules, it
/// stays idle past `idle` (nothing in flight, no subscription, no request),
/// or the daemon shuts down.
pub async fn serve(
    sup: Supervisor,
    stream: UnixStream,
    mut shutdown: watch::Receiver<bool>,
    idle: std::time::Duration,
) {
    let (rd, mut wr) = stream.into_split();
    let mut reader = BufReader::with_capacity(64 * 1024, rd);
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(OUTBOX);
    let writer = tokio::spawn(async move {
        while let Some(buf) = rx.recv().await {
            if wr.write_all(&buf).await.is_err() {
                break;
            }
        }
        let _ = wr.shutdown().await;
    });
    let close = Arc::new(Notify::new());
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut requests = JoinSet::new();
    let mut subscription: Option<tokio::task::JoinHandle<()>> = None;
    let mut buf = Vec::new();
    let mut stopping = shutdown.clone();
    let mut last_request = tokio::time::Instant::now();
    loop {
        let idle_at = last_request + idle;
        let can_idle = requests.is_empty() && subscription.is_none();
        tokio::select! {
            _ = tokio::time::sleep_until(idle_at), if can_idle => {
                tracing::debug!("closing an idle connection");
                break;
            }
            line = read_line(&mut reader, &mut buf) => match line {
                Ok(Line::Complete) => {
                    last_request = tokio::time::Instant::now();
                    let line = std::mem::take(&mut buf);
                    match protocol::decode(&line) {
                        Decoded::Blank | Decoded::Error { reply: false, .. } => {}
                        Decoded::Error { id, error, .. } => {
                            if tx.send(protocol::error_response(&id, &error)).await.is_err() {
                                break;
                            }
                        }
                        Decoded::Request(req) => {
                            let reply_id = req.id.clone();
                            if let Call::Subscribe(p) = req.call {
                                let result = match check_subscription(&p.session_id) {
                                    Ok(()) => {
                                        // One subscription per connection: the newest
                                        // filter wins; the old one stops first, so no
                                        // notice is delivered twice.
                                        if let Some(old) = subscription.take() {
                                            old.abort();
                                            let _ = old.await;
                                        }
                                        let (task, v) = subscribe(&sup, p.session_id, &tx, &close);
                                        subscription = Some(task);
                                        Ok(v)
                                    }
                                    Err(e) => Err(e),
                                };
                                if let Some(id) = reply_id {
                                    let line = match result {
                                        Ok(v) => protocol::response(&id, &v),
                                        Err(e) => protocol::error_response(&id, &e),
                                    };
                                    if tx.send(line).await.is_err() {
                                        break;
                                    }
                                }
                                continue;
                            }
                            let permit = tokio::select! {
                                p = in_flight.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
                                _ = stopped(&mut stopping) => break,
                            };
                            let (sup, tx) = (sup.clone(), tx.clone());
                            let mut stop = stopping.clone();
                            requests.spawn(async move {
                                // Only a wait is cut short by a shutdown; everything
                                // else is quick and must finish (a spawn_agent is
                                // recorded, so its id must reach the caller).
                                let interruptible = matches!(req.call, Call::WaitAgentRun(_));
                                let work = dispatch::execute(&sup, req.call);
                                let result = if interruptible {
                                    tokio::select! {
                                        r = work => r,
                                        _ = stopped(&mut stop) => Err(RpcError::new(
                                            codes::SHUTTING_DOWN,
                                            "the daemon is shutting down; wait again after it restarts",
                                        )),
                                    }
                                } else {
                                    work.await
                                };
                                if let Some(id) = reply_id {
                                    let line = match result {
                                        Ok(v) => protocol::response(&id, &v),
                                        Err(e) => protocol::error_response(&id, &e),
                                    };
                                    let _ = tx.send(line).await;
                                }
                                drop(permit);
                            });
                        }
                    }
                }
                Ok(Line::TooLong) => {
                    let e = RpcError::new(
                        codes::INVALID_REQUEST,
                        format!("request line exceeds the limit of {MAX_LINE} bytes (1 MiB); closing the connection"),
                    );
                    let _ = tx.send(protocol::error_response(&Value::Null, &e)).await;
                    break;
                }
                Ok(Line::Eof) | Err(_) => break,
            },
            Some(_) = requests.join_next(), if !requests.is_empty() => {}
            _ = close.notified() => break,
            _ = stopped(&mut shutdown) => break,
        }
    }
    if let Some(task) = subscription {
        task.abort();
    }
    // Answer what is in flight (a shutdown cuts waits short with -32004)
    // unless the peer is gone.
    tokio::select! {
        _ = async { while requests.join_next().await.is_some() {} } => {}
        _ = tx.closed() => requests.abort_all(),
    }
    drop(tx);
    let _ = writer.await;
}

/// Checks a subscribe's params.
fn check_subscription(session: &Option<String>) -> Result<(), RpcError> {
    if let Some(s) = session {
        crate::ids::check_session_id(s).map_err(|e| RpcError::invalid_params("session_id", e))?;
    }
    Ok(())
}

/// Starts forwarding finished-run notices (of one session, or all) to this
/// connection; `session` was checked by [`check_subscription`].
fn subscribe(
    sup: &Supervisor,
    session: Option<String>,
    tx: &mpsc::Sender<Vec<u8>>,
    close: &Arc<Notify>,
) -> (tokio::task::JoinHandle<()>, Value) {
    let mut rx = sup.subscribe();
    let (tx, close) = (tx.clone(), close.clone());
    let filter = session.clone();
    let task = tokio::spawn(async move {
        loop {
            match rx.recv().await {
                Ok(n) => {
                    if filter.as_ref().is_some_and(|s| *s != n.session_id) {
                        continue;
                    }
                    let params = serde_json::to_value(&n).unwrap_or(Value::Null);
                    let line = protocol::notification("agent_run_finished", &params);
                    if tx.try_send(line).is_err() {
                        tracing::warn!(
                            "dropping a subscriber that does not read its notifications"
                        );
                        close.notify_one();
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "dropping a subscriber that fell behind");
                    close.notify_one();
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    });
    (task, json!({ "subscribed": true, "session_id": session }))
}
