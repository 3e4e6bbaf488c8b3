//! The gate: a pipe from the daemon that holds the agent back until the
//! run is on disk. The daemon starts the runner while it is still writing
//! and fsyncing the run's records, so the runner's own start and the
//! sandbox's preparation overlap that wait; one byte means go, end of file
//! means the run was never recorded.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// Blocks until the daemon writes its byte (true) or closes its end, or
/// dies (false). Takes ownership of `fd` and closes it.
pub fn wait(fd: RawFd) -> bool {
    // SAFETY: the daemon handed this descriptor to this process alone;
    // nothing else in the runner owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut b = [0u8; 1];
    loop {
        match nix::unistd::read(&fd, &mut b) {
            Ok(1) => return b[0] == GO,
            Err(nix::errno::Errno::EINTR) => continue,
            _ => return false,
        }
    }
}

/// The byte that opens the gate.
pub const GO: u8 = b'1';

/// The runner's exit status when its run was called off at the gate: it
/// started nothing and took its pid out of runner.lock.
pub const CALLED_OFF: u8 = 3;

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::IntoRawFd;

    #[test]
    fn one_byte_opens_it_and_end_of_file_keeps_it_shut() {
        let (r, w) = nix::unistd::pipe().unwrap();
        nix::unistd::write(&w, &[GO]).unwrap();
        assert!(wait(r.into_raw_fd()));
        let (r, w) = nix::unistd::pipe().unwrap();
        drop(w);
        assert!(!wait(r.into_raw_fd()));
        let (r, w) = nix::unistd::pipe().unwrap();
        nix::unistd::write(&w, b"0").unwrap();
        assert!(!wait(r.into_raw_fd()));
    }
}
