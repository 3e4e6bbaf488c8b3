//! The runner spec: everything the runner needs, computed by the daemon.
//! The daemon keeps it in state.db while the run is live and hands it to
//! the runner in a sealed memfd ([`sealed_memfd`]): bytes nobody can
//! change once the runner has them, and no file in the run folder.

use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{Read, Seek, Write};
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

/// Grace between SIGTERM and SIGKILL when a run is cancelled.
pub const DEFAULT_KILL_GRACE_MS: u64 = 5000;

/// The runner's input, handed over by the daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunnerSpec {
    /// The run this runner serves (for messages only).
    pub run_id: String,
    /// The agent program and its arguments; `argv[0]` is looked up in the
    /// child's PATH when it holds no slash.
    pub argv: Vec<String>,
    /// The child's complete environment.
    pub env: BTreeMap<String, String>,
    /// The child's working directory.
    pub cwd: PathBuf,
    /// child.log: the child's stdout and stderr, appended.
    pub log_path: PathBuf,
    /// exit.json: written atomically when the run has ended.
    pub exit_path: PathBuf,
    /// Wall-clock limit in seconds.
    pub wall_time_s: u64,
    /// Cap on what is written to child.log, in bytes.
    pub output_bytes: u64,
    /// Milliseconds between SIGTERM and SIGKILL on cancel.
    #[serde(default = "default_grace")]
    pub kill_grace_ms: u64,
    /// The sandbox the agent runs in.
    pub sandbox: policy::sandbox::SandboxSpec,
    /// Where the run's cgroups go on this host.
    pub cgroup_plan: policy::sandbox::cgroup::CgroupPlan,
    /// Run the agent as this uid and gid (a root runner only).
    #[serde(default)]
    pub run_as: Option<(u32, u32)>,
    /// Restarts after exit 75, with a freshly composed context.
    #[serde(default)]
    pub restart: Option<RestartSpec>,
    /// Copy the temp dir to its place on disk at the end (it lives in the
    /// run's scratch file system).
    #[serde(default)]
    pub keep_temp: bool,
    /// egress.log, which the daemon's proxy writes for a run in allowlist
    /// mode: its size counts toward the run's disk budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_log: Option<PathBuf>,
    /// The file the agent reads on stdin (first_message.md of the run's
    /// context dir, opened anew for each attempt); absent: /dev/null.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<PathBuf>,
    /// A run placed as a cluster job: where the daemon serves its egress
    /// proxy and model gateway over TCP, and the run's token there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_services: Option<RemoteServices>,
}

/// The daemon's job services port, as a job's runner reaches it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteServices {
    /// `IP:PORT` of the daemon's port.
    pub addr: String,
    /// The run's token (hex), shown with each connection.
    pub token: String,
}

/// How to restart a child that exits 75.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestartSpec {
    /// Attempts allowed in all (1 + max_restarts).
    pub max_attempts: u32,
    /// The composition's recorded inputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compose: Option<policy::compose::ComposeInput>,
    /// A compose.json holding them instead; read only when `compose` is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compose_input: Option<PathBuf>,
    /// The context dir the composed files go to.
    pub context_dir: PathBuf,
    /// Where the child leaves handoff.md.
    pub artifact_dir: PathBuf,
    /// attempt.json: the attempt in progress, for the status.
    pub attempt_file: PathBuf,
    /// The group the composed files are shared with (run_as).
    #[serde(default)]
    pub share_gid: Option<u32>,
}

fn default_grace() -> u64 {
    DEFAULT_KILL_GRACE_MS
}

/// The runner spec could not be handed over or used.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// It could not be read from its descriptor.
    #[error("read the runner spec from fd {fd}: {source}")]
    Read {
        /// The descriptor the daemon handed over.
        fd: RawFd,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Its descriptor is not sealed against changes (a regular file, or a
    /// memfd someone could still write).
    #[error("the runner spec's fd {fd} is not a memfd sealed against writes: {why}")]
    NotSealed {
        /// The descriptor the daemon handed over.
        fd: RawFd,
        /// What is missing.
        why: String,
    },
    /// The daemon could not make the sealed memfd.
    #[error("{op} for the runner spec: {source}")]
    Memfd {
        /// The step that failed.
        op: &'static str,
        /// The underlying error.
        source: std::io::Error,
    },
    /// It is not a valid spec.
    #[error("parse the runner spec: {0}")]
    Parse(#[from] serde_json::Error),
    /// It names no program.
    #[error("the runner spec: argv is empty")]
    EmptyArgv,
}

/// The largest runner spec read (the daemon writes a few tens of KiB).
const MAX_SPEC_BYTES: u64 = 16 << 20;

/// The seals a spec's descriptor must carry: its bytes cannot change.
const SPEC_SEALS: SealFlag = SealFlag::F_SEAL_WRITE
    .union(SealFlag::F_SEAL_GROW)
    .union(SealFlag::F_SEAL_SHRINK);

/// A memfd named `name` holding `bytes`, sealed for good against writes,
/// growing, shrinking and further seals, at offset 0 and close-on-exec:
/// what the daemon hands a runner as its spec.
pub fn sealed_memfd(name: &str, bytes: &[u8]) -> Result<OwnedFd, SpecError> {
    let fail = |op| move |source| SpecError::Memfd { op, source };
    let errno = |op| {
        move |e: nix::Error| SpecError::Memfd {
            op,
            source: e.into(),
        }
    };
    let flags = MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING;
    let mut file = std::fs::File::from(memfd_create(name, flags).map_err(errno("memfd_create"))?);
    file.write_all(bytes).map_err(fail("write"))?;
    fcntl(
        file.as_fd(),
        FcntlArg::F_ADD_SEALS(SPEC_SEALS | SealFlag::F_SEAL_SEAL),
    )
    .map_err(errno("fcntl(F_ADD_SEALS)"))?;
    file.rewind().map_err(fail("lseek"))?;
    Ok(file.into())
}

/// Checks that `fd` (number `n` in messages) is sealed against every
/// change of its bytes.
fn check_sealed(fd: BorrowedFd<'_>, n: RawFd) -> Result<(), SpecError> {
    let not_sealed = |why: String| SpecError::NotSealed { fd: n, why };
    let bits = fcntl(fd, FcntlArg::F_GET_SEALS)
        .map_err(|e| not_sealed(format!("F_GET_SEALS: {e} (a regular file is not accepted)")))?;
    let missing = SPEC_SEALS.difference(SealFlag::from_bits_truncate(bits));
    match missing.is_empty() {
        true => Ok(()),
        false => Err(not_sealed(format!("missing seals {missing:?}"))),
    }
}

impl RunnerSpec {
    /// Reads and checks the spec from `fd`, a sealed memfd the daemon
    /// handed over (anything else is refused); takes ownership of `fd`
    /// and closes it.
    pub fn read_fd(fd: RawFd) -> Result<Self, SpecError> {
        // SAFETY: the daemon handed this descriptor to this process alone;
        // nothing else in the runner owns it.
        let file = unsafe { std::fs::File::from_raw_fd(fd) };
        check_sealed(file.as_fd(), fd)?;
        let mut bytes = Vec::new();
        file.take(MAX_SPEC_BYTES)
            .read_to_end(&mut bytes)
            .map_err(|source| SpecError::Read { fd, source })?;
        Self::parse(&bytes)
    }

    /// Parses and checks the spec's bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self, SpecError> {
        let spec: RunnerSpec = serde_json::from_slice(bytes)?;
        if spec.argv.is_empty() {
            return Err(SpecError::EmptyArgv);
        }
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, IntoRawFd};

    fn check(fd: &OwnedFd) -> Result<(), SpecError> {
        check_sealed(fd.as_fd(), fd.as_raw_fd())
    }

    #[test]
    fn a_sealed_memfd_passes_and_reads_from_its_start() {
        let fd = sealed_memfd("spec-test", b"{\"not\": \"a spec\"}").unwrap();
        check(&fd).unwrap();
        let bits = fcntl(fd.as_fd(), FcntlArg::F_GET_SEALS).unwrap();
        assert!(SealFlag::from_bits_truncate(bits).contains(SPEC_SEALS | SealFlag::F_SEAL_SEAL));
        let mut f = std::fs::File::from(fd.try_clone().unwrap());
        assert!(f.write_all(b"x").is_err(), "a sealed memfd took a write");
        assert!(f.set_len(0).is_err(), "a sealed memfd was shrunk");
        // Past the seal check, the bytes are parsed (and these are no spec).
        match RunnerSpec::read_fd(fd.into_raw_fd()) {
            Err(SpecError::Parse(_)) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_unsealed_memfd_or_a_plain_file_is_refused() {
        let refused = |fd: OwnedFd| match RunnerSpec::read_fd(fd.into_raw_fd()) {
            Err(e @ SpecError::NotSealed { .. }) => e.to_string(),
            other => panic!("{other:?}"),
        };
        let open = memfd_create("spec-test", MFdFlags::MFD_ALLOW_SEALING).unwrap();
        assert!(refused(open).contains("missing seals"));
        // Without MFD_ALLOW_SEALING a memfd carries only F_SEAL_SEAL.
        let plain = memfd_create("spec-test", MFdFlags::empty()).unwrap();
        assert!(refused(plain).contains("missing seals"));
        let part = memfd_create("spec-test", MFdFlags::MFD_ALLOW_SEALING).unwrap();
        fcntl(part.as_fd(), FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_WRITE)).unwrap();
        assert!(check(&part).is_err(), "a memfd that may still grow passed");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("spec.json"), b"{}").unwrap();
        let file = std::fs::File::open(dir.path().join("spec.json")).unwrap();
        assert!(refused(file.into()).contains("regular file is not accepted"));
    }
}
