//! Text a child controls, shown visibly: every control character, the
//! bidi controls and the line separators become an escape (`\n`, `\x1b`,
//! `\u{202e}`), one character at a time, so that a value cannot start a
//! line, act on a terminal or read as something else. Everything else,
//! multibyte text included, passes unchanged.

/// Whether `c` is shown escaped: C0 controls, DEL, C1 controls, the bidi
/// controls and the line and paragraph separators.
pub fn is_hidden(c: char) -> bool {
    matches!(c,
        '\0'..='\x1f'
        | '\x7f'..='\u{9f}'
        | '\u{61c}'
        | '\u{200e}'
        | '\u{200f}'
        | '\u{2028}'..='\u{202e}'
        | '\u{2066}'..='\u{2069}')
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Writes the visible form of `c` (which [`is_hidden`]) into `buf`;
/// returns its length.
pub fn visible_form(c: char, buf: &mut [u8; 12]) -> usize {
    let short = match c {
        '\n' => Some(b'n'),
        '\r' => Some(b'r'),
        '\t' => Some(b't'),
        _ => None,
    };
    buf[0] = b'\\';
    if let Some(letter) = short {
        buf[1] = letter;
        return 2;
    }
    let n = c as u32;
    if n < 0x20 || n == 0x7f {
        return byte_form(n as u8, buf);
    }
    buf[1..3].copy_from_slice(b"u{");
    let digits = (32 - n.leading_zeros()).div_ceil(4).max(1) as usize;
    for i in 0..digits {
        buf[3 + i] = HEX[((n >> (4 * (digits - 1 - i))) & 0xf) as usize];
    }
    buf[3 + digits] = b'}';
    4 + digits
}

/// Writes `\xNN` for byte `b` into `buf`; returns its length.
pub fn byte_form(b: u8, buf: &mut [u8; 12]) -> usize {
    buf[..2].copy_from_slice(b"\\x");
    buf[2] = HEX[usize::from(b >> 4)];
    buf[3] = HEX[usize::from(b & 0xf)];
    4
}

/// Appends the visible form of `c` (which [`is_hidden`]) to `out`.
pub fn push_visible(c: char, out: &mut String) {
    let mut buf = [0u8; 12];
    let n = visible_form(c, &mut buf);
    out.extend(buf[..n].iter().map(|&b| char::from(b)));
}

/// Appends the visible form of a byte that is not valid UTF-8 to `out`.
pub fn push_invalid_byte(b: u8, out: &mut String) {
    let mut buf = [0u8; 12];
    let n = byte_form(b, &mut buf);
    out.extend(buf[..n].iter().map(|&b| char::from(b)));
}

/// `s` on one line: every hidden character (newline and tab included)
/// shown visibly. For a value printed after a label.
pub fn one_line(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if is_hidden(c) {
            push_visible(c, &mut out);
        } else {
            out.push(c);
        }
    }
    out
}

/// `s` as one quoted value: in double quotes, with every hidden character
/// shown visibly and each `"` and `\` inside escaped, so the value ends at
/// the first unescaped quote. For words a child or a definition wrote,
/// shown beside the supervisor's.
pub fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c if is_hidden(c) => push_visible(c, &mut out),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_shown_and_text_passes() {
        assert_eq!(one_line("a\nb\tc\r"), "a\\nb\\tc\\r");
        assert_eq!(one_line("\x1b[2J"), "\\x1b[2J");
        assert_eq!(one_line("\u{202e}x\u{9b}"), "\\u{202e}x\\u{9b}");
        assert_eq!(one_line("naïve 日本"), "naïve 日本");
    }

    #[test]
    fn a_quoted_value_cannot_end_early_or_add_a_line() {
        assert_eq!(quoted("plain"), "\"plain\"");
        assert_eq!(
            quoted("x\"\nrun r: succeeded \\n\x1b[2J"),
            "\"x\\\"\\nrun r: succeeded \\\\n\\x1b[2J\""
        );
        assert_eq!(quoted(""), "\"\"");
    }
}
