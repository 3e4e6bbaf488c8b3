//! Applying a run's [`SandboxSpec`] to the agent process.
//!
//! [`prepare`] runs in the runner before each attempt: it probes the
//! kernel, compiles the seccomp filters, makes the cgroups and the user
//! namespaces of idmapped mounts, and refuses the run when a required
//! mechanism cannot be enforced. The attempt's process is then cloned
//! into new namespaces ([`namespaces`]) as the run's init, which joins the
//! cgroups and builds the run's root ([`root`], [`Prepared::setup_in_init`]);
//! the agent it forks applies the rest in a fixed order
//! ([`Prepared::apply_in_agent`]): rlimits → Landlock rules opened →
//! bounding set → user → capabilities → no_new_privs → Landlock → seccomp.
//!
//! - [`landlock`], [`seccomp`], [`caps`], [`rlimits`], [`cgroup`],
//!   [`namespaces`], [`mountapi`]: one file per kernel concern.
//! - [`egress`]: the allowlist mode's relay to the daemon's proxy.
//! - [`root`]: the run's root file system; [`idmap`]: the user namespaces
//!   of its idmapped mounts; [`scratch`]: its size-bounded scratch tmpfs.
//! - [`report`]: what was enforced, recorded with every run.

pub mod caps;
pub mod cgroup;
pub mod egress;
pub mod idmap;
pub mod landlock;
pub mod mountapi;
pub mod namespaces;
pub mod report;
pub mod rlimits;
pub mod root;
pub mod scratch;
pub mod seccomp;

use policy::sandbox::cgroup::{CgroupPlan, Via};
use policy::sandbox::mounts::Source;
use policy::sandbox::{Mechanism, RlimitSpec, SandboxSpec};
use report::{Enforcement, IsolationReport};
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

/// The sandbox cannot be set up as required.
#[derive(Debug, thiserror::Error)]
#[error("required mechanism {mechanism} cannot be enforced: {why}")]
pub struct SandboxError {
    /// The mechanism, as the config's `require` names it.
    pub mechanism: &'static str,
    /// What stands in its way.
    pub why: Obstacle,
}

/// What keeps a required mechanism from being set up.
#[derive(Debug, thiserror::Error)]
pub enum Obstacle {
    /// The host or the runner lacks what it needs.
    #[error("{0}")]
    Host(&'static str),
    /// The run's cgroups could not be made.
    #[error(transparent)]
    Cgroup(#[from] cgroup::CgroupError),
    /// The seccomp filters could not be compiled.
    #[error(transparent)]
    Seccomp(#[from] seccomp::SeccompError),
    /// The idmapped mounts' user namespaces could not be made.
    #[error(transparent)]
    Idmap(#[from] idmap::IdmapError),
}

/// A step of the sandbox failed in the run's init or agent process.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// A resource limit.
    #[error(transparent)]
    Rlimit(#[from] rlimits::RlimitError),
    /// Joining a cgroup.
    #[error(transparent)]
    Cgroup(#[from] cgroup::CgroupError),
    /// Building the root file system.
    #[error("root file system: {0}")]
    Mount(#[from] mountapi::MountError),
    /// Landlock.
    #[error(transparent)]
    Landlock(#[from] landlock::LandlockError),
    /// Capabilities, the user switch, no_new_privs.
    #[error(transparent)]
    Caps(#[from] caps::CapsError),
    /// seccomp.
    #[error(transparent)]
    Seccomp(#[from] seccomp::SeccompError),
    /// The allowlist relay.
    #[error(transparent)]
    Egress(#[from] egress::EgressError),
    /// A sysctl of the run's namespaces.
    #[error("{name}: {source}")]
    Sysctl {
        /// The sysctl.
        name: &'static str,
        /// The error.
        source: std::io::Error,
    },
}

/// Everything decided before the clone.
pub struct Prepared {
    spec: SandboxSpec,
    rlimits: Vec<RlimitSpec>,
    cgroups: cgroup::RunCgroups,
    seccomp: Option<seccomp::Compiled>,
    landlock_abi: i32,
    privileged: bool,
    last_cap: u32,
    namespaces: namespaces::RunNamespaces,
    /// The runner holds its capabilities in the host's user namespace
    /// (not one of its own): host-wide sysctls of the run's namespaces can
    /// be set.
    host_privileged: bool,
    run_as: Option<(u32, u32)>,
    /// The user namespaces of the idmapped mounts, and which target uses
    /// which.
    _userns: Vec<OwnedFd>,
    owners: BTreeMap<PathBuf, RawFd>,
    /// The runner's channel to the daemon's proxy (allowlist mode).
    egress_channel: Option<RawFd>,
    /// The runner's channel to the daemon's model gateway (driver runs).
    gateway_channel: Option<RawFd>,
    /// What will be enforced once the agent has started.
    pub report: IsolationReport,
}

fn required(spec: &SandboxSpec, m: Mechanism) -> bool {
    spec.require.contains(&m)
}

fn via_text(via: &Via) -> String {
    match via {
        Via::V2(b) => format!("cgroup v2 ({})", b.display()),
        Via::V1(b) => format!("cgroup v1 ({})", b.display()),
        Via::Rlimit => "rlimit".to_owned(),
    }
}

/// The user namespaces for the mounts of `spec` reached as their owner by
/// the run's uid `run_as`: one per distinct owner.
fn idmaps(
    spec: &SandboxSpec,
    run_as: Option<(u32, u32)>,
) -> Result<(Vec<OwnedFd>, BTreeMap<PathBuf, RawFd>), idmap::IdmapError> {
    let mut fds: Vec<OwnedFd> = Vec::new();
    let mut by_mapping: BTreeMap<idmap::Mapping, RawFd> = BTreeMap::new();
    let mut owners = BTreeMap::new();
    let Some((uid, gid)) = run_as else {
        return Ok((fds, owners));
    };
    for m in &spec.mounts.mounts {
        let Source::Host { as_owner: true, .. } = m.source else {
            continue;
        };
        let Ok(meta) = std::fs::metadata(&m.target) else {
            continue;
        };
        let mapping = idmap::Mapping {
            owner_uid: std::os::unix::fs::MetadataExt::uid(&meta),
            owner_gid: std::os::unix::fs::MetadataExt::gid(&meta),
            uid,
            gid,
        };
        let fd = match by_mapping.get(&mapping) {
            Some(fd) => *fd,
            None => {
                let ns = idmap::userns(mapping)?;
                let raw = ns.as_raw_fd();
                fds.push(ns);
                by_mapping.insert(mapping, raw);
                raw
            }
        };
        owners.insert(m.target.clone(), fd);
    }
    Ok((fds, owners))
}

fn landlock_report(spec: &SandboxSpec, abi: i32) -> Enforcement {
    if abi <= 0 {
        return Enforcement::off("the kernel has no Landlock");
    }
    let known = landlock::NEWEST_KNOWN_ABI;
    let mut parts = vec![if abi >= known {
        format!("ABI {abi}, fully enforced: every file-system right")
    } else {
        format!(
            "ABI {abi}, fully enforced: every file-system right of ABI {abi} (rights added in ABI {}..={known} are not available on this kernel)",
            abi + 1
        )
    }];
    if !spec.network && abi >= 4 {
        let mut to: Vec<String> = Vec::new();
        to.extend(
            spec.egress
                .iter()
                .map(|e| format!("{} (the proxy)", e.proxy_port)),
        );
        to.extend(
            spec.gateway
                .iter()
                .map(|g| format!("{} (the model gateway)", g.port)),
        );
        parts.push(match to.is_empty() {
            true => "TCP bind and connect denied".into(),
            false => format!("TCP bind denied, connect only to port {}", to.join(" and ")),
        });
    }
    if abi >= 6 {
        parts.push("abstract Unix sockets and signals scoped to the run".into());
    }
    Enforcement::on(parts.join("; "))
}

fn seccomp_report(spec: &SandboxSpec, compiled: Option<&seccomp::Compiled>) -> Enforcement {
    match compiled {
        Some(c) => Enforcement::on(c.describe(&spec.seccomp)),
        None => Enforcement::off("the filter could not be built"),
    }
}

fn network_report(spec: &SandboxSpec, seccomp: bool, landlock_abi: i32) -> Enforcement {
    if spec.network {
        return Enforcement::off("full: the host's network, granted to this run");
    }
    let gateway = spec.gateway.as_ref().map(|g| {
        let host = policy::sandbox::network::GATEWAY_HOST;
        format!(
            "{host}:{} relayed to the daemon's model gateway (audited in gateway.log)",
            g.port
        )
    });
    if let Some(e) = &spec.egress {
        let mut how = vec![format!(
            "allowlist: a network namespace of its own with only loopback up; 127.0.0.1:{} relayed to the daemon's proxy, which lets through {} (audited in egress.log)",
            e.proxy_port,
            e.allow.join(", ")
        )];
        how.extend(gateway);
        if seccomp {
            how.push("seccomp (AF_UNIX, AF_INET and AF_INET6 sockets only)".into());
        }
        if landlock_abi >= 4 {
            how.push(format!(
                "Landlock (TCP connect to port {} only)",
                e.proxy_port
            ));
        }
        return Enforcement::on(how.join("; "));
    }
    if let Some(g) = gateway {
        let mut how = vec![format!(
            "none: a network namespace of its own with only loopback up; {g}"
        )];
        if seccomp {
            how.push("seccomp (AF_UNIX, AF_INET and AF_INET6 sockets only)".into());
        }
        if landlock_abi >= 4 {
            how.push("Landlock (TCP connect to the gateway's port only)".into());
        }
        return Enforcement::on(how.join("; "));
    }
    let mut how = vec!["a network namespace of its own with no interfaces up"];
    if seccomp {
        how.push("seccomp (AF_UNIX sockets only)");
    }
    if landlock_abi >= 4 {
        how.push("Landlock (TCP)");
    }
    Enforcement::on(format!("isolated by {}", how.join(", ")))
}

fn cgroup_report(
    spec: &SandboxSpec,
    plan: &CgroupPlan,
    cgroups: &cgroup::RunCgroups,
    rlimits: &[RlimitSpec],
) -> Enforcement {
    let memory_via = if cgroups.memory.is_some() {
        via_text(&plan.memory)
    } else {
        "rlimit".into()
    };
    let pids_via = if cgroups.pids.is_some() {
        via_text(&plan.pids)
    } else if rlimits.iter().any(|r| r.resource == "nproc") {
        "RLIMIT_NPROC (a uid or user namespace of the run's own)".into()
    } else {
        "not limited (no pids cgroup)".into()
    };
    Enforcement {
        enforced: cgroups.memory.is_some() || cgroups.pids.is_some(),
        detail: format!(
            "memory {} MiB via {memory_via}; pids {} via {pids_via}",
            spec.memory_bytes >> 20,
            spec.pids_max,
        ),
    }
}

fn user_report(run_as: Option<(u32, u32)>) -> String {
    match run_as {
        Some((uid, gid)) => {
            format!("uid {uid}, gid {gid}, no supplementary groups")
        }
        None => {
            let uid = nix::unistd::geteuid().as_raw();
            format!("uid {uid} (the daemon's)")
        }
    }
}

fn root_report(spec: &SandboxSpec, owners: usize) -> Enforcement {
    let masks = spec
        .mounts
        .mounts
        .iter()
        .filter(|m| m.source == Source::Mask)
        .count();
    Enforcement::on(format!(
        "a root file system of its own: {} mounts from the file rules, a new /proc, nothing else of the host; writable places noexec{}{}",
        spec.mounts.mounts.len() - masks,
        if owners > 0 {
            format!("; {owners} reached as their owner (idmapped)")
        } else {
            String::new()
        },
        if masks > 0 {
            format!("; {masks} of the daemon's own places inside them hidden")
        } else {
            String::new()
        }
    ))
}

fn disk_report(spec: &SandboxSpec) -> Enforcement {
    Enforcement::on(format!(
        "temp, artifact and delta dirs on a {} MiB tmpfs of the run's own (noexec); artifacts and delta are copied to the run folder at the end",
        spec.mounts.scratch_bytes >> 20
    ))
}

/// The run's cgroups and rlimits: RLIMIT_AS stands in for a memory
/// cgroup the host cannot give (noted), unless `cgroup` is required.
fn limits(
    spec: &SandboxSpec,
    plan: &CgroupPlan,
    run_id: &str,
    notes: &mut Vec<String>,
) -> Result<(cgroup::RunCgroups, Vec<RlimitSpec>), SandboxError> {
    let cgroups = match cgroup::RunCgroups::create(plan, run_id, spec.memory_bytes, spec.pids_max) {
        Ok(c) => c,
        Err(e) if required(spec, Mechanism::Cgroup) => {
            return Err(SandboxError {
                mechanism: Mechanism::Cgroup.as_str(),
                why: e.into(),
            })
        }
        Err(e) => {
            notes.push(format!(
                "cgroups unavailable ({e}); memory limited by RLIMIT_AS"
            ));
            cgroup::RunCgroups::default()
        }
    };
    let mut rlimits = spec.rlimits.clone();
    if cgroups.pids.is_some() {
        // The pids cgroup holds the limit, and counts what it refuses.
        rlimits.retain(|r| r.resource != "nproc");
    }
    // In a user namespace of the runner's own, the uid's processes there
    // are the run's alone.
    if cgroups.pids.is_none()
        && !namespaces::in_init_user_ns()
        && !rlimits.iter().any(|r| r.resource == "nproc")
    {
        rlimits.push(RlimitSpec {
            resource: "nproc".into(),
            value: spec.pids_max,
            reason: "the process limit, counted in the run's user namespace".into(),
        });
    }
    if cgroups.memory.is_none() {
        rlimits.push(RlimitSpec {
            resource: "as".into(),
            value: spec.memory_bytes,
            reason: "memory limit without a memory cgroup".into(),
        });
    }
    Ok((cgroups, rlimits))
}

fn fail(m: Mechanism, why: Obstacle) -> SandboxError {
    SandboxError {
        mechanism: m.as_str(),
        why,
    }
}

/// Checks what the runner and the kernel must have for the run; returns
/// the kernel's Landlock ABI.
fn check_host(spec: &SandboxSpec, run_as: Option<(u32, u32)>) -> Result<i32, SandboxError> {
    if !caps::effective_has(caps::CAP_SYS_ADMIN) {
        return Err(fail(
            Mechanism::Namespaces,
            Obstacle::Host("the runner holds no CAP_SYS_ADMIN for the run's namespaces"),
        ));
    }
    if run_as.is_some()
        && !(caps::effective_has(caps::CAP_SETUID) && caps::effective_has(caps::CAP_SETGID))
    {
        return Err(fail(
            Mechanism::CapabilityDrop,
            Obstacle::Host("the run's own uid needs CAP_SETUID and CAP_SETGID"),
        ));
    }
    let landlock_abi = landlock::kernel_abi();
    if landlock_abi <= 0 && required(spec, Mechanism::Landlock) {
        return Err(fail(
            Mechanism::Landlock,
            Obstacle::Host("the kernel has no Landlock"),
        ));
    }
    Ok(landlock_abi)
}

/// Probes, compiles and creates what the attempt will apply; fails when a
/// required mechanism is unavailable.
pub fn prepare(
    spec: &SandboxSpec,
    plan: &CgroupPlan,
    run_id: &str,
    run_as: Option<(u32, u32)>,
) -> Result<Prepared, SandboxError> {
    let mut p = prepare_host(spec, plan, run_id, run_as)?;
    p.map_owners()?;
    Ok(p)
}

/// What [`prepare`] does but for the idmapped mounts' user namespaces,
/// which need the mounts' sources to exist ([`Prepared::map_owners`]):
/// the first attempt is made this far before the run folder has its name.
pub fn prepare_host(
    spec: &SandboxSpec,
    plan: &CgroupPlan,
    run_id: &str,
    run_as: Option<(u32, u32)>,
) -> Result<Prepared, SandboxError> {
    let landlock_abi = check_host(spec, run_as)?;
    let seccomp = match seccomp::compile(&spec.seccomp) {
        Ok(c) => Some(c),
        Err(e) if required(spec, Mechanism::Seccomp) => {
            return Err(fail(Mechanism::Seccomp, e.into()))
        }
        Err(_) => None,
    };
    let mut notes = Vec::new();
    let (cgroups, rlimits) = limits(spec, plan, run_id, &mut notes)?;
    let namespaces = namespaces::RunNamespaces { net: !spec.network };
    let host_privileged = namespaces::in_init_user_ns();
    if !host_privileged {
        notes.push("memfds can be made executable (vm.memfd_noexec cannot be set from a user namespace); seccomp refuses memfd_create without the exec right".into());
    }
    let privileged = caps::effective_has(caps::CAP_SETPCAP);
    let report = IsolationReport {
        landlock: landlock_report(spec, landlock_abi),
        seccomp: seccomp_report(spec, seccomp.as_ref()),
        network: network_report(spec, seccomp.is_some(), landlock_abi),
        cgroup: cgroup_report(spec, plan, &cgroups, &rlimits),
        capabilities: if privileged {
            Enforcement::on("effective, permitted, inheritable, ambient and bounding sets empty; securebits locked")
        } else {
            Enforcement::on("effective, permitted, inheritable and ambient sets empty; bounding set kept (no CAP_SETPCAP), no_new_privs stops any gain")
        },
        no_new_privs: true,
        user: user_report(run_as),
        rlimits: rlimits.iter().map(|r| format!("{}={}", r.resource, r.value)).collect(),
        namespaces: Enforcement::on(format!(
            "{}; the run's processes see no other process; its init ends them all when the agent ends",
            namespaces.describe()
        )),
        root: root_report(spec, 0),
        disk: disk_report(spec),
        notes,
    };
    Ok(Prepared {
        spec: spec.clone(),
        rlimits,
        cgroups,
        seccomp,
        landlock_abi,
        privileged,
        last_cap: caps::last_cap(),
        namespaces,
        host_privileged,
        run_as,
        _userns: Vec::new(),
        owners: BTreeMap::new(),
        egress_channel: None,
        gateway_channel: None,
        report,
    })
}

impl Prepared {
    /// Makes the user namespaces through which the run reaches the mounts
    /// bound as their owner (one per owner, read from the sources now).
    pub fn map_owners(&mut self) -> Result<(), SandboxError> {
        let (userns, owners) =
            idmaps(&self.spec, self.run_as).map_err(|e| fail(Mechanism::Namespaces, e.into()))?;
        self.report.root = root_report(&self.spec, owners.len());
        self._userns = userns;
        self.owners = owners;
        Ok(())
    }

    /// Hands the attempt the runner's channel to the daemon's proxy.
    pub fn set_egress_channel(&mut self, fd: Option<RawFd>) {
        self.egress_channel = fd;
    }

    /// Hands the attempt the runner's channel to the daemon's gateway.
    pub fn set_gateway_channel(&mut self, fd: Option<RawFd>) {
        self.gateway_channel = fd;
    }

    /// The namespaces the attempt is cloned into.
    pub fn namespaces(&self) -> namespaces::RunNamespaces {
        self.namespaces
    }

    /// The run's cgroups.
    pub fn cgroups(&self) -> &cgroup::RunCgroups {
        &self.cgroups
    }

    /// The process limit when RLIMIT_NPROC holds it (no pids cgroup).
    pub fn nproc_limit(&self) -> Option<u64> {
        self.rlimits
            .iter()
            .find(|r| r.resource == "nproc")
            .map(|r| r.value)
    }

    /// In the run's init: joins the cgroups (children inherit them),
    /// builds the run's root, and keeps memfds from ever being executed.
    pub fn setup_in_init(&self, scratch: &scratch::Scratch) -> Result<(), ApplyError> {
        self.cgroups.join_self()?;
        if let Some(e) = &self.spec.egress {
            egress::open_relay(e.proxy_port, self.egress_channel)?;
        }
        if let Some(g) = &self.spec.gateway {
            egress::open_gateway(g.port, self.gateway_channel)?;
        }
        root::build(&self.spec.mounts, scratch.root(), &self.owners)?;
        if !self.host_privileged {
            return Ok(());
        }
        // Per PID namespace: no memfd of the run can be made executable.
        std::fs::write("/proc/sys/vm/memfd_noexec", "2").map_err(|source| ApplyError::Sysctl {
            name: "vm.memfd_noexec",
            source,
        })
    }

    /// In the run's init, once the agent is started: init keeps no
    /// privilege (it only reaps and passes a cancel on).
    pub fn drop_init_privileges(&self) -> Result<(), ApplyError> {
        if let Some((uid, gid)) = self.run_as {
            caps::switch_user(uid, gid)?;
        }
        caps::clear_sets()?;
        caps::no_new_privs()?;
        Ok(())
    }

    /// In the agent, between fork and exec, in order; the error names the
    /// step.
    pub fn apply_in_agent(&self) -> Result<(), ApplyError> {
        rlimits::apply(&self.rlimits)?;
        // Landlock's rule paths are opened now, while the process may still
        // reach them; the rules are enforced after the user switch.
        let ruleset = if self.landlock_abi > 0 {
            Some(landlock::build(
                &self.spec.fs,
                landlock::net_rules(&self.spec),
                self.landlock_abi,
            )?)
        } else {
            None
        };
        caps::drop_bounding(self.privileged, self.last_cap)?;
        if let Some((uid, gid)) = self.run_as {
            caps::switch_user(uid, gid)?;
        }
        caps::clear_sets()?;
        caps::no_new_privs()?;
        if let Some(r) = ruleset {
            landlock::enforce(r)?;
        }
        if let Some(s) = &self.seccomp {
            seccomp::install(s)?;
        }
        Ok(())
    }
}
