//! One handler per connection: reads request lines (at most 1 MiB each),
//! runs requests concurrently (responses carry their ids, so they may be
//! pipelined), writes responses and notifications through one writer.

use super::dispatch;
use crate::engine::Supervisor;
use crate::protocol::{self, codes, Call, Decoded, Request, RpcError, MAX_LINE};
use policy::rights::Requester;
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::sync::{broadcast, mpsc, watch, Notify, Semaphore};
use tokio::task::{JoinHandle, JoinSet};

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

/// Answers a connection whose caller could not be judged (the daemon is
/// out of descriptors or memory) with one -32603 error and closes it.
pub async fn refuse_busy(stream: UnixStream, why: &super::peer::PeerError) {
    let (_rd, mut wr) = stream.into_split();
    let e = RpcError::new(
        codes::INTERNAL_ERROR,
        format!("internal error: the daemon cannot tell who is calling ({why}); try again"),
    );
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
    requester: Option<Requester>,
) {
    let (rd, wr) = stream.into_split();
    let mut reader = BufReader::with_capacity(64 * 1024, rd);
    let (tx, rx) = mpsc::channel::<Vec<u8>>(OUTBOX);
    let writer = tokio::spawn(write_lines(wr, rx));
    let mut conn = Connection::new(sup, tx, shutdown.clone(), requester);
    let mut buf = Vec::new();
    let mut last_request = tokio::time::Instant::now();
    loop {
        let idle_at = last_request + idle;
        let can_idle = conn.can_idle();
        let next = tokio::select! {
            _ = tokio::time::sleep_until(idle_at), if can_idle => {
                tracing::debug!("closing an idle connection");
                Err(Close)
            }
            line = read_line(&mut reader, &mut buf) => match line {
                Ok(Line::Complete) => {
                    last_request = tokio::time::Instant::now();
                    conn.handle(&std::mem::take(&mut buf)).await
                }
                Ok(Line::TooLong) => {
                    conn.refuse_long_line().await;
                    Err(Close)
                }
                Ok(Line::Eof) | Err(_) => Err(Close),
            },
            Some(_) = conn.requests.join_next(), if !conn.requests.is_empty() => Ok(()),
            _ = conn.close.notified() => Err(Close),
            _ = stopped(&mut shutdown) => Err(Close),
        };
        if next.is_err() {
            break;
        }
    }
    conn.finish().await;
    let _ = writer.await;
}

/// Writes the connection's outgoing lines until every sender is gone or a
/// write fails, then shuts the socket's write side.
async fn write_lines(mut wr: OwnedWriteHalf, mut rx: mpsc::Receiver<Vec<u8>>) {
    while let Some(buf) = rx.recv().await {
        if wr.write_all(&buf).await.is_err() {
            break;
        }
    }
    let _ = wr.shutdown().await;
}

/// The connection is to be closed: the peer is gone, broke the rules or
/// stayed idle, or the daemon is shutting down.
struct Close;

/// What a connection holds between its lines.
struct Connection {
    sup: Supervisor,
    /// Lines for the writer task.
    tx: mpsc::Sender<Vec<u8>>,
    /// Notified by the subscription when it drops a slow subscriber.
    close: Arc<Notify>,
    in_flight: Arc<Semaphore>,
    requests: JoinSet<()>,
    subscription: Option<JoinHandle<()>>,
    stopping: watch::Receiver<bool>,
    /// The peer, when its uid is not the daemon's or root's.
    requester: Option<Requester>,
}

impl Connection {
    fn new(
        sup: Supervisor,
        tx: mpsc::Sender<Vec<u8>>,
        stopping: watch::Receiver<bool>,
        requester: Option<Requester>,
    ) -> Self {
        Connection {
            sup,
            tx,
            close: Arc::new(Notify::new()),
            in_flight: Arc::new(Semaphore::new(IN_FLIGHT)),
            requests: JoinSet::new(),
            subscription: None,
            stopping,
            requester,
        }
    }

    fn can_idle(&self) -> bool {
        self.requests.is_empty() && self.subscription.is_none()
    }

    async fn send(&self, line: Vec<u8>) -> Result<(), Close> {
        self.tx.send(line).await.map_err(|_| Close)
    }

    /// Answers one request line.
    async fn handle(&mut self, line: &[u8]) -> Result<(), Close> {
        match protocol::decode(line) {
            Decoded::Blank | Decoded::Error { reply: false, .. } => Ok(()),
            Decoded::Error { id, error, .. } => {
                self.send(protocol::error_response(&id, &error)).await
            }
            Decoded::Request(req) => match *req {
                Request {
                    id,
                    call: Call::Subscribe(p),
                } => self.switch_subscription(id, p.session_id).await,
                Request { id, call } => self.start(id, call).await,
            },
        }
    }

    /// One subscription per connection: the newest filter wins; the old one
    /// stops first, so no notice is delivered twice.
    async fn switch_subscription(
        &mut self,
        id: Option<Value>,
        session: Option<String>,
    ) -> Result<(), Close> {
        let result = match self.check_subscription(&session).await {
            Ok(()) => {
                if let Some(old) = self.subscription.take() {
                    old.abort();
                    let _ = old.await;
                }
                let who = self.requester.clone();
                let (task, v) = subscribe(&self.sup, session, who, &self.tx, &self.close);
                self.subscription = Some(task);
                Ok(v)
            }
            Err(e) => Err(e),
        };
        match id {
            Some(id) => self.send(reply(&id, result)).await,
            None => Ok(()),
        }
    }

    /// Runs a call in a task of its own once one of the IN_FLIGHT slots is
    /// free; its answer is sent when it is done.
    async fn start(&mut self, id: Option<Value>, call: Call) -> Result<(), Close> {
        let permit = tokio::select! {
            p = self.in_flight.clone().acquire_owned() => p.map_err(|_| Close)?,
            _ = stopped(&mut self.stopping) => return Err(Close),
        };
        let (sup, tx, stop) = (self.sup.clone(), self.tx.clone(), self.stopping.clone());
        let requester = self.requester.clone();
        self.requests.spawn(async move {
            let result = answer(&sup, call, stop, requester).await;
            if let Some(id) = id {
                let _ = tx.send(reply(&id, result)).await;
            }
            drop(permit);
        });
        Ok(())
    }

    /// Checks a subscribe's params: a session, when named, must be one the
    /// caller may use.
    async fn check_subscription(&self, session: &Option<String>) -> Result<(), RpcError> {
        if let Some(s) = session {
            crate::ids::check_session_id(s)
                .map_err(|e| RpcError::invalid_params("session_id", e))?;
            self.sup
                .may_use_session(s, self.requester.as_ref())
                .await
                .map_err(|e| RpcError::from(&e))?;
        }
        Ok(())
    }

    /// Tells the peer why the connection closes, if it still reads.
    async fn refuse_long_line(&self) {
        let e = RpcError::new(
            codes::INVALID_REQUEST,
            format!("request line exceeds the limit of {MAX_LINE} bytes (1 MiB); closing the connection"),
        );
        let _ = self.send(protocol::error_response(&Value::Null, &e)).await;
    }

    /// Stops the subscription and answers what is in flight (a shutdown
    /// cuts waits short with -32004) unless the peer is gone.
    async fn finish(mut self) {
        if let Some(task) = self.subscription.take() {
            task.abort();
        }
        let (requests, tx) = (&mut self.requests, &self.tx);
        tokio::select! {
            _ = async { while requests.join_next().await.is_some() {} } => {}
            _ = tx.closed() => requests.abort_all(),
        }
    }
}

/// The result of one call. Only a wait is cut short by a shutdown;
/// everything else is quick and must finish (a spawn_agent is recorded, so
/// its id must reach the caller).
async fn answer(
    sup: &Supervisor,
    call: Call,
    mut stop: watch::Receiver<bool>,
    requester: Option<Requester>,
) -> Result<Value, RpcError> {
    let interruptible = matches!(call, Call::WaitAgentRun(_));
    let work = dispatch::execute(sup, call, requester);
    if !interruptible {
        return work.await;
    }
    tokio::select! {
        r = work => r,
        _ = stopped(&mut stop) => Err(RpcError::new(
            codes::SHUTTING_DOWN,
            "the daemon is shutting down; wait again after it restarts",
        )),
    }
}

/// The response line for `result`.
fn reply(id: &Value, result: Result<Value, RpcError>) -> Vec<u8> {
    match result {
        Ok(v) => protocol::response(id, &v),
        Err(e) => protocol::error_response(id, &e),
    }
}

/// Starts forwarding finished-run notices (of one session, or all; of the
/// runs `who` may see) to this connection; `session` was checked by
/// [`Connection::check_subscription`].
fn subscribe(
    sup: &Supervisor,
    session: Option<String>,
    who: Option<Requester>,
    tx: &mpsc::Sender<Vec<u8>>,
    close: &Arc<Notify>,
) -> (tokio::task::JoinHandle<()>, Value) {
    let mut rx = sup.subscribe();
    let (sup, tx, close) = (sup.clone(), tx.clone(), close.clone());
    let filter = session.clone();
    let task = tokio::spawn(async move {
        loop {
            match rx.recv().await {
                Ok(n) => {
                    if filter.as_ref().is_some_and(|s| *s != n.session_id) {
                        continue;
                    }
                    if who.is_some() && !sup.run_visible(&n.run_id, who.as_ref()) {
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
