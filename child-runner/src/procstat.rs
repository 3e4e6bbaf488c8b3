//! A process as `/proc/<pid>/stat` shows it: the daemon tells a live
//! runner from a reused pid by its start time, and walks a socket peer's
//! ancestors.

/// One process as `/proc/<pid>/stat` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// Its pid.
    pub pid: i32,
    /// Its state letter (R, S, Z, ...).
    pub state: char,
    /// Its parent's pid.
    pub ppid: i32,
    /// Its start time in clock ticks since boot (field 22).
    pub start_ticks: u64,
}

/// Parses the text of `/proc/<pid>/stat`. The command name may hold spaces
/// and parentheses, so fields are counted after the last ')'.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let pid = text[..open].trim().parse().ok()?;
    let mut rest = text.get(close + 1..)?.split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    // Fields 5..=21 come next; start time is field 22, the 20th after ')'.
    let start_ticks = rest.nth(17)?.parse().ok()?;
    Some(ProcStat {
        pid,
        state,
        ppid,
        start_ticks,
    })
}

/// Reads `/proc/<pid>/stat`; `None` when the process is gone.
pub fn read_stat(pid: i32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_awkward_command_names() {
        let line = "1234 (a) b (c)) S 1 1234 1234 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 987654 1000 10 0";
        let st = parse_stat(line).unwrap();
        assert_eq!(st.pid, 1234);
        assert_eq!(st.state, 'S');
        assert_eq!(st.ppid, 1);
        assert_eq!(st.start_ticks, 987654);
    }

    #[test]
    fn own_stat_is_readable() {
        let me = std::process::id() as i32;
        let st = read_stat(me).unwrap();
        assert_eq!(st.pid, me);
        assert!(st.start_ticks > 0);
    }
}
