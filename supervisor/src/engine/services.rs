//! The daemon's job services port (`[backend] services_listen`): where the
//! runner of a Slurm job, on another host, reaches its run's egress proxy
//! and model gateway (`subagent_runner::jobbridge` relays the run's
//! connections here). Each connection starts with `SUBAGENT/1 <service>
//! <run id> <token>`, read within a deadline and a bound; the token is
//! HMAC-SHA256 of the run id under a key of the daemon's
//! (`<state dir>/services.key`, 0600), so it opens one run's services
//! only, and only while they are registered here (from its job's
//! submission to the run's end). Any other connection is closed unanswered;
//! an accepted one is handed to the run's proxy or gateway as a connection
//! of the run's own.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use subagent_runner::jobbridge::{Service, HANDSHAKE};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// The key's size.
const KEY_BYTES: usize = 32;
/// The longest handshake line read.
const MAX_HANDSHAKE: usize = 256;
/// How long a connection may take to send its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections at once that have not finished their handshake.
const MAX_PENDING: usize = 256;
/// Connections waiting for one run's service.
const QUEUE: usize = 64;

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// The port could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ServicesError {
    /// The key file could not be read or made.
    #[error("{path}: {why}")]
    Key {
        /// The key file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The address could not be bound.
    #[error("job services port {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
}

/// The port's key and the services registered there.
pub(crate) struct Services {
    key: [u8; KEY_BYTES],
    /// The address jobs are told to reach.
    pub(super) addr: SocketAddr,
    runs: Mutex<HashMap<(String, &'static str), mpsc::Sender<TcpStream>>>,
}

/// Reads the key at `path`, or makes one there (0600) when there is none.
fn key(path: &Path) -> Result<[u8; KEY_BYTES], ServicesError> {
    let bad = |why: String| ServicesError::Key {
        path: path.to_path_buf(),
        why,
    };
    match subagent_runner::safefile::read(path, KEY_BYTES as u64) {
        Ok(bytes) => {
            use std::os::unix::fs::MetadataExt;
            let mode = std::fs::symlink_metadata(path).map_or(0, |m| m.mode());
            if mode & 0o077 != 0 {
                return Err(bad(format!(
                    "mode {:o}: others may read the key",
                    mode & 0o7777
                )));
            }
            bytes
                .try_into()
                .map_err(|_| bad("not a key of 32 bytes".into()))
        }
        Err(e) if e.is_missing() => {
            let k = random_key().map_err(|e| bad(format!("getrandom: {e}")))?;
            subagent_runner::atomic::write_atomic(path, &k).map_err(|e| bad(e.to_string()))?;
            Ok(k)
        }
        Err(e) => Err(bad(e.to_string())),
    }
}

/// A key from the kernel's CSPRNG (never a fallback).
fn random_key() -> std::io::Result<[u8; KEY_BYTES]> {
    let mut k = [0u8; KEY_BYTES];
    // SAFETY: getrandom writes at most k.len() bytes into k, a valid,
    // exclusively borrowed buffer of that length.
    let n = unsafe { libc::getrandom(k.as_mut_ptr().cast(), k.len(), 0) };
    if n != k.len() as isize {
        return Err(std::io::Error::last_os_error());
    }
    Ok(k)
}

impl Services {
    /// Opens the port at `listen` with the key in `state_dir`.
    pub(crate) fn open(
        listen: SocketAddr,
        state_dir: &Path,
    ) -> Result<(Services, std::net::TcpListener), ServicesError> {
        let key = key(&state_dir.join("services.key"))?;
        let bind = |source| ServicesError::Bind {
            addr: listen,
            source,
        };
        let l = std::net::TcpListener::bind(listen).map_err(bind)?;
        l.set_nonblocking(true).map_err(bind)?;
        let addr = l.local_addr().map_err(bind)?;
        let s = Services {
            key,
            addr,
            runs: Mutex::new(HashMap::new()),
        };
        Ok((s, l))
    }

    fn mac(&self) -> HmacSha256 {
        use hmac::KeyInit;
        // HMAC takes a key of any length.
        <HmacSha256 as KeyInit>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"))
    }

    /// Run `run`'s token (hex).
    pub(crate) fn token(&self, run: &str) -> String {
        use hmac::Mac;
        let mut m = self.mac();
        m.update(run.as_bytes());
        m.finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Whether `token` (hex) is run `run`'s, compared in constant time.
    fn verify(&self, run: &str, token: &str) -> bool {
        use hmac::Mac;
        let Some(bytes) = unhex(token) else {
            return false;
        };
        let mut m = self.mac();
        m.update(run.as_bytes());
        m.verify_slice(&bytes).is_ok()
    }

    fn table(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<(String, &'static str), mpsc::Sender<TcpStream>>> {
        self.runs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers run `run`'s `service`: its connections come on the receiver.
    pub(crate) fn register(&self, run: &str, service: Service) -> mpsc::Receiver<TcpStream> {
        let (tx, rx) = mpsc::channel(QUEUE);
        self.table().insert((run.to_owned(), service.name()), tx);
        rx
    }

    /// Forgets run `run`'s services: its token opens nothing from now on.
    pub(crate) fn forget(&self, run: &str) {
        self.table().retain(|(r, _), _| r != run);
    }

    /// The sender of run `run`'s `service`, if it is registered.
    fn sender(&self, run: &str, service: &'static str) -> Option<mpsc::Sender<TcpStream>> {
        self.table().get(&(run.to_owned(), service)).cloned()
    }
}

/// `s` as bytes, two hex digits each.
fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Serves the port until the table is dropped.
pub(crate) async fn serve(listener: tokio::net::TcpListener, services: Weak<Services>) {
    let pending = Arc::new(tokio::sync::Semaphore::new(MAX_PENDING));
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let Some(s) = services.upgrade() else { return };
        // Past the cap, a connection is closed unread.
        let Ok(slot) = pending.clone().try_acquire_owned() else {
            continue;
        };
        tokio::spawn(async move {
            let admitted = tokio::time::timeout(HANDSHAKE_TIMEOUT, admit(stream, &s)).await;
            drop(slot);
            if !matches!(admitted, Ok(true)) {
                tracing::warn!(%peer, "job services: a connection without a valid handshake was closed");
            }
        });
    }
}

/// Reads a connection's handshake and hands it to its run's service;
/// whether it was.
async fn admit(mut stream: TcpStream, s: &Services) -> bool {
    let mut line = Vec::with_capacity(128);
    let mut byte = [0u8; 1];
    // One byte at a time: what follows the line is the run's.
    while line.len() < MAX_HANDSHAKE {
        match stream.read(&mut byte).await {
            Ok(1) if byte[0] == b'\n' => break,
            Ok(1) => line.push(byte[0]),
            _ => return false,
        }
    }
    let Ok(text) = std::str::from_utf8(&line) else {
        return false;
    };
    let words: Vec<&str> = text.split(' ').collect();
    let [HANDSHAKE, service, run, token] = words.as_slice() else {
        return false;
    };
    let Some(service) = Service::parse(service) else {
        return false;
    };
    if !s.verify(run, token) {
        return false;
    }
    match s.sender(run, service.name()) {
        Some(tx) => tx.try_send(stream).is_ok(),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[test]
    fn a_token_is_one_runs_and_the_key_stays_private() {
        let dir = tempfile::tempdir().unwrap();
        let (s, _l) = Services::open("127.0.0.1:0".parse().unwrap(), dir.path()).unwrap();
        let t = s.token("run-a");
        assert_eq!(t.len(), 64);
        assert!(s.verify("run-a", &t));
        assert!(!s.verify("run-b", &t));
        assert!(!s.verify("run-a", &t[..62]));
        assert!(!s.verify("run-a", "zz"));
        // The same key at the next start: tokens outlive a restart.
        let (again, _l2) = Services::open("127.0.0.1:0".parse().unwrap(), dir.path()).unwrap();
        assert_eq!(again.token("run-a"), t);
        use std::os::unix::fs::PermissionsExt;
        let key = dir.path().join("services.key");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(Services::open("127.0.0.1:0".parse().unwrap(), dir.path()).is_err());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn only_a_registered_run_with_its_token_is_handed_over() {
        let dir = tempfile::tempdir().unwrap();
        let (s, l) = Services::open("127.0.0.1:0".parse().unwrap(), dir.path()).unwrap();
        let s = Arc::new(s);
        let mut rx = s.register("r1", Service::Gateway);
        let addr = s.addr;
        tokio::spawn(serve(
            tokio::net::TcpListener::from_std(l).unwrap(),
            Arc::downgrade(&s),
        ));
        let send = |line: String| async move {
            let mut c = TcpStream::connect(addr).await.unwrap();
            c.write_all(line.as_bytes()).await.unwrap();
            c.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
            c
        };
        let token = s.token("r1");
        let _bad = send(format!("SUBAGENT/1 gateway r1 {}\n", s.token("r2"))).await;
        let _other = send(format!("SUBAGENT/1 egress r1 {token}\n")).await;
        let _good = send(format!("SUBAGENT/1 gateway r1 {token}\n")).await;
        let mut got = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        let mut first = [0u8; 16];
        got.read_exact(&mut first).await.unwrap();
        assert_eq!(
            &first, b"GET / HTTP/1.1\r\n",
            "the run's bytes start after the line"
        );
        s.forget("r1");
        assert!(s.sender("r1", "gateway").is_none());
    }
}
