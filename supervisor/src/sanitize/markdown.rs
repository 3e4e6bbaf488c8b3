//! Putting text the supervisor did not write into Markdown (result.md) so
//! that it stays one inert value on its line: it cannot start a line, a
//! heading or a list item, open emphasis, a link, an HTML tag or comment,
//! or close a fence.
//!
//! Every value goes through one of two functions:
//!
//! - [`code`] for values meant to be copied (paths, names, hosts): a code
//!   span whose backtick delimiter is longer than any backtick run inside,
//!   holding the value exactly, byte for byte. A value with a newline, a
//!   control character, a bidi control, a separator or bytes that are not
//!   UTF-8 cannot be shown so on one line: it is shown escaped (below) in
//!   the span, and [`ESCAPED`] after it says so;
//! - [`text`] for prose that may quote a child (reasons, notes): escaped
//!   (below), then the Markdown-significant characters backslash-escaped,
//!   so ordinary text keeps its look.
//!
//! Escaped means: newlines, control characters, bidi controls and
//! separators shown as in [`crate::sanitize`] (`\n`, `\x1b`, `\u{202e}`),
//! a backslash as `\\`, and each byte that is not valid UTF-8 as `\xNN`.

use crate::sanitize::{is_hidden, push_invalid_byte, push_visible};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

/// What follows a code span that holds a value escaped, not verbatim.
pub const ESCAPED: &str = "(shown escaped)";

/// How an empty value is shown (an empty code span does not exist).
pub const EMPTY: &str = "(empty)";

/// `bytes` on one line with every hidden character, backslash and invalid
/// byte shown visibly.
fn visible(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\\' {
                out.push_str("\\\\");
            } else if is_hidden(c) {
                push_visible(c, &mut out);
            } else {
                out.push(c);
            }
        }
        for &b in chunk.invalid() {
            push_invalid_byte(b, &mut out);
        }
    }
    out
}

/// A code span holding `v` exactly (already one line).
fn span(v: &str) -> String {
    if v.is_empty() {
        return EMPTY.to_owned();
    }
    let mut longest = 0;
    let mut run = 0;
    for c in v.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    let ticks = "`".repeat(longest + 1);
    // A code span drops one space at each end when both ends have one, and
    // a backtick at an end would join the delimiter.
    let edge = |c: Option<char>| matches!(c, Some('`' | ' '));
    let all_spaces = v.chars().all(|c| c == ' ');
    if !all_spaces && (edge(v.chars().next()) || edge(v.chars().next_back())) {
        format!("{ticks} {v} {ticks}")
    } else {
        format!("{ticks}{v}{ticks}")
    }
}

/// A value meant to be copied (a path, a name) as a code span: exactly its
/// bytes when they fit on one line, else escaped and followed by [`ESCAPED`].
pub fn code(v: impl AsRef<OsStr>) -> String {
    let bytes = v.as_ref().as_bytes();
    match std::str::from_utf8(bytes) {
        Ok(s) if !s.chars().any(is_hidden) => span(s),
        _ => format!("{} {ESCAPED}", span(&visible(bytes))),
    }
}

/// Prose as inline text: escaped, Markdown-significant characters too.
pub fn text(v: impl AsRef<OsStr>) -> String {
    escape_inline(&visible(v.as_ref().as_bytes()))
}

/// Backslash-escapes what could start inline markup: code, emphasis,
/// strikethrough, links, HTML and entities. An underscore between two
/// alphanumerics cannot delimit emphasis and stays bare (`common_dir`).
/// The backslashes `visible` doubled are already escaped pairs.
fn escape_inline(v: &str) -> String {
    let chars: Vec<char> = v.chars().collect();
    let mut out = String::with_capacity(v.len() + 8);
    for (i, &c) in chars.iter().enumerate() {
        let escape = match c {
            '`' | '*' | '[' | ']' | '<' | '&' | '~' => true,
            '_' => {
                let alnum = |j: Option<usize>| {
                    j.and_then(|j| chars.get(j))
                        .is_some_and(|c| c.is_alphanumeric())
                };
                !(alnum(i.checked_sub(1)) && alnum(Some(i + 1)))
            }
            _ => false,
        };
        if escape {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    #[test]
    fn ordinary_names_keep_their_look() {
        assert_eq!(code("out.txt"), "`out.txt`");
        assert_eq!(code("dir/my file_1.rs"), "`dir/my file_1.rs`");
        assert_eq!(text("/tmp/my_project/x.rs"), "/tmp/my_project/x.rs");
        assert_eq!(
            text("git: worktree=/w common_dir=/w/.git branch=main"),
            "git: worktree=/w common_dir=/w/.git branch=main"
        );
        assert_eq!(
            text("killed by signal 9 (SIGKILL); see runner.log: x"),
            "killed by signal 9 (SIGKILL); see runner.log: x"
        );
    }

    #[test]
    fn code_spans_outgrow_backticks_of_every_length() {
        for n in 1..=12 {
            let ticks = "`".repeat(n);
            for v in [
                format!("a{ticks}b"),
                format!("{ticks}a"),
                format!("a{ticks}"),
                ticks.clone(),
            ] {
                let got = code(&v);
                let delim = "`".repeat(n + 1);
                assert!(got.starts_with(&delim) && got.ends_with(&delim), "{got}");
                let inner = &got[delim.len()..got.len() - delim.len()];
                let padded = v.starts_with('`') || v.ends_with('`');
                let want = if padded { format!(" {v} ") } else { v.clone() };
                assert_eq!(inner, want);
                assert!(!inner.starts_with('`') && !inner.ends_with('`'), "{got}");
            }
        }
        assert_eq!(code(" a "), "`  a  `");
        assert_eq!(code("  "), "`  `");
        assert_eq!(code(""), EMPTY);
    }

    #[test]
    fn lines_controls_and_invalid_bytes_are_visible() {
        assert_eq!(
            code("x\n- state: **succeeded**\n# h"),
            "`x\\n- state: **succeeded**\\n# h` (shown escaped)"
        );
        assert_eq!(
            code("a\rb\x1bc\u{202e}d\u{2028}e\\n"),
            "`a\\rb\\x1bc\\u{202e}d\\u{2028}e\\\\n` (shown escaped)"
        );
        let raw = OsStr::from_bytes(b"bad\xff\xfename");
        assert_eq!(code(raw), "`bad\\xff\\xfename` (shown escaped)");
        assert_eq!(text(raw), "bad\\xff\\xfename");
    }

    #[test]
    fn values_that_fit_on_a_line_are_verbatim_in_their_span() {
        // Backslashes and markup are not escaped inside a code span.
        assert_eq!(code("/tmp/a__b*c\\n"), "`/tmp/a__b*c\\n`");
        assert_eq!(code("/tmp/x`y/z"), "``/tmp/x`y/z``");
        assert_eq!(code("`lead"), "`` `lead ``");
        assert_eq!(code("é <b> [l](x)"), "`é <b> [l](x)`");
    }

    #[test]
    fn text_escapes_inline_markup() {
        assert_eq!(text("**bold**"), "\\*\\*bold\\*\\*");
        assert_eq!(text("_em_ a_b __x__"), "\\_em\\_ a_b \\_\\_x\\_\\_");
        assert_eq!(text("[l](http://x)"), "\\[l\\](http://x)");
        assert_eq!(text("<!-- c --> </details>"), "\\<!-- c --> \\</details>");
        assert_eq!(text("`x` &amp; ~~s~~"), "\\`x\\` \\&amp; \\~\\~s\\~\\~");
        assert_eq!(text("a\nb"), "a\\nb");
        assert_eq!(text("back\\slash"), "back\\\\slash");
    }
}
