//! Timestamps: RFC 3339 UTC text from Unix time, without a date library.

use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch.
pub fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    now_micros() / 1000
}

/// Splits Unix seconds into ((year, month, day), (hour, minute, second)), UTC.
pub fn civil(secs: u64) -> ((i64, u32, u32), (u32, u32, u32)) {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's days-to-civil algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        (year, month, day),
        (
            (rem / 3600) as u32,
            (rem % 3600 / 60) as u32,
            (rem % 60) as u32,
        ),
    )
}

/// RFC 3339 UTC with milliseconds, e.g. `2026-11-30T05:55:52.123Z`.
pub fn rfc3339_ms(ms: u64) -> String {
    let ((y, mo, d), (h, mi, s)) = civil(ms / 1000);
    format!(
        "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{:03}Z",
        ms % 1000
    )
}

/// Parses the RFC 3339 form [`rfc3339_ms`] writes back to ms since the epoch.
pub fn parse_rfc3339_ms(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.len() != 24 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[23] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec, ms) = (num(11..13)?, num(14..16)?, num(17..19)?, num(20..23)?);
    // Howard Hinnant's days-from-civil algorithm.
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let total = ((days * 86_400 + h * 3600 + mi * 60 + sec) * 1000) + ms;
    u64::try_from(total).ok()
}

/// A short human duration: `850ms`, `12.3s`, `4m05s`, `2h03m`.
pub fn human_duration(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else if ms < 3_600_000 {
        format!("{}m{:02}s", ms / 60_000, ms % 60_000 / 1000)
    } else {
        format!("{}h{:02}m", ms / 3_600_000, ms % 3_600_000 / 60_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339_ms(1_796_018_409_474), "2026-11-30T06:00:09.474Z");
        assert_eq!(rfc3339_ms(4_102_444_799_999), "2099-12-31T23:59:59.999Z");
    }

    #[test]
    fn parses_what_it_formats() {
        for ms in [0, 951_782_400_000, 1_796_018_409_474, 4_102_444_799_999] {
            assert_eq!(parse_rfc3339_ms(&rfc3339_ms(ms)), Some(ms));
        }
        assert_eq!(parse_rfc3339_ms("2026-11-30 06:00:09Z"), None);
    }

    #[test]
    fn durations() {
        assert_eq!(human_duration(850), "850ms");
        assert_eq!(human_duration(12_345), "12.3s");
        assert_eq!(human_duration(245_000), "4m05s");
        assert_eq!(human_duration(7_380_000), "2h03m");
    }
}
