//! How the proxy resolves names: asynchronously, with hickory-resolver
//! set up from the host's /etc/resolv.conf (name servers, search list,
//! timeout, attempts) and /etc/hosts, as the system resolver is; within a
//! time bound; and only a bounded number at once, per run and across
//! runs. A resolver that never answers holds no thread: the daemon's
//! blocking pool, which its control socket and its runs need, is never
//! touched by a lookup.

use hickory_resolver::config::{LookupIpStrategy, ResolveHosts};
use hickory_resolver::TokioResolver;
use std::net::IpAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The time a name has to resolve, waiting for a lookup slot included.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);
/// Lookups of one run in flight at once; more wait for a slot.
pub const LOOKUPS_PER_RUN: usize = 16;
/// Lookups of every run together in flight at once; more wait for a slot.
pub const MAX_LOOKUPS: usize = 128;

/// Why a name has no address the proxy can use.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The host's resolver configuration could not be read or used.
    #[error("cannot resolve {host}: no resolver ({why})")]
    NoResolver { host: String, why: String },
    /// The name servers answered with an error or no record.
    #[error("cannot resolve {host}: {source}")]
    Lookup {
        host: String,
        source: hickory_resolver::net::NetError,
    },
    /// The answer holds no address.
    #[error("{host} has no address")]
    NoAddress { host: String },
    /// No answer within [`RESOLVE_TIMEOUT`].
    #[error("cannot resolve {host} in {} s", RESOLVE_TIMEOUT.as_secs())]
    Timeout { host: String },
    /// Every lookup slot stayed taken for [`RESOLVE_TIMEOUT`].
    #[error(
        "cannot resolve {host}: {limit} lookups of {whose} were already in flight for {} s (the resolver is slow or not answering)",
        RESOLVE_TIMEOUT.as_secs()
    )]
    Busy {
        host: String,
        whose: &'static str,
        limit: usize,
    },
}

/// What answers the lookups.
enum Answers {
    /// Name servers, from the host's configuration.
    Dns(Box<TokioResolver>),
    /// The host's configuration was unusable: every lookup fails, saying
    /// why (literal addresses need no lookup and still work).
    Unavailable(String),
    /// Fixed answers (tests).
    #[cfg(test)]
    Fixed(Vec<(String, Vec<IpAddr>)>),
}

/// One run's resolver: its own cache and its share of lookups.
pub struct Resolver {
    answers: Answers,
    slots: Arc<Semaphore>,
    /// The run's lookups at once (what `slots` started with).
    per_run: usize,
}

/// The lookup slots every run draws from.
fn global() -> Arc<Semaphore> {
    static SLOTS: OnceLock<Arc<Semaphore>> = OnceLock::new();
    SLOTS
        .get_or_init(|| Arc::new(Semaphore::new(MAX_LOOKUPS)))
        .clone()
}

/// A resolver from the host's configuration, read now.
fn from_system() -> Result<TokioResolver, hickory_resolver::net::NetError> {
    let mut b = TokioResolver::builder_tokio()?;
    let o = b.options_mut();
    // The system resolver answered from /etc/hosts first: so does this one.
    o.use_hosts_file = ResolveHosts::Always;
    o.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
    o.timeout = o.timeout.min(RESOLVE_TIMEOUT);
    b.build()
}

impl Resolver {
    /// A run's resolver, from the host's /etc/resolv.conf and /etc/hosts
    /// as they are now.
    pub fn system() -> Resolver {
        let answers = match from_system() {
            Ok(r) => Answers::Dns(Box::new(r)),
            Err(e) => {
                tracing::warn!("egress resolver: /etc/resolv.conf: {e}; names will not resolve");
                Answers::Unavailable(format!("/etc/resolv.conf: {e}"))
            }
        };
        Resolver {
            answers,
            slots: Arc::new(Semaphore::new(LOOKUPS_PER_RUN)),
            per_run: LOOKUPS_PER_RUN,
        }
    }

    /// A resolver with fixed answers and `slots` lookups at once.
    #[cfg(test)]
    pub fn fixed(table: Vec<(String, Vec<IpAddr>)>, slots: usize) -> Resolver {
        Resolver {
            answers: Answers::Fixed(table),
            slots: Arc::new(Semaphore::new(slots)),
            per_run: slots,
        }
    }

    /// The addresses of `host`, within [`RESOLVE_TIMEOUT`] from now (the
    /// wait for a lookup slot included).
    pub async fn resolve(&self, host: &str) -> Result<Vec<IpAddr>, ResolveError> {
        let deadline = tokio::time::Instant::now() + RESOLVE_TIMEOUT;
        let _slots = self.slots(host, deadline).await?;
        let lookup = self.lookup(host);
        match tokio::time::timeout_at(deadline, lookup).await {
            Ok(Ok(a)) if a.is_empty() => Err(ResolveError::NoAddress {
                host: host.to_owned(),
            }),
            Ok(r) => r,
            Err(_) => Err(ResolveError::Timeout {
                host: host.to_owned(),
            }),
        }
    }

    /// A slot of the run's and one of the daemon's, by `deadline`.
    async fn slots(
        &self,
        host: &str,
        deadline: tokio::time::Instant,
    ) -> Result<(OwnedSemaphorePermit, OwnedSemaphorePermit), ResolveError> {
        let busy = |whose, limit| ResolveError::Busy {
            host: host.to_owned(),
            whose,
            limit,
        };
        let run = tokio::time::timeout_at(deadline, self.slots.clone().acquire_owned())
            .await
            .ok()
            .and_then(Result::ok)
            .ok_or_else(|| busy("the run", self.per_run))?;
        let all = tokio::time::timeout_at(deadline, global().acquire_owned())
            .await
            .ok()
            .and_then(Result::ok)
            .ok_or_else(|| busy("the daemon", MAX_LOOKUPS))?;
        Ok((run, all))
    }

    async fn lookup(&self, host: &str) -> Result<Vec<IpAddr>, ResolveError> {
        match &self.answers {
            Answers::Dns(r) => match r.lookup_ip(host).await {
                Ok(found) => Ok(found.iter().collect()),
                Err(source) => Err(ResolveError::Lookup {
                    host: host.to_owned(),
                    source,
                }),
            },
            Answers::Unavailable(why) => Err(ResolveError::NoResolver {
                host: host.to_owned(),
                why: why.clone(),
            }),
            #[cfg(test)]
            Answers::Fixed(table) => match table.iter().find(|(n, _)| n == host) {
                Some((_, ips)) if ips.is_empty() => std::future::pending().await,
                Some((_, ips)) => Ok(ips.clone()),
                None => Ok(Vec::new()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn a_lookup_over_the_runs_share_waits_then_is_refused_saying_why() {
        let ip: IpAddr = "93.184.216.34".parse().unwrap();
        let r = Arc::new(Resolver::fixed(
            vec![
                ("hang.test".into(), Vec::new()),
                ("a.test".into(), vec![ip]),
            ],
            1,
        ));
        assert_eq!(r.resolve("a.test").await.unwrap(), vec![ip]);
        assert!(matches!(
            r.resolve("none.test").await,
            Err(ResolveError::NoAddress { .. })
        ));
        let held = tokio::spawn({
            let r = r.clone();
            async move { r.resolve("hang.test").await }
        });
        tokio::task::yield_now().await;
        let e = r.resolve("a.test").await.unwrap_err();
        assert!(matches!(e, ResolveError::Busy { limit: 1, .. }), "{e}");
        assert!(e
            .to_string()
            .contains("1 lookups of the run were already in flight"));
        let e = held.await.unwrap().unwrap_err();
        assert!(matches!(e, ResolveError::Timeout { .. }), "{e}");
    }
}
