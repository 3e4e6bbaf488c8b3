//! Fuzzes the request decoder: any bytes must decode to a request or to the
//! error to answer with, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = subagentd::protocol::decode(data);
});
