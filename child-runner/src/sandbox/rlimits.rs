//! setrlimit for the spec's limits.

use policy::sandbox::RlimitSpec;

/// A limit could not be set.
#[derive(Debug, thiserror::Error)]
#[error("rlimit {resource}: {source}")]
pub struct RlimitError {
    /// The resource.
    pub resource: String,
    /// The errno, or a note for an unknown resource.
    pub source: std::io::Error,
}

fn resource(name: &str) -> Option<libc::__rlimit_resource_t> {
    Some(match name {
        "core" => libc::RLIMIT_CORE,
        "fsize" => libc::RLIMIT_FSIZE,
        "nofile" => libc::RLIMIT_NOFILE,
        "as" => libc::RLIMIT_AS,
        "nproc" => libc::RLIMIT_NPROC,
        _ => return None,
    })
}

/// Applies every limit (soft = hard = value).
pub fn apply(limits: &[RlimitSpec]) -> Result<(), RlimitError> {
    for l in limits {
        let err = |source| RlimitError {
            resource: l.resource.clone(),
            source,
        };
        let res = resource(&l.resource)
            .ok_or_else(|| err(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
        let mut value = l.value;
        let mut now = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one rlimit struct we own.
        if unsafe { libc::getrlimit(res, &mut now) } == 0
            && now.rlim_max < value
            && !super::caps::effective_has(super::caps::CAP_SYS_RESOURCE)
        {
            // A limit above the hard one cannot be raised without
            // CAP_SYS_RESOURCE; the hard one is tighter, so it holds.
            value = now.rlim_max;
        }
        let lim = libc::rlimit {
            rlim_cur: value,
            rlim_max: value,
        };
        // SAFETY: setrlimit reads one rlimit struct we own.
        if unsafe { libc::setrlimit(res, &lim) } != 0 {
            return Err(err(std::io::Error::last_os_error()));
        }
    }
    Ok(())
}
