//! An I/O error that says what was being done and to which path, for every
//! module's own error type to wrap or convert (`From<IoAt>`), so the
//! message reads `<op> <path>: <error>` everywhere. Uses only std.

use std::io;
use std::path::{Path, PathBuf};

/// An I/O step that failed on a path.
#[derive(Debug, thiserror::Error)]
#[error("{op} {}: {source}", path.display())]
pub struct IoAt {
    /// The step, e.g. "create" or "rename into place".
    pub op: &'static str,
    /// The path it was done to.
    pub path: PathBuf,
    /// The underlying error.
    pub source: io::Error,
}

/// The `map_err` of a step `op` on `path`: `.map_err(at("create", p))?`
/// converts into the caller's error through its `From<IoAt>`.
pub fn at<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> IoAt + 'a {
    move |source| IoAt {
        op,
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_step_and_the_path() {
        let e = at("create", Path::new("/s/x"))(io::Error::from_raw_os_error(13));
        assert_eq!(
            e.to_string(),
            "create /s/x: Permission denied (os error 13)"
        );
        assert!(std::error::Error::source(&e).is_some());
    }
}
