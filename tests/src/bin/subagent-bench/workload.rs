//! The benchmark's workloads, run as the agent: `--stamp FILE|-` writes the
//! current time (ns) and exits; `--emit BYTES CHUNK [FILE]` writes BYTES in
//! CHUNK-sized writes to stdout or FILE; `--tick N` prints N timestamped
//! lines, 100 ms apart.

use std::io::Write;

/// Nanoseconds since the epoch.
pub fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// Runs a workload when asked to; returns whether it did.
pub fn dispatch() -> bool {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--stamp") => {
            let t = now_ns();
            let target = match args.get(1).map(String::as_str) {
                Some("-") | None => format!(
                    "{}/stamp",
                    std::env::var("SUBAGENT_ARTIFACT_DIR").unwrap_or_default()
                ),
                Some(p) => p.to_owned(),
            };
            std::fs::write(target, t.to_string()).unwrap();
            true
        }
        Some("--emit") => {
            let total: usize = args[1].parse().unwrap();
            let chunk: usize = args[2].parse().unwrap();
            let buf = vec![b'x'; chunk.max(1)];
            let mut out: Box<dyn Write> = match args.get(3) {
                Some(f) => Box::new(std::fs::File::create(f).unwrap()),
                None => Box::new(std::io::stdout().lock()),
            };
            let mut left = total;
            while left > 0 {
                let n = left.min(buf.len());
                let mut piece = buf[..n].to_vec();
                if chunk < 4096 && n > 0 {
                    piece[n - 1] = b'\n';
                }
                out.write_all(&piece).unwrap();
                left -= n;
            }
            out.flush().unwrap();
            true
        }
        Some("--tick") => {
            let n: usize = args[1].parse().unwrap();
            let mut out = std::io::stdout().lock();
            for _ in 0..n {
                writeln!(out, "tick {}", now_ns()).unwrap();
                out.flush().unwrap();
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            true
        }
        _ => false,
    }
}
