//! Telling systemd how the daemon is (`Type=notify`): READY=1 once the
//! socket is served, STATUS= with the runs running and queued, WATCHDOG=1
//! at half the unit's `WatchdogSec`, STOPPING=1 at shutdown. Without
//! `NOTIFY_SOCKET` every call is a no-op.

use crate::engine::Supervisor;
use sd_notify::NotifyState;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Set at shutdown: the status task ends and lets the engine go.
static STOPPED: AtomicBool = AtomicBool::new(false);

/// How often STATUS is refreshed when no watchdog asks for more.
const STATUS_EVERY: Duration = Duration::from_secs(5);

fn status_line(sup: &Supervisor) -> String {
    let (running, queued) = sup.load();
    format!("{running} running, {queued} queued")
}

fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!("notifying the service manager: {e}");
    }
}

/// READY=1 with a first STATUS, then a task that keeps STATUS fresh and
/// pings the watchdog from the runtime that serves the socket (a wedged
/// runtime stops the pings, and systemd restarts the daemon).
pub fn ready(sup: &Supervisor) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    send(&[NotifyState::Ready, NotifyState::Status(&status_line(sup))]);
    let watchdog = sd_notify::watchdog_enabled();
    let every = watchdog.map_or(STATUS_EVERY, |w| (w / 2).max(Duration::from_millis(10)));
    let sup = sup.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if STOPPED.load(Ordering::Relaxed) {
                return;
            }
            let status = status_line(&sup);
            match watchdog {
                Some(_) => send(&[NotifyState::Watchdog, NotifyState::Status(&status)]),
                None => send(&[NotifyState::Status(&status)]),
            }
        }
    });
}

/// STOPPING=1: the daemon is shutting down.
pub fn stopping() {
    STOPPED.store(true, Ordering::Relaxed);
    send(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
}
