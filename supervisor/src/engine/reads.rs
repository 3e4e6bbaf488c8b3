//! The engine's reads that change nothing: a page of a list, usage's
//! sums, the live runs' samples and the metrics. Each costs what it
//! returns (a page, the live runs, one indexed sum), never the history.

use super::state::{blocking, run_owner};
use super::{sample, EngineError, ListPage, Supervisor};
use crate::status::RunStatus;
use crate::store::ListQuery;

impl Supervisor {
    /// One page of the runs `q` selects that `who` may see, in the query's
    /// order, and the cursor of the next page: the rows of the store, each
    /// run that is not settled shown as its slot has it. The cost is the
    /// page's, not the history's.
    pub fn list(
        &self,
        q: &ListQuery,
        who: Option<&policy::rights::Requester>,
    ) -> Result<ListPage, EngineError> {
        let mut q = q.clone();
        if let Some(w) = who {
            q.owner_uid = Some(w.uid);
        }
        let page = self.inner.store.list(&q)?;
        let runs = page
            .runs
            .into_iter()
            .map(|r| match self.inner.live_slot(&r.run_id) {
                Some(slot) => (slot.snapshot(), Some(slot)),
                None => (r, None),
            })
            .filter(|(r, _)| q.state.is_none_or(|s| r.state() == s))
            .filter(|(r, _)| policy::rights::may_act_on(who, run_owner(r)))
            .map(|(r, slot)| {
                let mut st = RunStatus::from(&r);
                if let Some(u) = slot.and_then(|s| s.usage_so_far(&r)) {
                    st.usage = Some(u);
                }
                st
            })
            .collect();
        Ok(ListPage {
            runs,
            next: page.next,
        })
    }

    /// The usage of the runs `q` selects that `who` may see (another uid:
    /// its own), summed per driver and in all; tombstones count. Read
    /// from the runs' columns, through the session's index when `q` names
    /// one.
    pub async fn usage(
        &self,
        q: crate::store::UsageQuery,
        who: Option<&policy::rights::Requester>,
    ) -> Result<crate::usage::UsageSummary, EngineError> {
        if let Some(s) = &q.session {
            crate::ids::check_session_id(s).map_err(|p| EngineError::invalid("session_id", p))?;
        }
        let mut q = q;
        if let Some(w) = who {
            q.owner_uid = Some(w.uid);
        }
        let store = self.inner.store.clone();
        let q2 = q.clone();
        let rows = blocking(move || Ok(store.usage(&q2)?)).await?;
        let mut out = crate::usage::UsageSummary {
            session_id: q.session,
            ..Default::default()
        };
        for (driver, totals) in rows {
            out.totals.add(&totals);
            out.by_driver.insert(driver, totals);
        }
        Ok(out)
    }

    /// The live runs `q` selects that `who` may see, and those that ended
    /// in the last minute, oldest first, each with a sample of its
    /// processes and its log's last line. The cost grows with the live
    /// runs, not the history.
    pub async fn sample(
        &self,
        q: crate::protocol::SampleParams,
        who: Option<&policy::rights::Requester>,
    ) -> Result<Vec<crate::status::SampledRun>, EngineError> {
        if let Some(s) = &q.session_id {
            crate::ids::check_session_id(s).map_err(|p| EngineError::invalid("session_id", p))?;
        }
        let (inner, who) = (self.inner.clone(), who.cloned());
        blocking(move || sample::sample(&inner, &q, who.as_ref())).await
    }

    /// The metrics in `format`: the counters since the engine started and
    /// the gauges as they are now (docs/operating.md lists them).
    pub fn metrics(
        &self,
        format: crate::metrics::Format,
    ) -> Result<String, crate::metrics::MetricsError> {
        let (running, queued) = self.load();
        let live = crate::metrics::Live {
            running,
            queued,
            notices_pending: self.inner.store.notices_pending(),
        };
        self.inner.metrics.encode(live, format)
    }
}
