//! What a live run looks like right now, read from the host per call: the
//! CPU time, memory and process count of its processes ([`procs`]: the
//! runner's descendants in `/proc`, or its cgroup's memory charge) and
//! the last line of its log ([`lastline`]). Everything read belongs to a
//! hostile child: each read is bounded, a process that is gone mid-walk is
//! skipped, and log text comes back escaped. Uses `sanitize` and the
//! runner crate's safe file reads; never the engine.

pub mod lastline;
pub mod procs;

pub use lastline::{last_line, tail_lines};
pub use procs::{sample, Sample};
