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
        let lim = libc::rlimit {
            rlim_cur: l.value,
            rlim_max: l.value,
        };
        // SAFETY: setrlimit reads one rlimit struct we own.
        if unsafe { libc::setrlimit(res, &lim) } != 0 {
            return Err(err(std::io::Error::last_os_error()));
        }
    }
    Ok(())
}
