//! One call to the engine per request; the result as JSON.

use crate::engine::Supervisor;
use crate::ids::RunId;
use crate::protocol::{Call, RpcError};
use serde_json::{json, Value};
use std::time::Duration;

fn run_id(s: &str) -> Result<RunId, RpcError> {
    RunId::parse(s)
        .ok_or_else(|| RpcError::invalid_params("run_id", format!("{s:?} is not a run id")))
}

/// The run id, when `who` may see that run (another uid's: not found).
fn visible_run(
    sup: &Supervisor,
    s: &str,
    who: Option<&policy::rights::Requester>,
) -> Result<RunId, RpcError> {
    let id = run_id(s)?;
    sup.check_visible(&id, who)
        .map_err(|e| RpcError::from(&e))?;
    Ok(id)
}

fn to_value<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// Executes `call` (every method but `subscribe`, which belongs to the
/// connection) for `requester` (None: the daemon's uid or root, who see
/// everything). Another uid acts on its own runs and sessions only: a run
/// of someone else's is answered as unknown, a session refused.
pub async fn execute(
    sup: &Supervisor,
    call: Call,
    requester: Option<policy::rights::Requester>,
) -> Result<Value, RpcError> {
    let r = |e: crate::engine::EngineError| RpcError::from(&e);
    let who = requester.as_ref();
    match call {
        Call::SpawnAgent(p) => {
            let id = sup.spawn_for(*p, requester).await.map_err(r)?;
            Ok(json!({"run_id": id.as_str(), "state": "accepted"}))
        }
        Call::CheckAgentRun(p) => {
            let id = visible_run(sup, &p.run_id, who)?;
            let status = if p.cancel {
                sup.cancel(&id).await.map_err(r)?
            } else {
                sup.status(&id).map_err(r)?
            };
            Ok(to_value(&status))
        }
        Call::WaitAgentRun(p) => {
            let id = visible_run(sup, &p.run_id, who)?;
            let status = sup
                .wait(&id, p.timeout_ms.map(Duration::from_millis))
                .await
                .map_err(r)?;
            Ok(to_value(&status))
        }
        Call::CancelAgentRun(p) => {
            let id = visible_run(sup, &p.run_id, who)?;
            Ok(to_value(&sup.cancel(&id).await.map_err(r)?))
        }
        Call::ListAgentRuns(p) => {
            if let Some(s) = &p.session_id {
                crate::ids::check_session_id(s)
                    .map_err(|e| RpcError::invalid_params("session_id", e))?;
            }
            let page = p.page()?;
            let q = crate::store::ListQuery {
                session: p.session_id,
                state: p.state,
                // Root and the daemon's uid see every run, others their own.
                owner_uid: who.map(|r| r.uid),
                since_ms: page.since_ms,
                until_ms: page.until_ms,
                after: page.after,
                desc: page.desc,
                limit: page.limit,
            };
            let page = sup.list(&q, who).map_err(r)?;
            let next = page.next.as_ref().map(crate::paging::encode_cursor);
            Ok(json!({ "runs": page.runs, "next_cursor": next }))
        }
        Call::SampleAgentRuns(p) => {
            let runs = sup.sample(p, who).await.map_err(r)?;
            Ok(
                json!({ "runs": runs, "sampled_at": crate::timefmt::rfc3339_ms(crate::timefmt::now_ms()) }),
            )
        }
        Call::TakeNotices(p) => {
            let notices = sup.take_notices(&p.session_id, who).await.map_err(r)?;
            Ok(json!({ "notices": notices }))
        }
        Call::TouchFiles(p) => {
            let state = sup
                .touch_files(&p.session_id, p.files, who)
                .await
                .map_err(r)?;
            Ok(json!({ "recent_files": state.recent_files }))
        }
        Call::WorkingContext(p) => sup.working_context(&p.session_id, who).await.map_err(r),
        Call::PruneRuns(p) => Ok(to_value(&sup.prune_runs(p, requester).await.map_err(r)?)),
        Call::Metrics(p) => metrics(sup, &p, who),
        Call::Usage(p) => {
            if let Some(s) = &p.session_id {
                crate::ids::check_session_id(s)
                    .map_err(|e| RpcError::invalid_params("session_id", e))?;
            }
            let q = crate::store::UsageQuery {
                session: p.session_id,
                // Root and the daemon's uid sum every run, others their own.
                owner_uid: who.map(|r| r.uid),
                since_ms: crate::paging::time_param("since", p.since.as_deref())?,
                until_ms: crate::paging::time_param("until", p.until.as_deref())?,
            };
            let mut sum = sup.usage(q, who).await.map_err(r)?;
            (sum.since, sum.until) = (p.since, p.until);
            Ok(to_value(&sum))
        }
        Call::Ping => Ok(json!({
            "version": env!("CARGO_PKG_VERSION"),
            "pid": std::process::id(),
        })),
        Call::Subscribe(_) => Err(RpcError::new(
            crate::protocol::codes::INTERNAL_ERROR,
            "subscribe is handled by the connection",
        )),
    }
}

/// `metrics`: the exposition, for the daemon's uid and root only (the
/// counts are of every user's runs).
fn metrics(
    sup: &Supervisor,
    p: &crate::protocol::MetricsParams,
    who: Option<&policy::rights::Requester>,
) -> Result<Value, RpcError> {
    if let Some(w) = who {
        return Err(RpcError::new(
            crate::protocol::codes::NOT_PERMITTED,
            format!(
                "permission denied: metrics count every user's runs; only the daemon's uid and root may read them (not uid {})",
                w.uid
            ),
        ));
    }
    let text = sup
        .metrics(p.format)
        .map_err(|e| RpcError::new(crate::protocol::codes::INTERNAL_ERROR, e.to_string()))?;
    Ok(json!({"content_type": p.format.content_type(), "text": text}))
}
