//! Text the supervisor did not write (a child's output, names, paths and
//! messages; a definition's fields) made harmless wherever it reaches a
//! person or a model. One function per kind of output, and every caller
//! uses one of them:
//!
//! - a value on a line of plain text (the CLI, the MCP server's texts):
//!   [`one_line`]; a child's or a definition's words shown beside the
//!   supervisor's: [`quoted`] (in double quotes, `"` and `\` escaped);
//! - many lines for a terminal or a model (a log, its tail): [`for_terminal`],
//!   [`terminal_text`], or streamed through [`Sanitizer`] / [`TerminalWriter`];
//! - Markdown (result.md): [`markdown::code`] for values meant to be
//!   copied (paths, names: verbatim in a code span), [`markdown::text`]
//!   for prose;
//! - JSON printed on a terminal: [`json_text`].
//!
//! A byte a terminal acts on (ESC and CSI/OSC sequences that retitle the
//! window, write the clipboard or clear the screen; CR that overwrites a
//! line) or that makes a reader see something else (bidi overrides) is
//! shown visibly instead, one character at a time, in one scheme
//! ([`policy::visible`]):
//!
//! - `\r`, `\n`, `\t` for CR, LF and TAB (LF and TAB pass unchanged in
//!   many lines: see [`Sanitizer`]);
//! - `\xNN` for every other C0 control and DEL (ESC is `\x1b`), and for
//!   each byte that is not part of valid UTF-8 (`\xff`);
//! - `\u{NN}` for the C1 controls U+0080–U+009F (CSI is `\u{9b}`), the
//!   bidi controls U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069,
//!   and the separators U+2028, U+2029.
//!
//! Everything else, including all other multibyte text, passes unchanged.
//! Since each control character is replaced by itself, an escape sequence
//! split across two reads cannot leak; only an incomplete UTF-8 sequence
//! at the end of a read is held back (at most 3 bytes) until the next.

pub mod markdown;

use std::io::Write;

use policy::visible::{byte_form, visible_form};
pub use policy::visible::{is_hidden, one_line, push_invalid_byte, push_visible, quoted};

/// JSON text with every hidden character a serializer leaves raw inside
/// strings (DEL, C1, bidi controls, separators) written as a `\uXXXX`
/// escape: the same JSON value, safe to print. Newlines between tokens stay.
pub fn json_text(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if c != '\n' && is_hidden(c) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// `s` for a terminal: as [`Sanitizer`] shows it, newlines and tabs kept.
pub fn for_terminal(s: &str) -> String {
    terminal_text(s.as_bytes())
}

/// `bytes` as [`Sanitizer`] shows them (invalid UTF-8 as `\xNN`).
pub fn terminal_text(bytes: &[u8]) -> String {
    let mut out = Vec::with_capacity(bytes.len());
    let mut s = Sanitizer::default();
    s.push(bytes, &mut out);
    s.finish(&mut out);
    // The output is ASCII escapes and complete UTF-8 characters.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Escapes a byte stream for a terminal, chunk by chunk: newline and tab
/// pass, every other hidden character is shown visibly (see the module
/// doc). Holds back an incomplete UTF-8 sequence at the end of a chunk
/// until the next chunk (or [`Sanitizer::finish`]) decides it.
#[derive(Debug, Default)]
pub struct Sanitizer {
    pending: [u8; 4],
    len: usize,
}

impl Sanitizer {
    /// Appends the visible form of `input` to `out`.
    pub fn push(&mut self, input: &[u8], out: &mut Vec<u8>) {
        let mut i = 0;
        while self.len > 0 && i < input.len() {
            self.pending[self.len] = input[i];
            self.len += 1;
            i += 1;
            self.drain(out, false);
        }
        if self.len > 0 {
            return;
        }
        let rest = &input[i..];
        let done = scan(rest, out);
        let tail = &rest[done..];
        self.pending[..tail.len()].copy_from_slice(tail);
        self.len = tail.len();
    }

    /// Shows what is held back (an incomplete sequence at the end of the
    /// stream) as invalid bytes.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        self.drain(out, true);
    }

    /// Decides the held-back bytes as far as they can be decided.
    fn drain(&mut self, out: &mut Vec<u8>, at_end: bool) {
        while self.len > 0 {
            let held = &self.pending[..self.len];
            let (good, bad) = match std::str::from_utf8(held) {
                Ok(_) => (self.len, 0),
                Err(e) => match e.error_len() {
                    Some(n) => (e.valid_up_to(), n),
                    None if at_end => (e.valid_up_to(), self.len - e.valid_up_to()),
                    None if e.valid_up_to() == 0 => return,
                    None => (e.valid_up_to(), 0),
                },
            };
            // `good` bytes are valid UTF-8: scan consumes them all.
            let used = scan(&held[..good], out);
            let mut buf = [0u8; 12];
            for &b in &held[used..used + bad] {
                let n = byte_form(b, &mut buf);
                out.extend_from_slice(&buf[..n]);
            }
            let n = used + bad;
            self.pending.copy_within(n..self.len, 0);
            self.len -= n;
        }
    }
}

/// How many bytes the UTF-8 sequence led by `b` has (0: not a lead byte).
fn seq_len(b: u8) -> usize {
    match b {
        0xc2..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf4 => 4,
        _ => 0,
    }
}

/// The bytes that pass as they are: printable ASCII, newline and tab.
const PLAIN: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0x20;
    while b < 0x7f {
        t[b] = true;
        b += 1;
    }
    t[b'\n' as usize] = true;
    t[b'\t' as usize] = true;
    t
};

/// Writes the visible form of `bytes` to `out`, up to an incomplete UTF-8
/// sequence at the end; returns how many bytes it consumed.
fn scan(bytes: &[u8], out: &mut Vec<u8>) -> usize {
    let mut i = 0;
    let mut run = 0;
    let mut buf = [0u8; 12];
    while i < bytes.len() {
        let b = bytes[i];
        if PLAIN[usize::from(b)] {
            i += 1;
            continue;
        }
        let (step, shown) = if b < 0x80 {
            (1, visible_form(char::from(b), &mut buf))
        } else {
            let want = seq_len(b);
            let end = (i + want.max(1)).min(bytes.len());
            match std::str::from_utf8(&bytes[i..end]) {
                Ok(s) => match s.chars().next() {
                    Some(c) if is_hidden(c) => (want, visible_form(c, &mut buf)),
                    _ => {
                        i += want;
                        continue;
                    }
                },
                // A sequence the chunk cuts: decided with the next one.
                Err(e) if e.error_len().is_none() && want > 0 => {
                    out.extend_from_slice(&bytes[run..i]);
                    return i;
                }
                // Not UTF-8: the first byte shown, the rest decided afresh.
                Err(_) => (1, byte_form(b, &mut buf)),
            }
        };
        out.extend_from_slice(&bytes[run..i]);
        out.extend_from_slice(&buf[..shown]);
        i += step;
        run = i;
    }
    out.extend_from_slice(&bytes[run..]);
    bytes.len()
}

/// A writer that shows what is written to it through a [`Sanitizer`].
/// Call [`TerminalWriter::finish`] at the end of the stream.
pub struct TerminalWriter<W: Write> {
    inner: W,
    state: Sanitizer,
    buf: Vec<u8>,
}

impl<W: Write> TerminalWriter<W> {
    /// Wraps `inner`.
    pub fn new(inner: W) -> Self {
        TerminalWriter {
            inner,
            state: Sanitizer::default(),
            buf: Vec::new(),
        }
    }

    /// Writes out what is held back, as invalid bytes, and flushes.
    pub fn finish(&mut self) -> std::io::Result<()> {
        self.buf.clear();
        self.state.finish(&mut self.buf);
        self.inner.write_all(&self.buf)?;
        self.inner.flush()
    }
}

impl<W: Write> Write for TerminalWriter<W> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.clear();
        self.state.push(data, &mut self.buf);
        self.inner.write_all(&self.buf)?;
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(chunks: &[&[u8]]) -> String {
        let mut out = Vec::new();
        let mut s = Sanitizer::default();
        for c in chunks {
            s.push(c, &mut out);
        }
        s.finish(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn every_c0_byte_and_del_is_visible_except_newline_and_tab() {
        for b in (0u8..0x20).chain([0x7f]) {
            let got = terminal_text(&[b'a', b, b'z']);
            let want = match b {
                b'\n' => "a\nz".to_owned(),
                b'\t' => "a\tz".to_owned(),
                b'\r' => "a\\rz".to_owned(),
                _ => format!("a\\x{b:02x}z"),
            };
            assert_eq!(got, want, "byte {b:#04x}");
        }
        assert_eq!(one_line("a\nb\tc"), "a\\nb\\tc");
    }

    #[test]
    fn every_c1_control_is_visible_as_char_or_byte() {
        for c in '\u{80}'..='\u{9f}' {
            let mut utf8 = [0u8; 4];
            let got = terminal_text(c.encode_utf8(&mut utf8).as_bytes());
            assert_eq!(got, format!("\\u{{{:x}}}", c as u32));
            // The raw 8-bit form is not UTF-8: shown as a byte.
            let raw = c as u32 as u8;
            assert_eq!(terminal_text(&[raw]), format!("\\x{raw:02x}"));
        }
    }

    #[test]
    fn bidi_controls_and_separators_are_visible() {
        for c in ['\u{61c}', '\u{200e}', '\u{200f}', '\u{2028}', '\u{2029}']
            .into_iter()
            .chain('\u{202a}'..='\u{202e}')
            .chain('\u{2066}'..='\u{2069}')
        {
            let text = format!("x{c}y");
            assert_eq!(for_terminal(&text), format!("x\\u{{{:x}}}y", c as u32));
            assert_eq!(one_line(&text), format!("x\\u{{{:x}}}y", c as u32));
        }
    }

    #[test]
    fn valid_text_passes_unchanged() {
        let text = "plain ascii ~!@#$%^&*()_+`{}|[]\\:\";'<>?,./\n\
                    é ß 中文 日本語 😀 👨\u{200d}👩\u{200d}👧 \u{a0} \u{2027} \u{202f} \u{fffd}\tend\n";
        assert_eq!(for_terminal(text), text);
        let mut out = Vec::new();
        let mut s = Sanitizer::default();
        for b in text.as_bytes() {
            s.push(std::slice::from_ref(b), &mut out);
        }
        s.finish(&mut out);
        assert_eq!(out, text.as_bytes(), "byte by byte");
    }

    #[test]
    fn sequences_split_across_reads_do_not_leak() {
        // An OSC 52 clipboard write, split inside the ESC sequence.
        assert_eq!(
            stream(&[b"a\x1b", b"]52;c;aGk=\x07b"]),
            "a\\x1b]52;c;aGk=\\x07b"
        );
        // CSI as UTF-8 C1 (C2 9B) split between its two bytes.
        assert_eq!(stream(&[b"x\xc2", b"\x9b2Jy"]), "x\\u{9b}2Jy");
        // RLO (E2 80 AE) split every way.
        assert_eq!(stream(&[b"\xe2", b"\x80\xae!"]), "\\u{202e}!");
        assert_eq!(stream(&[b"\xe2\x80", b"\xae!"]), "\\u{202e}!");
        assert_eq!(stream(&[b"\xe2", b"\x80", b"\xae"]), "\\u{202e}");
        // A 4-byte character split in three.
        assert_eq!(stream(&[b"\xf0\x9f", b"\x98", b"\x80."]), "😀.");
        // Cut off at the end of the stream: shown as bytes.
        assert_eq!(stream(&[b"ok\xe2\x80"]), "ok\\xe2\\x80");
        // A broken sequence completed by the next read: the bytes, then
        // the rest decided afresh.
        assert_eq!(stream(&[b"\xe2\x80", b"A\xe2"]), "\\xe2\\x80A\\xe2");
        assert_eq!(stream(&[b"\xe2", b"\xc2\x9b"]), "\\xe2\\u{9b}");
        assert_eq!(stream(&[b"\xf0", b"\x9f", b"\x1b"]), "\\xf0\\x9f\\x1b");
    }

    #[test]
    fn invalid_utf8_is_shown_byte_by_byte() {
        assert_eq!(terminal_text(b"a\xffb\xc0\xafc"), "a\\xffb\\xc0\\xafc");
        assert_eq!(terminal_text(b"\xed\xa0\x80"), "\\xed\\xa0\\x80");
        assert_eq!(terminal_text(b"\xf5\x80"), "\\xf5\\x80");
    }

    #[test]
    fn every_split_of_a_mixed_stream_gives_the_same_output() {
        let input: &[u8] = b"a\x1b[2J\xc2\x9b\xe2\x80\xae\xf0\x9f\x98\x80\xff\r\n\xe2\x80";
        let whole = stream(&[input]);
        for i in 0..=input.len() {
            for j in i..=input.len() {
                assert_eq!(
                    stream(&[&input[..i], &input[i..j], &input[j..]]),
                    whole,
                    "split at {i}, {j}"
                );
            }
        }
        assert!(!whole.bytes().any(|b| b == 0x1b || b == b'\r'));
    }

    #[test]
    fn json_stays_the_same_value() {
        let v = serde_json::json!({"reason": "a\u{1b}[2J\u{7f}\u{9b}\u{202e}\u{2028}\n\tz"});
        let text = json_text(&serde_json::to_string_pretty(&v).unwrap());
        assert!(!text.chars().any(|c| c != '\n' && is_hidden(c)), "{text}");
        assert!(text.contains("\\u007f\\u009b\\u202e\\u2028"), "{text}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&text).unwrap(), v);
    }

    #[test]
    fn the_writer_holds_back_and_finishes() {
        let mut w = TerminalWriter::new(Vec::new());
        w.write_all(b"\x1b]0;t\x07 \xe2\x80").unwrap();
        assert_eq!(w.inner, b"\\x1b]0;t\\x07 ");
        w.write_all(b"\xae").unwrap();
        w.write_all(b"\xc2").unwrap();
        w.finish().unwrap();
        assert_eq!(
            String::from_utf8(w.inner).unwrap(),
            "\\x1b]0;t\\x07 \\u{202e}\\xc2"
        );
    }

    #[test]
    fn throughput_is_not_a_bottleneck() {
        // 8 MiB of a plain log, then of one with multibyte text and ESCs on
        // every line, in 256 KiB reads as `logs` does. Prints MB/s for the
        // record.
        for line in [
            "2026-01-01T00:00:00Z compiling crate hello, some ordinary text: ok\n",
            "2026-01-01T00:00:00Z compiling crate héllo 中文 \x1b[32mok\x1b[0m\n",
        ] {
            let data = line.repeat(8 * 1024 * 1024 / line.len());
            let mut out = Vec::with_capacity(data.len() * 2);
            let start = std::time::Instant::now();
            let mut s = Sanitizer::default();
            for chunk in data.as_bytes().chunks(256 * 1024) {
                s.push(chunk, &mut out);
            }
            s.finish(&mut out);
            let mbps = data.len() as f64 / start.elapsed().as_secs_f64() / 1e6;
            eprintln!("sanitizer: {mbps:.0} MB/s");
            assert!(!out.contains(&0x1b));
            assert_eq!(out.len() - data.len(), data.matches('\x1b').count() * 3);
        }
    }
}
