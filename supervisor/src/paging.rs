//! The pages of `list_agent_runs`: its params checked into one page
//! request (limit, cursor, time range, order), and the opaque cursor.

use crate::ids::RunId;
use crate::protocol::{ListOrder, ListParams, RpcError};

/// The page size when the caller gives none.
pub const DEFAULT_LIMIT: u64 = 100;
/// The largest page a caller may ask for.
pub const MAX_LIMIT: u64 = 1000;

/// A `list_agent_runs` call's page, checked: what to take after the
/// filters by session, state and owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageRequest {
    /// At most this many runs, 1 to [`MAX_LIMIT`].
    pub limit: usize,
    /// Only runs after this one in the list's order (the cursor).
    pub after: Option<RunId>,
    /// Created at or after (ms since the epoch).
    pub since_ms: Option<u64>,
    /// Created at or before (ms since the epoch).
    pub until_ms: Option<u64>,
    /// Newest first.
    pub desc: bool,
}

impl ListParams {
    /// The page these params ask for; -32602 naming the param and its
    /// bound when one is out of range or does not parse.
    pub fn page(&self) -> Result<PageRequest, RpcError> {
        let limit = self.limit.unwrap_or(DEFAULT_LIMIT);
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(RpcError::invalid_params(
                "limit",
                format!("{limit} is out of range: a page holds 1 to {MAX_LIMIT} runs"),
            ));
        }
        let after = match &self.cursor {
            Some(c) => Some(decode_cursor(c).ok_or_else(|| {
                RpcError::invalid_params(
                    "cursor",
                    format!("{c:?} is not a cursor this daemon returned (next_cursor)"),
                )
            })?),
            None => None,
        };
        Ok(PageRequest {
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
            after,
            since_ms: time_param("since", self.since.as_deref())?,
            until_ms: time_param("until", self.until.as_deref())?,
            desc: self.order == ListOrder::Desc,
        })
    }
}

/// A time param (`since`, `until`) in ms since the epoch; -32602 naming
/// `name` when it is not an RFC 3339 time.
pub fn time_param(name: &str, v: Option<&str>) -> Result<Option<u64>, RpcError> {
    match v {
        Some(s) => parse_time(s).map(Some).ok_or_else(|| {
            RpcError::invalid_params(
                name,
                format!("{s:?} is not an RFC 3339 time (e.g. 2026-01-31T12:00:00Z)"),
            )
        }),
        None => Ok(None),
    }
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// The cursor after `id`: its id in unpadded base64url, so clients treat
/// it as opaque.
pub fn encode_cursor(id: &RunId) -> String {
    let mut out = String::new();
    for chunk in id.as_str().as_bytes().chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}

/// The run id in a cursor [`encode_cursor`] made; `None` for anything else.
pub fn decode_cursor(s: &str) -> Option<RunId> {
    let mut bytes = Vec::new();
    for chunk in s.as_bytes().chunks(4) {
        if chunk.len() < 2 {
            return None;
        }
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            let v = ALPHABET.iter().position(|a| a == c)?;
            n |= (v as u32) << (18 - 6 * i);
        }
        for i in 0..chunk.len() - 1 {
            bytes.push((n >> (16 - 8 * i)) as u8);
        }
    }
    let id = RunId::parse(std::str::from_utf8(&bytes).ok()?)?;
    // One text per id: a cursor with stray low bits is not one we made.
    (encode_cursor(&id) == s).then_some(id)
}

/// Ms since the epoch of an RFC 3339 time: `YYYY-MM-DDTHH:MM:SS`, an
/// optional fraction, then `Z` or `±HH:MM`.
pub fn parse_time(s: &str) -> Option<u64> {
    let (base, rest) = (s.get(..19)?, s.get(19..)?);
    let (frac, zone) = match rest.strip_prefix('.') {
        Some(r) => {
            let end = r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
            (r.get(..end)?, r.get(end..)?)
        }
        None => ("", rest),
    };
    if rest.starts_with('.') && frac.is_empty() {
        return None;
    }
    let ms: String = frac.chars().chain("000".chars()).take(3).collect();
    let utc = crate::timefmt::parse_rfc3339_ms(&format!("{}.{ms}Z", base.replace('t', "T")))?;
    let offset_ms = match zone {
        "Z" | "z" => 0i64,
        z => {
            let b = z.as_bytes();
            if b.len() != 6 || b[3] != b':' {
                return None;
            }
            let sign = match b[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let (h, m) = (
                z.get(1..3)?.parse::<i64>().ok()?,
                z.get(4..6)?.parse::<i64>().ok()?,
            );
            if h > 23 || m > 59 {
                return None;
            }
            sign * (h * 3600 + m * 60) * 1000
        }
    };
    u64::try_from(i64::try_from(utc).ok()? - offset_ms).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(v: serde_json::Value) -> ListParams {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_cursor_round_trips_and_nothing_else_decodes() {
        for _ in 0..50 {
            let id = RunId::new();
            let c = encode_cursor(&id);
            assert!(c.bytes().all(|b| ALPHABET.contains(&b)), "{c}");
            assert_eq!(decode_cursor(&c), Some(id));
        }
        let good = encode_cursor(&RunId::new());
        for bad in [
            "",
            "x",
            "!!!!",
            "AAAA",
            &good[1..],
            &format!("{good}A"),
            &good.to_uppercase(),
        ] {
            assert_eq!(decode_cursor(bad), None, "{bad:?}");
        }
        // A raw run id is not a cursor either.
        assert_eq!(decode_cursor(RunId::new().as_str()), None);
    }

    #[test]
    fn the_limit_defaults_to_100_and_is_bounded_by_1000() {
        assert_eq!(params(serde_json::json!({})).page().unwrap().limit, 100);
        assert_eq!(
            params(serde_json::json!({"limit": 1000}))
                .page()
                .unwrap()
                .limit,
            1000
        );
        for bad in [0, 1001, 1_000_000] {
            let e = params(serde_json::json!({"limit": bad}))
                .page()
                .unwrap_err();
            assert_eq!(e.code, crate::protocol::codes::INVALID_PARAMS);
            assert!(
                e.message.contains("limit") && e.message.contains("1000"),
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn times_parse_in_rfc_3339_forms() {
        let t = |s: &str| parse_time(s);
        let base = t("2026-01-31T12:00:00Z").unwrap();
        assert_eq!(t("2026-01-31T12:00:00.000Z"), Some(base));
        assert_eq!(t("2026-01-31T12:00:00.5Z"), Some(base + 500));
        assert_eq!(t("2026-01-31T12:00:00.123456Z"), Some(base + 123));
        assert_eq!(t("2026-01-31T14:00:00+02:00"), Some(base));
        assert_eq!(t("2026-01-31T11:30:00-00:30"), Some(base));
        for bad in [
            "",
            "2026-01-31",
            "2026-01-31T12:00:00",
            "2026-01-31T12:00:00.Z",
            "2026-01-31T12:00:00+2",
        ] {
            assert_eq!(t(bad), None, "{bad:?}");
        }
        let e = params(serde_json::json!({"since": "yesterday"}))
            .page()
            .unwrap_err();
        assert!(e.message.contains("since"), "{}", e.message);
    }

    #[test]
    fn order_and_cursor_reach_the_page() {
        let id = RunId::new();
        let p = params(serde_json::json!({"order": "desc", "cursor": encode_cursor(&id)}));
        let page = p.page().unwrap();
        assert!(page.desc);
        assert_eq!(page.after, Some(id));
        let e = params(serde_json::json!({"cursor": "nope"}))
            .page()
            .unwrap_err();
        assert!(e.message.contains("cursor"), "{}", e.message);
        assert!(serde_json::from_value::<ListParams>(serde_json::json!({"order": "up"})).is_err());
    }
}
