//! The daemon's metrics, as Prometheus reads them: counters kept in
//! memory from the engine's start, gauges read from the engine's live
//! state when they are asked for, and the text exposition of both
//! (Prometheus text 0.0.4 or OpenMetrics 1.0, by prometheus-client's
//! encoders). Every label value is one of a fixed set named here or in
//! [`reason`]: never a run id, a session id, a path or free text.
//! docs/operating.md lists each metric. Uses the run's record, the
//! runner's exit record and policy's names.

pub mod reason;

use crate::ids::RunId;
use crate::run::record::RunRecord;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use serde::{Deserialize, Serialize};
use std::sync::atomic::AtomicU64;
use subagent_runner::exit_record::ExitRecord;

/// The exposition formats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// Prometheus text format 0.0.4.
    #[default]
    Prometheus,
    /// OpenMetrics text 1.0.0 (ends with `# EOF`).
    OpenMetrics,
}

impl Format {
    /// The HTTP `Content-Type` of the format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// The metrics could not be written out.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The encoder failed (it writes to a string, so only on a bug).
    #[error("encoding the metrics: {0}")]
    Encode(#[from] std::fmt::Error),
}

/// What the gauges show, read from the engine when the metrics are asked
/// for.
#[derive(Debug, Clone, Copy, Default)]
pub struct Live {
    /// Runs holding a slot.
    pub running: usize,
    /// Runs waiting for one.
    pub queued: usize,
    /// Finished runs whose notice nobody has taken yet.
    pub notices_pending: u64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndLabels {
    state: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MechanismLabel {
    mechanism: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerdictLabel {
    verdict: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HowLabel {
    how: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DriverLabel {
    driver: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    driver: &'static str,
    direction: &'static str,
}

type FloatCounter = Counter<f64, AtomicU64>;

/// Every label name a metric has (`le` is a histogram bucket's bound).
pub const LABEL_NAMES: &[&str] = &[
    "state",
    "reason",
    "mechanism",
    "verdict",
    "how",
    "driver",
    "direction",
    "le",
];

/// The mechanisms a spawn can be refused for (`EngineError::Sandbox`):
/// the config's `require` names, and the engine's own three.
fn mechanisms() -> Vec<&'static str> {
    use policy::sandbox::Mechanism as M;
    let required = [
        M::Landlock,
        M::Seccomp,
        M::CapabilityDrop,
        M::NetworkIsolation,
        M::Cgroup,
        M::Namespaces,
    ];
    let mut all: Vec<&'static str> = required.iter().map(|m| m.as_str()).collect();
    all.extend(["run_as", "per_run_uid", "requester_rights"]);
    all
}

/// The engine's metrics and the registry that writes them out.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    accepted: Counter,
    started: Counter,
    ended: Family<EndLabels, Counter>,
    spawn_to_exec: Histogram,
    spawn_to_notice: Histogram,
    sandbox_refusals: Family<MechanismLabel, Counter>,
    egress: Family<VerdictLabel, Counter>,
    log_bytes: Counter,
    output_capped: Counter,
    recovered: Family<HowLabel, Counter>,
    pruned: Family<ReasonLabel, Counter>,
    driver_runs: Family<DriverLabel, Counter>,
    driver_turns: Family<DriverLabel, Counter>,
    driver_tokens: Family<TokenLabels, Counter>,
    driver_cost: Family<DriverLabel, FloatCounter>,
    running: Gauge,
    queued: Gauge,
    notices_pending: Gauge,
}

/// spawn → exec buckets, in seconds: a few ms on an idle host, up to the
/// queue's wait.
const EXEC_BUCKETS: &[f64] = &[
    0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];
/// spawn → notice buckets, in seconds: a trivial run to a long agent run.
const NOTICE_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0,
    3600.0, 7200.0, 21600.0,
];

impl Metrics {
    /// The metrics of an engine that is its state dir's `starts`th start.
    pub fn new(starts: u64) -> Metrics {
        let m = Metrics {
            registry: Registry::with_prefix("subagentd"),
            accepted: Counter::default(),
            started: Counter::default(),
            ended: Family::default(),
            spawn_to_exec: Histogram::new(EXEC_BUCKETS.iter().copied()),
            spawn_to_notice: Histogram::new(NOTICE_BUCKETS.iter().copied()),
            sandbox_refusals: Family::default(),
            egress: Family::default(),
            log_bytes: Counter::default(),
            output_capped: Counter::default(),
            recovered: Family::default(),
            pruned: Family::default(),
            driver_runs: Family::default(),
            driver_turns: Family::default(),
            driver_tokens: Family::default(),
            driver_cost: Family::default(),
            running: Gauge::default(),
            queued: Gauge::default(),
            notices_pending: Gauge::default(),
        };
        m.with_zeros().registered(starts)
    }

    /// The series an alert watches made at 0, so that their first
    /// increase is seen as one.
    fn with_zeros(self) -> Metrics {
        let _ = self.ended.get_or_create(&EndLabels {
            state: "lost",
            reason: reason::ReasonClass::RunnerLost.as_str(),
        });
        for mechanism in mechanisms() {
            let _ = self
                .sandbox_refusals
                .get_or_create(&MechanismLabel { mechanism });
        }
        for verdict in ["allowed", "refused", "failed"] {
            let _ = self.egress.get_or_create(&VerdictLabel { verdict });
        }
        for how in ["adopted", "ended", "requeued"] {
            let _ = self.recovered.get_or_create(&HowLabel { how });
        }
        use policy::retention::Reason as R;
        for r in [
            R::MaxAge,
            R::MaxRuns,
            R::MaxRunsPerSession,
            R::MaxBytes,
            R::OnDemand,
        ] {
            let _ = self
                .pruned
                .get_or_create(&ReasonLabel { reason: r.as_str() });
        }
        use policy::driver::Driver;
        for driver in [Driver::ClaudeCode.as_str(), Driver::Codex.as_str()] {
            let label = DriverLabel { driver };
            let _ = self.driver_runs.get_or_create(&label);
            let _ = self.driver_turns.get_or_create(&label);
            let _ = self.driver_cost.get_or_create(&label);
            for direction in ["in", "out"] {
                let _ = self
                    .driver_tokens
                    .get_or_create(&TokenLabels { driver, direction });
            }
        }
        self
    }

    /// Registers every metric (the daemon's start count and start time,
    /// which never change, registered as they are).
    fn registered(mut self, starts: u64) -> Metrics {
        let r = &mut self.registry;
        let daemon_starts = Counter::<u64>::default();
        daemon_starts.inc_by(starts);
        let start_time = Gauge::<f64, AtomicU64>::default();
        start_time.set(crate::timefmt::now_ms() as f64 / 1000.0);
        r.register(
            "daemon_starts",
            "Starts of the daemon on this state dir, ever (kept in state.db)",
            daemon_starts,
        );
        r.register_with_unit(
            "daemon_start_time",
            "When this daemon started, in seconds since the epoch",
            Unit::Seconds,
            start_time,
        );
        r.register(
            "runs_accepted",
            "Runs accepted (recorded) since the daemon started",
            self.accepted.clone(),
        );
        r.register(
            "runs_started",
            "Runs whose runner was started since the daemon started",
            self.started.clone(),
        );
        r.register(
            "runs_ended",
            "Runs finished (result.md and notice made) since the daemon started, by end state and reason class",
            self.ended.clone(),
        );
        r.register(
            "runs_running",
            "Runs holding a slot now",
            self.running.clone(),
        );
        r.register(
            "runs_queued",
            "Runs waiting for a slot now",
            self.queued.clone(),
        );
        r.register(
            "notices_pending",
            "Finished runs whose notice has not been taken",
            self.notices_pending.clone(),
        );
        // Histograms carry their unit in the name only: some OpenMetrics
        // parsers refuse a histogram's UNIT line.
        r.register(
            "spawn_to_exec_seconds",
            "From a run's acceptance to its agent's first exec, observed at the run's end",
            self.spawn_to_exec.clone(),
        );
        r.register(
            "spawn_to_notice_seconds",
            "From a run's acceptance to its notice",
            self.spawn_to_notice.clone(),
        );
        self.register_rest();
        self
    }

    fn register_rest(&mut self) {
        let r = &mut self.registry;
        r.register(
            "sandbox_refusals",
            "Spawns refused because a required sandbox mechanism cannot be enforced, by mechanism",
            self.sandbox_refusals.clone(),
        );
        r.register(
            "egress_connections",
            "Egress proxy connection attempts of ended runs, by verdict",
            self.egress.clone(),
        );
        r.register_with_unit(
            "log_captured",
            "Bytes of agent output written to child.log, counted at each run's end",
            Unit::Bytes,
            self.log_bytes.clone(),
        );
        r.register(
            "runs_output_capped",
            "Ended runs whose child.log was cut at the output cap",
            self.output_capped.clone(),
        );
        r.register(
            "runs_recovered",
            "Runs picked up again when the daemon started, by what became of them",
            self.recovered.clone(),
        );
        r.register(
            "runs_pruned",
            "Runs removed by retention, by the limit that removed them",
            self.pruned.clone(),
        );
        r.register(
            "driver_runs",
            "Ended runs of a driver whose agent's report was read",
            self.driver_runs.clone(),
        );
        r.register(
            "driver_turns",
            "Model turns the agents reported, by driver",
            self.driver_turns.clone(),
        );
        r.register(
            "driver_tokens",
            "Tokens the agents reported, by driver and direction",
            self.driver_tokens.clone(),
        );
        r.register_with_unit(
            "driver_cost",
            "Cost the agents reported, in US dollars, by driver",
            Unit::Other("usd".into()),
            self.driver_cost.clone(),
        );
    }

    /// A run was accepted.
    pub fn accepted(&self) {
        self.accepted.inc();
    }

    /// A run's runner was started.
    pub fn started(&self) {
        self.started.inc();
    }

    /// A spawn was refused: `mechanism` cannot be enforced.
    pub fn sandbox_refused(&self, mechanism: &'static str) {
        self.sandbox_refusals
            .get_or_create(&MechanismLabel { mechanism })
            .inc();
    }

    /// A run's runner ended and left exit.json `x`.
    pub fn runner_exited(&self, run: &RunId, x: &ExitRecord) {
        self.log_bytes.inc_by(x.log_bytes);
        if let Some(exec) = x.exec_at_us {
            self.spawn_to_exec.observe(seconds(exec, run.created_us()));
        }
    }

    /// A run was finalized: its notice exists from now on.
    pub fn finalized(&self, rec: &RunRecord) {
        let labels = EndLabels {
            state: rec.state().as_str(),
            reason: reason::classify(rec).as_str(),
        };
        self.ended.get_or_create(&labels).inc();
        let now = crate::timefmt::now_micros();
        self.spawn_to_notice
            .observe(seconds(now, rec.run_id.created_us()));
        if rec.log_truncated {
            self.output_capped.inc();
        }
        if let Some(e) = rec.end().and_then(|e| e.egress.as_ref()) {
            for (verdict, n) in [
                ("allowed", e.allowed),
                ("refused", e.refused),
                ("failed", e.failed),
            ] {
                self.egress
                    .get_or_create(&VerdictLabel { verdict })
                    .inc_by(n);
            }
        }
        self.usage(rec);
    }

    /// What a driver's agent reported it used.
    fn usage(&self, rec: &RunRecord) {
        let Some(run) = rec.driver_run.as_ref() else {
            return;
        };
        let Some(report) = run.report.as_ref() else {
            return;
        };
        let driver = run.driver.as_str();
        let label = DriverLabel { driver };
        self.driver_runs.get_or_create(&label).inc();
        self.driver_turns
            .get_or_create(&label)
            .inc_by(report.turns.unwrap_or(0));
        for (direction, n) in [("in", report.input_tokens), ("out", report.output_tokens)] {
            self.driver_tokens
                .get_or_create(&TokenLabels { driver, direction })
                .inc_by(n.unwrap_or(0));
        }
        let cost = report.cost_usd.filter(|c| c.is_finite() && *c > 0.0);
        self.driver_cost
            .get_or_create(&label)
            .inc_by(cost.unwrap_or(0.0));
    }

    /// What recovery did at start: runners found alive and watched again,
    /// runs that ended while no daemon watched, runs queued again.
    pub fn recovered(&self, adopted: u64, ended: u64, requeued: u64) {
        for (how, n) in [
            ("adopted", adopted),
            ("ended", ended),
            ("requeued", requeued),
        ] {
            self.recovered.get_or_create(&HowLabel { how }).inc_by(n);
        }
    }

    /// Retention removed a run for `reason`.
    pub fn pruned(&self, reason: policy::retention::Reason) {
        self.pruned
            .get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            })
            .inc();
    }

    /// The exposition in `format`, the gauges set from `live`.
    pub fn encode(&self, live: Live, format: Format) -> Result<String, MetricsError> {
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.running.set(gauge(live.running as u64));
        self.queued.set(gauge(live.queued as u64));
        self.notices_pending.set(gauge(live.notices_pending));
        let mut out = String::new();
        match format {
            Format::Prometheus => {
                prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)?
            }
            Format::OpenMetrics => {
                prometheus_client::encoding::text::encode(&mut out, &self.registry)?
            }
        }
        Ok(out)
    }
}

/// The seconds from `from_us` to `to_us` (0 when the clock went back).
fn seconds(to_us: u64, from_us: u64) -> f64 {
    to_us.saturating_sub(from_us) as f64 / 1e6
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::run::driver::{Delivery, DriverRun};
    use crate::run::record::EndState;

    fn ended(state: EndState) -> RunRecord {
        let mut r: RunRecord = serde_json::from_value(serde_json::json!({
            "format": 1, "run_id": "20261130T055552.123456Z-a1b2c3d4", "session_id": "s-secret",
            "audience": "team", "project_dir": "/home/u/p", "task": "t", "context": null,
            "command": ["x"], "env": {}, "limits": {}, "keep_temp": false,
            "state": "running", "exit_code": null, "signal": null, "reason": null,
            "cancel_requested": false, "created_at_ms": 1, "started_at_ms": 2,
            "ended_at_ms": null, "temp_dir": "/tmp/x", "run_dir": "/state/r",
            "runner_pid": 10, "runner_start_ticks": 5, "log_truncated": true,
            "finalized": false, "finalize_error": null
        }))
        .unwrap();
        r.ended(state, "why /home/u/p".into(), 3);
        r
    }

    #[test]
    fn an_end_counts_its_usage_egress_and_output_cap_under_fixed_labels() {
        let m = Metrics::new(7);
        let mut r = ended(EndState::Succeeded);
        r.driver_run = Some(DriverRun {
            driver: policy::driver::Driver::Codex,
            delivered: Delivery::default(),
            report: Some(policy::agentstream::AgentReport {
                turns: Some(3),
                input_tokens: Some(1200),
                output_tokens: Some(345),
                cost_usd: Some(0.25),
                ..Default::default()
            }),
            reported_files: None,
            writes_project: None,
            budget: None,
        });
        if let Some(e) = r.end_mut() {
            e.egress = Some(crate::run::egress::EgressSummary {
                allowed: 4,
                refused: 2,
                refused_hosts: vec!["evil.example:443".into()],
                ..Default::default()
            });
        }
        m.finalized(&r);
        m.finalized(&ended(EndState::Lost));
        let live = Live {
            running: 2,
            queued: 1,
            notices_pending: 9,
        };
        let text = m.encode(live, Format::Prometheus).unwrap();
        for line in [
            "subagentd_daemon_starts_total 7",
            "subagentd_runs_ended_total{state=\"succeeded\",reason=\"exit_code\"} 1",
            "subagentd_runs_ended_total{state=\"lost\",reason=\"runner_lost\"} 1",
            "subagentd_driver_turns_total{driver=\"codex\"} 3",
            "subagentd_driver_tokens_total{driver=\"codex\",direction=\"in\"} 1200",
            "subagentd_driver_tokens_total{driver=\"codex\",direction=\"out\"} 345",
            "subagentd_driver_cost_usd_total{driver=\"codex\"} 0.25",
            "subagentd_driver_runs_total{driver=\"codex\"} 1",
            "subagentd_egress_connections_total{verdict=\"allowed\"} 4",
            "subagentd_egress_connections_total{verdict=\"refused\"} 2",
            "subagentd_runs_output_capped_total 2",
            "subagentd_runs_running 2",
            "subagentd_runs_queued 1",
            "subagentd_notices_pending 9",
            "subagentd_spawn_to_notice_seconds_count 2",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        for secret in ["a1b2c3d4", "s-secret", "/home", "evil", "why"] {
            assert!(!text.contains(secret), "{secret} in\n{text}");
        }
        let om = m.encode(live, Format::OpenMetrics).unwrap();
        assert!(om.ends_with("# EOF\n"), "{om}");
    }

    #[test]
    fn every_label_name_is_a_listed_one() {
        let text = Metrics::new(1)
            .encode(Live::default(), Format::Prometheus)
            .unwrap();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((_, rest)) = line.split_once('{') else {
                continue;
            };
            let labels = rest.split_once('}').unwrap().0;
            for pair in labels.split(',') {
                let name = pair.split_once('=').unwrap().0;
                assert!(LABEL_NAMES.contains(&name), "{name} in {line}");
            }
        }
    }
}
