//! What an agent program needs to start, read from its first bytes: the
//! `#!` line the kernel acts on, the program `env` would run from it (GNU
//! env's options parsed as env parses them, `-S` split strings included),
//! and the dynamic loader an ELF file names. The daemon grants each
//! element an execute rule, so each parse errs toward naming nothing: an
//! element that cannot be known for sure is left out (the child then
//! cannot execute it) rather than guessed.

use std::path::{Path, PathBuf};

/// The bytes of a `#!` line the kernel reads (BINPRM_BUF_SIZE).
pub const SHEBANG_MAX: usize = 256;

/// A `#!` line as the kernel splits it: the interpreter and at most one
/// argument (the rest of the line, spaces included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shebang {
    /// The interpreter path.
    pub interpreter: PathBuf,
    /// The optional argument.
    pub arg: Option<String>,
}

/// The `#!` line at the start of `head`, split as Linux's binfmt_script
/// splits it.
pub fn shebang(head: &[u8]) -> Option<Shebang> {
    let buf = &head[..head.len().min(SHEBANG_MAX)];
    let rest = buf.strip_prefix(b"#!")?;
    let blank = |b: &u8| *b == b' ' || *b == b'\t';
    let line = match rest.iter().position(|&b| b == b'\n') {
        Some(end) => &rest[..end],
        None => {
            // A line longer than the buffer: the kernel runs it only when
            // the interpreter's name ends within the buffer.
            let start = rest.iter().position(|b| !blank(b))?;
            rest[start..].iter().position(blank)?;
            rest
        }
    };
    let text = std::str::from_utf8(line).ok()?;
    let text = text.trim_matches([' ', '\t']);
    let (interp, arg) = match text.find([' ', '\t']) {
        Some(i) => (&text[..i], text[i..].trim_start_matches([' ', '\t'])),
        None => (text, ""),
    };
    if interp.is_empty() {
        return None;
    }
    Some(Shebang {
        interpreter: PathBuf::from(interp),
        arg: (!arg.is_empty()).then(|| arg.to_owned()),
    })
}

/// Whether `interpreter` is `env` (by its file name).
pub fn is_env(interpreter: &Path) -> bool {
    interpreter.file_name().is_some_and(|n| n == "env")
}

/// The program a `#!` line's `env` would run, when the line names env and
/// the program can be known for sure.
pub fn shebang_env_target(s: &Shebang) -> Option<String> {
    if !is_env(&s.interpreter) {
        return None;
    }
    // The kernel passes the whole rest of the line as one argument.
    env_target(&[s.arg.clone()?])
}

/// GNU env's long options: the name and whether it takes an argument
/// (`Some(true)` required, `Some(false)` only as `--name=value`).
const LONG: &[(&str, Option<bool>)] = &[
    ("argv0", Some(true)),
    ("block-signal", Some(false)),
    ("chdir", Some(true)),
    ("debug", None),
    ("default-signal", Some(false)),
    ("help", None),
    ("ignore-environment", None),
    ("ignore-signal", Some(false)),
    ("list-signal-handling", None),
    ("null", None),
    ("split-string", Some(true)),
    ("unset", Some(true)),
    ("version", None),
];

/// What parsing one option word did.
enum Step {
    /// Go on with the next word.
    Next,
    /// A split string to put in front of the remaining words.
    Split(String),
}

/// The program `env args...` runs, parsing options as GNU env does (it
/// stops at the first word that is not an option); `None` when it runs no
/// program, would fail, or the program cannot be known (a `${VAR}` in a
/// split string, `--chdir` with a relative program).
pub fn env_target(args: &[String]) -> Option<String> {
    let mut words: std::collections::VecDeque<String> = args.iter().cloned().collect();
    // `chdir`: -C was given; `null`: -0, which env refuses with a program.
    let (mut chdir, mut null) = (false, false);
    while let Some(w) = words.front().cloned() {
        if w == "--" {
            words.pop_front();
            break;
        }
        if !w.starts_with('-') || w == "-" {
            break;
        }
        words.pop_front();
        let step = if let Some(long) = w.strip_prefix("--") {
            long_option(long, &mut words, &mut chdir, &mut null)?
        } else {
            short_options(&w[1..], &mut words, &mut chdir, &mut null)?
        };
        if let Step::Split(s) = step {
            for (i, word) in split_string(&s)?.into_iter().enumerate() {
                words.insert(i, word);
            }
        }
    }
    // A lone "-" means -i; then NAME=VALUE assignments.
    if words.front().is_some_and(|w| w == "-") {
        words.pop_front();
    }
    let target = words.into_iter().find(|w| !w.contains('='))?;
    if null {
        return None;
    }
    if chdir && target.contains('/') && !target.starts_with('/') {
        return None;
    }
    Some(target)
}

fn long_option(
    long: &str,
    words: &mut std::collections::VecDeque<String>,
    chdir: &mut bool,
    null: &mut bool,
) -> Option<Step> {
    let (name, value) = match long.split_once('=') {
        Some((n, v)) => (n, Some(v.to_owned())),
        None => (long, None),
    };
    // getopt_long takes an unambiguous prefix.
    let exact = LONG.iter().find(|(n, _)| *n == name);
    let mut prefixed = LONG.iter().filter(|(n, _)| n.starts_with(name));
    let (full, takes) = match exact {
        Some(o) => *o,
        None => {
            let o = prefixed.next()?;
            if name.is_empty() || prefixed.next().is_some() {
                return None;
            }
            *o
        }
    };
    let value = match takes {
        Some(true) => Some(value.or_else(|| words.pop_front())?),
        Some(false) => value,
        None if value.is_some() => return None,
        None => None,
    };
    match full {
        "help" | "version" | "list-signal-handling" => None,
        "chdir" => {
            *chdir = true;
            Some(Step::Next)
        }
        "null" => {
            *null = true;
            Some(Step::Next)
        }
        "split-string" => value.map(Step::Split),
        _ => Some(Step::Next),
    }
}

fn short_options(
    cluster: &str,
    words: &mut std::collections::VecDeque<String>,
    chdir: &mut bool,
    null: &mut bool,
) -> Option<Step> {
    for (i, c) in cluster.char_indices() {
        match c {
            'i' | 'v' => {}
            '0' => *null = true,
            'u' | 'C' | 'S' | 'a' => {
                let rest = &cluster[i + c.len_utf8()..];
                let value = if rest.is_empty() {
                    words.pop_front()?
                } else {
                    rest.to_owned()
                };
                return match c {
                    'S' => Some(Step::Split(value)),
                    'C' => {
                        *chdir = true;
                        Some(Step::Next)
                    }
                    _ => Some(Step::Next),
                };
            }
            // Unknown options, and the blank env reports as a misused
            // `#!` line: env fails.
            _ => return None,
        }
    }
    Some(Step::Next)
}

/// GNU env's `-S` string split into words (quotes, backslash escapes,
/// `#` comments); `None` where env would fail or expand a variable.
pub fn split_string(s: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut cur: Option<String> = None;
    let mut chars = s.chars().peekable();
    let (mut single, mut double) = (false, false);
    while let Some(c) = chars.next() {
        let quoted = single || double;
        match c {
            '\'' if !double => {
                single = !single;
                cur.get_or_insert_with(String::new);
            }
            '"' if !single => {
                double = !double;
                cur.get_or_insert_with(String::new);
            }
            ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r' if !quoted => {
                out.extend(cur.take());
            }
            '#' if !quoted && cur.is_none() => break,
            '$' if !single => return None,
            '\\' => {
                let e = chars.next()?;
                if single && e != '\\' && e != '\'' {
                    let w = cur.get_or_insert_with(String::new);
                    w.push('\\');
                    w.push(e);
                    continue;
                }
                let ch = match e {
                    'c' if !quoted => break,
                    '_' if !quoted => {
                        out.extend(cur.take());
                        continue;
                    }
                    '_' => ' ',
                    '"' | '\'' | '\\' | '#' | '$' => e,
                    'f' => '\x0c',
                    'n' => '\n',
                    'r' => '\r',
                    't' => '\t',
                    'v' => '\x0b',
                    _ => return None,
                };
                cur.get_or_insert_with(String::new).push(ch);
            }
            _ => cur.get_or_insert_with(String::new).push(c),
        }
    }
    if single || double {
        return None;
    }
    out.extend(cur);
    Some(out)
}

/// The program interpreter (PT_INTERP, the dynamic loader) an ELF file
/// names, from its first bytes (64-bit little-endian ELF only; the
/// interpreter's path must lie within `head`).
pub fn elf_interpreter(head: &[u8]) -> Option<PathBuf> {
    let u16_at = |o: usize| {
        head.get(o..o + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
    };
    let u32_at = |o: usize| {
        head.get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |o: usize| {
        head.get(o..o + 8)
            .map(|b| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as usize)
    };
    // \x7fELF, 64-bit, little-endian.
    if head.get(0..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1][..]) {
        return None;
    }
    let (phoff, phentsize, phnum) = (u64_at(0x20)?, u16_at(0x36)?, u16_at(0x38)?);
    for i in 0..phnum.min(64) {
        let ph = phoff.checked_add(i.checked_mul(phentsize)?)?;
        const PT_INTERP: u32 = 3;
        if u32_at(ph)? == PT_INTERP {
            let (off, size) = (u64_at(ph + 8)?, u64_at(ph + 32)?);
            let bytes = head.get(off..off.checked_add(size)?)?;
            let text = std::str::from_utf8(bytes.split(|&b| b == 0).next()?).ok()?;
            return Some(PathBuf::from(text));
        }
    }
    None
}

/// Whether a file name looks like a dynamic loader's (`ld-*.so*`,
/// `ld-linux*`, `ld64.so*`): what a PT_INTERP may name.
pub fn is_loader_name(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    (name.starts_with("ld-") && name.contains(".so"))
        || name.starts_with("ld-linux")
        || name.starts_with("ld64.so")
}

/// Whether `path` lies in one of the system roots (see
/// [`super::fs::SYSTEM_READ_EXEC`]).
pub fn in_system_roots(path: &Path) -> bool {
    super::fs::SYSTEM_READ_EXEC
        .iter()
        .any(|r| path.starts_with(r))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb(line: &str) -> Option<(String, Option<String>)> {
        shebang(line.as_bytes()).map(|s| (s.interpreter.display().to_string(), s.arg))
    }

    fn words(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_kernel_passes_one_argument() {
        assert_eq!(sb("#!/bin/sh\necho"), Some(("/bin/sh".into(), None)));
        assert_eq!(
            sb("#!  /usr/bin/env   -S python3 -u  \t\nx"),
            Some(("/usr/bin/env".into(), Some("-S python3 -u".into())))
        );
        assert_eq!(sb("#!/\n"), Some(("/".into(), None)));
        assert_eq!(sb("#!\n"), None);
        assert_eq!(sb("#! \t \n"), None);
        assert_eq!(sb("\x7fELF"), None);
        // Longer than the kernel's buffer: only when the name ends in it.
        let long = format!("#!/bin/sh {}", "x".repeat(400));
        assert_eq!(sb(&long).unwrap().0, "/bin/sh");
        assert_eq!(sb(&format!("#!/{}", "x".repeat(400))), None);
    }

    #[test]
    fn envs_options_are_not_taken_for_the_program() {
        let target = |line: &str| shebang_env_target(&shebang(line.as_bytes()).unwrap());
        // The attack: `-u` takes `/` as the name to unset.
        assert_eq!(
            target("#!/usr/bin/env -S -u / /usr/bin/python3\n"),
            Some("/usr/bin/python3".into())
        );
        assert_eq!(target("#!/usr/bin/env python3\n"), Some("python3".into()));
        assert_eq!(
            target("#!/usr/bin/env -S python3 -u\n"),
            Some("python3".into())
        );
        assert_eq!(
            target("#!/usr/bin/env -S-u/ -i A=1 node\n"),
            Some("node".into())
        );
        assert_eq!(
            target("#!/usr/bin/env --split-string=--unset=/ -- deno\n"),
            Some("deno".into())
        );
        // `--split` takes `/` as its string: env runs `/` (which the
        // daemon then refuses: it is no regular file).
        assert_eq!(
            target("#!/usr/bin/env -S --split /  ruby\n"),
            Some("/".into())
        );
        // Without -S the whole rest is one word: env would fail.
        assert_eq!(target("#!/usr/bin/env -i python3\n"), None);
        assert_eq!(target("#!/usr/bin/env\n"), None);
        assert_eq!(target("#!/bin/sh -e\n"), None);
    }

    #[test]
    fn env_argument_lists() {
        let t = |v: &[&str]| env_target(&words(v));
        assert_eq!(t(&["-u", "/", "prog"]), Some("prog".into()));
        assert_eq!(t(&["-u/", "prog"]), Some("prog".into()));
        assert_eq!(t(&["--unset", "/", "prog"]), Some("prog".into()));
        assert_eq!(t(&["--uns=/", "prog"]), Some("prog".into()));
        assert_eq!(t(&["-iv", "X=/", "prog", "/"]), Some("prog".into()));
        assert_eq!(t(&["-i0", "prog"]), None, "--null refuses a program");
        assert_eq!(t(&["-", "X=1", "prog"]), Some("prog".into()));
        assert_eq!(t(&["--", "-prog"]), Some("-prog".into()));
        assert_eq!(t(&["-iu", "A", "prog"]), Some("prog".into()));
        assert_eq!(t(&["-C", "/tmp", "./prog"]), None);
        assert_eq!(t(&["-C", "/tmp", "/bin/prog"]), Some("/bin/prog".into()));
        assert_eq!(t(&["--default-signal", "prog"]), Some("prog".into()));
        assert_eq!(t(&["--help", "prog"]), None);
        assert_eq!(
            t(&["--d", "prog"]),
            None,
            "ambiguous: debug, default-signal"
        );
        assert_eq!(t(&["-x", "prog"]), None);
        assert_eq!(t(&["-u"]), None);
        assert_eq!(t(&["A=1"]), None);
        assert_eq!(t(&["-S", "${X} prog"]), None);
    }

    #[test]
    fn split_strings() {
        let s = |x: &str| split_string(x);
        assert_eq!(s("a  b\tc"), Some(words(&["a", "b", "c"])));
        assert_eq!(s("'a b' \"c\\td\""), Some(words(&["a b", "c\td"])));
        assert_eq!(s("a\\_b"), Some(words(&["a", "b"])));
        assert_eq!(s("\"a\\_b\""), Some(words(&["a b"])));
        assert_eq!(s("a #comment b"), Some(words(&["a"])));
        assert_eq!(s("a#b"), Some(words(&["a#b"])));
        assert_eq!(s("a \\c b"), Some(words(&["a"])));
        assert_eq!(s("''"), Some(words(&[""])));
        assert_eq!(s("'a\\nb'"), Some(words(&["a\\nb"])));
        assert_eq!(s("'unclosed"), None);
        assert_eq!(s("a\\qb"), None);
        assert_eq!(s("$HOME"), None);
        assert_eq!(s("'$HOME'"), Some(words(&["$HOME"])));
    }

    #[test]
    fn elf_interpreter_of_a_real_binary() {
        let head = std::fs::read("/bin/sh").unwrap_or_default();
        let head = &head[..head.len().min(4096)];
        // Every dynamically linked system binary names a loader.
        if let Some(i) = elf_interpreter(head) {
            assert!(is_loader_name(&i), "{}", i.display());
        }
        assert_eq!(elf_interpreter(b"#!/bin/sh\n"), None);
        assert_eq!(elf_interpreter(&[0x7f, b'E', b'L', b'F', 2, 1, 0, 0]), None);
    }

    #[test]
    fn loader_names() {
        for yes in [
            "/lib64/ld-linux-x86-64.so.2",
            "/lib/ld-linux-aarch64.so.1",
            "/lib/ld-musl-x86_64.so.1",
            "/lib/ld-2.31.so",
            "/lib64/ld64.so.2",
        ] {
            assert!(is_loader_name(Path::new(yes)), "{yes}");
        }
        for no in [
            "/bin/bash",
            "/",
            "/lib/libc.so.6",
            "/usr/bin/ld",
            "/usr/bin/ld-x",
        ] {
            assert!(!is_loader_name(Path::new(no)), "{no}");
        }
        assert!(in_system_roots(Path::new("/usr/lib/ld-linux.so.2")));
        assert!(!in_system_roots(Path::new("/tmp/usr/lib/ld-linux.so.2")));
        assert!(!in_system_roots(Path::new("/usrx/ld-linux.so.2")));
    }
}
