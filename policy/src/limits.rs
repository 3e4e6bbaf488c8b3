//! Resource limits of a run, as requested, with their defaults.

use serde::{Deserialize, Serialize};

/// Default wall-clock limit: one hour.
pub const DEFAULT_WALL_TIME_S: u64 = 3600;
/// Default cap on child.log, in MiB.
pub const DEFAULT_OUTPUT_MB: u64 = 100;

/// The longest wall time accepted: 30 days.
pub const MAX_WALL_TIME_S: u64 = 30 * 24 * 3600;
/// The largest log cap accepted: 1 TiB.
pub const MAX_OUTPUT_MB: u64 = 1024 * 1024;
/// The largest memory limit accepted: 16 TiB.
pub const MAX_MEMORY_MB: u64 = 16 * 1024 * 1024;
/// The largest process limit accepted: the kernel's own ceiling
/// (PID_MAX_LIMIT on 64-bit).
pub const MAX_PIDS: u64 = 4 * 1024 * 1024;

/// Limits as the request gives them; `None` means "the default".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Wall-clock seconds before the run is killed and ends `timed_out`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_time_s: Option<u64>,
    /// Memory limit in MiB (refused until the sandbox can enforce it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    /// Maximum number of processes (refused until the sandbox can enforce it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
    /// Cap on child.log in MiB; past it the log is cut with a marker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_mb: Option<u64>,
}

impl Limits {
    /// The effective wall-clock limit in seconds.
    pub fn wall_time_s(&self) -> u64 {
        self.wall_time_s.unwrap_or(DEFAULT_WALL_TIME_S)
    }

    /// The effective log cap in bytes.
    pub fn output_bytes(&self) -> u64 {
        self.output_mb
            .unwrap_or(DEFAULT_OUTPUT_MB)
            .saturating_mul(1024 * 1024)
    }

    /// Checks every given limit; names the first bad field and why.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        let fields = [
            ("wall_time_s", self.wall_time_s, MAX_WALL_TIME_S),
            ("memory_mb", self.memory_mb, MAX_MEMORY_MB),
            ("pids", self.pids, MAX_PIDS),
            ("output_mb", self.output_mb, MAX_OUTPUT_MB),
        ];
        for (name, value, max) in fields {
            match value {
                Some(0) => return Err((name, "must be positive".to_owned())),
                Some(v) if v > max => return Err((name, format!("must be at most {max}"))),
                _ => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_apply_when_unset() {
        let l = Limits::default();
        assert_eq!(l.wall_time_s(), 3600);
        assert_eq!(l.output_bytes(), 100 * 1024 * 1024);
    }

    #[test]
    fn zero_is_refused_with_the_field_name() {
        let l = Limits {
            pids: Some(0),
            ..Limits::default()
        };
        assert_eq!(l.validate(), Err(("pids", "must be positive".to_owned())));
        let long = Limits {
            wall_time_s: Some(MAX_WALL_TIME_S + 1),
            ..Limits::default()
        };
        assert_eq!(long.validate().unwrap_err().0, "wall_time_s");
        let many = Limits {
            pids: Some(100_000_000),
            ..Limits::default()
        };
        assert_eq!(many.validate().unwrap_err().0, "pids");
        let ok = Limits {
            wall_time_s: Some(1),
            ..Limits::default()
        };
        assert_eq!(ok.validate(), Ok(()));
    }
}
