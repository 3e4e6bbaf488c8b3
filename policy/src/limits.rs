//! Resource limits of a run, as requested, with their defaults.

use serde::{Deserialize, Serialize};

/// Default wall-clock limit: one hour.
pub const DEFAULT_WALL_TIME_S: u64 = 3600;
/// Default cap on child.log, in MiB.
pub const DEFAULT_OUTPUT_MB: u64 = 100;
/// Default size of the run's scratch file system (temp, artifacts,
/// delta), in MiB.
pub const DEFAULT_DISK_MB: u64 = 1024;

/// The longest wall time accepted: 30 days.
pub const MAX_WALL_TIME_S: u64 = 30 * 24 * 3600;
/// The largest log cap accepted: 1 TiB.
pub const MAX_OUTPUT_MB: u64 = 1024 * 1024;
/// The largest memory limit accepted: 16 TiB.
pub const MAX_MEMORY_MB: u64 = 16 * 1024 * 1024;
/// The largest scratch file system accepted: 1 TiB (it lives in memory,
/// charged to the run's memory limit).
pub const MAX_DISK_MB: u64 = 1024 * 1024;
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
    /// Size of the run's scratch file system in MiB: everything it writes
    /// to its temp, artifact and delta dirs together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_mb: Option<u64>,
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

    /// The effective scratch size in bytes.
    pub fn disk_bytes(&self) -> u64 {
        self.disk_mb
            .unwrap_or(DEFAULT_DISK_MB)
            .saturating_mul(1024 * 1024)
    }

    /// These limits (the ones that apply: the audience's, else the built-in
    /// defaults) lowered where `other` asks for less. A subagent definition
    /// can lie in a project a child may write, so it may narrow a limit,
    /// never lift one.
    pub fn lowered_by(&self, other: &Limits) -> Limits {
        let low = |mine: Option<u64>, default: u64, theirs: Option<u64>| match theirs {
            Some(t) => Some(t.min(mine.unwrap_or(default))),
            None => mine,
        };
        Limits {
            wall_time_s: low(self.wall_time_s, DEFAULT_WALL_TIME_S, other.wall_time_s),
            memory_mb: low(
                self.memory_mb,
                crate::sandbox::DEFAULT_MEMORY_MB,
                other.memory_mb,
            ),
            pids: low(self.pids, crate::sandbox::DEFAULT_PIDS, other.pids),
            output_mb: low(self.output_mb, DEFAULT_OUTPUT_MB, other.output_mb),
            disk_mb: low(self.disk_mb, DEFAULT_DISK_MB, other.disk_mb),
        }
    }

    /// Checks every given limit; names the first bad field and why.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        let fields = [
            ("wall_time_s", self.wall_time_s, MAX_WALL_TIME_S),
            ("memory_mb", self.memory_mb, MAX_MEMORY_MB),
            ("pids", self.pids, MAX_PIDS),
            ("output_mb", self.output_mb, MAX_OUTPUT_MB),
            ("disk_mb", self.disk_mb, MAX_DISK_MB),
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
        assert_eq!(l.disk_bytes(), 1024 * 1024 * 1024);
    }

    #[test]
    fn a_definition_can_lower_a_limit_never_lift_it() {
        let audience = Limits {
            memory_mb: Some(1024),
            ..Limits::default()
        };
        let def = Limits {
            memory_mb: Some(16 * 1024 * 1024),
            pids: Some(4 * 1024 * 1024),
            wall_time_s: Some(60),
            ..Limits::default()
        };
        let got = audience.lowered_by(&def);
        assert_eq!(got.memory_mb, Some(1024), "the audience's");
        assert_eq!(
            got.pids,
            Some(crate::sandbox::DEFAULT_PIDS),
            "the built-in default"
        );
        assert_eq!(got.wall_time_s, Some(60), "lowered");
        assert_eq!(got.output_mb, None, "untouched");
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
