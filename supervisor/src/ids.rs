//! Run ids and session ids: the only caller-supplied strings that become
//! path components, so both are checked against a strict grammar first.

use std::fmt;
use std::sync::Mutex;

/// A run id: `YYYYMMDDTHHMMSS.ffffffZ-xxxxxxxx` (UTC creation time to the
/// microsecond, then 8 random hex digits). Unique, sorts by creation time
/// and is safe as a path component.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RunId(String);

/// The last timestamp handed out, so ids from one process strictly increase.
static LAST_MICROS: Mutex<u64> = Mutex::new(0);

/// Length of a run id.
pub const RUN_ID_LEN: usize = 32;

impl RunId {
    /// A fresh id for a run created now.
    pub fn new() -> RunId {
        let now = crate::timefmt::now_micros();
        let micros = match LAST_MICROS.lock() {
            Ok(mut last) => {
                let m = now.max(*last + 1);
                *last = m;
                m
            }
            Err(_) => now,
        };
        let (date, time) = crate::timefmt::civil(micros / 1_000_000);
        RunId(format!(
            "{:04}{:02}{:02}T{:02}{:02}{:02}.{:06}Z-{}",
            date.0,
            date.1,
            date.2,
            time.0,
            time.1,
            time.2,
            micros % 1_000_000,
            random_hex8()
        ))
    }

    /// Accepts `s` only when it has exactly the form `new` produces.
    pub fn parse(s: &str) -> Option<RunId> {
        let b = s.as_bytes();
        if b.len() != RUN_ID_LEN {
            return None;
        }
        let digit = |i: usize| b[i].is_ascii_digit();
        let hex = |i: usize| matches!(b[i], b'0'..=b'9' | b'a'..=b'f');
        let ok = (0..8).all(digit)
            && b[8] == b'T'
            && (9..15).all(digit)
            && b[15] == b'.'
            && (16..22).all(digit)
            && b[22] == b'Z'
            && b[23] == b'-'
            && (24..32).all(hex);
        ok.then(|| RunId(s.to_owned()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The time it was made, in ms since the epoch: the run's `created_at`,
    /// so that a time range of runs is a range of their ids.
    pub fn created_ms(&self) -> u64 {
        let s = &self.0;
        let text = format!(
            "{}-{}-{}T{}:{}:{}.{}Z",
            &s[0..4],
            &s[4..6],
            &s[6..8],
            &s[9..11],
            &s[11..13],
            &s[13..15],
            &s[16..19]
        );
        // Every id `parse` or `new` made has this form; 0 only for a date
        // the calendar has not (a 30 February).
        crate::timefmt::parse_rfc3339_ms(&text).unwrap_or(0)
    }

    /// The time it was made, in µs since the epoch (its full precision).
    pub fn created_us(&self) -> u64 {
        let sub_ms: u64 = self.0[19..22].parse().unwrap_or(0);
        self.created_ms() * 1000 + sub_ms
    }
}

impl Default for RunId {
    fn default() -> Self {
        RunId::new()
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl serde::Serialize for RunId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

/// Accepts only a well-formed id: a record naming another fails to load.
impl<'de> serde::Deserialize<'de> for RunId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<RunId, D::Error> {
        let s = String::deserialize(d)?;
        RunId::parse(&s).ok_or_else(|| serde::de::Error::custom(format!("malformed run id {s:?}")))
    }
}

/// Eight random lowercase hex digits, from the kernel's CSPRNG.
pub fn random_hex8() -> String {
    let mut buf = [0u8; 4];
    fill_random(&mut buf);
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

fn fill_random(buf: &mut [u8]) {
    // SAFETY: getrandom writes at most buf.len() bytes into buf, which is a
    // valid, exclusively borrowed buffer of that length.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n != buf.len() as isize {
        // getrandom with a small buffer only fails before the pool is
        // initialised; fall back to the clock so ids stay distinct.
        let t = crate::timefmt::now_micros().to_le_bytes();
        for (i, b) in buf.iter_mut().enumerate() {
            *b = t[i % t.len()] ^ (std::process::id() as u8);
        }
    }
}

/// Why a session id was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SessionIdError {
    /// Empty or too long.
    #[error("must be 1 to 64 characters")]
    Length,
    /// A character outside the allowed set.
    #[error("may only hold the characters A-Z a-z 0-9 . _ -")]
    Characters,
    /// A name the file system gives a meaning.
    #[error("must not be \".\" or \"..\"")]
    Dots,
}

/// A session id, checked by [`check_session_id`]: safe as a folder name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionId(String);

impl SessionId {
    /// Accepts `s` only when it is a valid session id.
    pub fn parse(s: &str) -> Result<SessionId, SessionIdError> {
        check_session_id(s)?;
        Ok(SessionId(s.to_owned()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl serde::Serialize for SessionId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

/// Accepts only a valid id: a record naming another fails to load.
impl<'de> serde::Deserialize<'de> for SessionId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<SessionId, D::Error> {
        let s = String::deserialize(d)?;
        SessionId::parse(&s)
            .map_err(|e| serde::de::Error::custom(format!("malformed session id {s:?}: {e}")))
    }
}

/// Checks a session id (it names a folder of the state dir).
pub fn check_session_id(s: &str) -> Result<(), SessionIdError> {
    if s.is_empty() || s.len() > 64 {
        return Err(SessionIdError::Length);
    }
    if !s
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
    {
        return Err(SessionIdError::Characters);
    }
    if s == "." || s == ".." {
        return Err(SessionIdError::Dots);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_tells_when_it_was_made() {
        let before = crate::timefmt::now_ms();
        let id = RunId::new();
        let at = id.created_ms();
        assert!(before <= at && at <= crate::timefmt::now_ms(), "{id} {at}");
        let id = RunId::parse("20261202T072331.184991Z-838f4851").unwrap();
        let want = crate::timefmt::parse_rfc3339_ms("2026-12-02T07:23:31.184Z").unwrap();
        assert_eq!(id.created_ms(), want);
        assert_eq!(id.created_us(), want * 1000 + 991);
    }

    #[test]
    fn new_ids_parse_and_sort_by_creation() {
        let ids: Vec<RunId> = (0..100).map(|_| RunId::new()).collect();
        for id in &ids {
            assert_eq!(RunId::parse(id.as_str()).as_ref(), Some(id), "{id}");
        }
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(sorted, ids);
        let mut dedup = ids.clone();
        dedup.dedup();
        assert_eq!(dedup.len(), ids.len());
    }

    #[test]
    fn traversal_and_malformed_ids_are_refused() {
        for bad in [
            "../../etc",
            "",
            "20261130T055552.123456Z-a1b2c3d",
            "20261130T055552.123456Z-a1b2c3dG",
            "20261130T055552.123456Z/a1b2c3d4",
            "20261130T05555..123456Z-a1b2c3d4",
            "x0261130T055552.123456Z-a1b2c3d4",
        ] {
            assert!(RunId::parse(bad).is_none(), "{bad}");
        }
        assert!(RunId::parse("20261130T055552.123456Z-a1b2c3d4").is_some());
    }

    #[test]
    fn a_session_id_deserializes_only_when_valid() {
        let ok: SessionId = serde_json::from_str("\"parent-1\"").unwrap();
        assert_eq!(ok.as_str(), "parent-1");
        assert_eq!(serde_json::to_string(&ok).unwrap(), "\"parent-1\"");
        for bad in ["\"../etc\"", "\"\"", "\"..\""] {
            let err = serde_json::from_str::<SessionId>(bad)
                .unwrap_err()
                .to_string();
            assert!(err.contains("malformed session id"), "{bad}: {err}");
        }
    }

    #[test]
    fn session_ids() {
        assert!(check_session_id("parent-1.a_b").is_ok());
        assert!(check_session_id(&"a".repeat(64)).is_ok());
        for bad in ["", ".", "..", "a/b", "a b", "é", &"a".repeat(65)] {
            assert!(check_session_id(bad).is_err(), "{bad}");
        }
        assert_eq!(check_session_id(""), Err(SessionIdError::Length));
        assert_eq!(check_session_id("a/b"), Err(SessionIdError::Characters));
        assert_eq!(
            check_session_id("..").unwrap_err().to_string(),
            "must not be \".\" or \"..\""
        );
    }
}
