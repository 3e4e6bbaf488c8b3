//! A definition's front matter, read as leniently as Claude Code reads it:
//! strict YAML first; where that fails, each top-level `key: value` entry
//! on its own, and an entry that is still not YAML (an unquoted `: `, a
//! value starting with `*` or `@`) as the text after its key. Every such
//! step is a warning naming the file line. What [`yaml`] refuses (an
//! alias, too many nodes) refuses the file: it is never read another way.

use super::error::DefinitionError;
use super::yaml::{self, YamlError};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// The front matter's fields and the body after it.
pub(super) struct FrontMatter {
    /// The fields (of a key given twice, the first).
    pub map: Map<String, Value>,
    /// The file line of each top-level key.
    pub lines: BTreeMap<String, usize>,
    pub body: String,
    /// What the lenient reading had to do, as `file:line: ...`.
    pub warnings: Vec<String>,
    /// Warnings past the cap, counted and not made.
    pub untold: usize,
}

/// The longest front matter read, in bytes: past it the file is an error.
pub const FRONT_MAX: usize = 64 << 10;
/// The most top-level entries a front matter may hold.
pub const KEYS_MAX: usize = 100;
/// The most warnings kept for one file; one more says how many followed.
pub const WARNINGS_MAX: usize = 20;

/// The name a front matter gives on a `name:` line, read plainly: the name
/// a file that cannot be used blocks.
fn name_line(lines: &[String]) -> Option<String> {
    let line = lines
        .iter()
        .find(|l| top_key(l).as_deref() == Some("name"))?;
    let value = line.split_once(':').map_or("", |(_, v)| v).trim();
    Some(unquote(value).trim().to_owned()).filter(|n| !n.is_empty())
}

/// An error for the front matter as a whole, naming the name it gives.
fn refused(file: &Path, lines: &[String], message: String) -> DefinitionError {
    refused_at(file, 1, lines, message)
}

/// An error for the front matter as a whole, on file line `line`.
fn refused_at(file: &Path, line: usize, lines: &[String], message: String) -> DefinitionError {
    let mut e = DefinitionError::new(file, line, None, message);
    e.name = name_line(lines);
    e
}

/// Keeps the first [`WARNINGS_MAX`] warnings and says how many more there
/// were (`untold` of them never made).
pub(super) fn cap_warnings(warnings: &mut Vec<String>, untold: usize) {
    if warnings.len() + untold > WARNINGS_MAX {
        let more = warnings.len() + untold - WARNINGS_MAX.min(warnings.len());
        warnings.truncate(WARNINGS_MAX);
        warnings.push(format!("… and {more} more warnings"));
    }
}

/// The text between the `---` lines (which begins on file line 2), and
/// the body after them.
fn split(file: &Path, text: &str) -> Result<(Vec<String>, String), DefinitionError> {
    let fail = |message: &str| DefinitionError::new(file, 1, None, message);
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    if lines.next().map(str::trim_end) != Some("---") {
        return Err(fail(
            "expected YAML front matter opening with --- on line 1",
        ));
    }
    let mut front = Vec::new();
    let mut consumed = text.find('\n').map_or(text.len(), |i| i + 1);
    let start = consumed;
    for l in lines {
        consumed += l.len();
        if l.trim_end() == "---" {
            let body = text[consumed.min(text.len())..].trim().to_owned();
            return Ok((front, body));
        }
        if consumed - start > FRONT_MAX {
            let why = format!("the front matter is over the limit of {FRONT_MAX} bytes");
            return Err(refused(file, &front, why));
        }
        front.push(l.to_owned());
    }
    Err(fail("the front matter is not closed with ---"))
}

/// Splits the text at its `---` lines and reads the fields.
pub(super) fn read(file: &Path, text: &str) -> Result<FrontMatter, DefinitionError> {
    let (lines, body) = split(file, text)?;
    let (entries, stray) = entries(&lines);
    if entries.len() > KEYS_MAX {
        let why = format!("the front matter has more than {KEYS_MAX} fields");
        return Err(refused(file, &lines, why));
    }
    match yaml::parse(&lines.concat()) {
        Ok(v @ (Value::Object(_) | Value::Null)) => Ok(FrontMatter {
            map: match v {
                Value::Object(m) => m,
                _ => Map::new(),
            },
            lines: entries
                .iter()
                .rev()
                .map(|e| (e.key.clone(), e.line))
                .collect(),
            body,
            warnings: Vec::new(),
            untold: 0,
        }),
        Ok(_) => lenient(
            file,
            (entries, &stray, &lines),
            (2, "not a mapping of fields".into()),
            body,
        ),
        Err(YamlError::Refused { line, message }) => {
            let line = line.map_or(1, |l| l + 1);
            Err(refused_at(file, line, &lines, message))
        }
        Err(e) => {
            // The text's lines count from the file's second.
            let line = e.line().map_or(2, |l| l + 1);
            let why = e.to_string();
            lenient(file, (entries, &stray, &lines), (line, why), body)
        }
    }
}

/// One top-level entry: its key line and the indented lines after it.
struct Entry {
    key: String,
    /// Its file line.
    line: usize,
    /// The key line and its continuation lines.
    text: String,
}

/// The key of a top-level `key: value` line.
fn top_key(line: &str) -> Option<String> {
    if line.starts_with(char::is_whitespace) || line.starts_with(['#', '-']) {
        return None;
    }
    let colon = line
        .char_indices()
        .find(|&(i, c)| c == ':' && line[i + 1..].chars().next().is_none_or(char::is_whitespace))
        .map(|(i, _)| i)?;
    let key = line[..colon].trim();
    let key = key
        .strip_prefix('"')
        .and_then(|k| k.strip_suffix('"'))
        .or_else(|| key.strip_prefix('\'').and_then(|k| k.strip_suffix('\'')))
        .unwrap_or(key);
    let mut chars = key.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    (first_ok && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        .then(|| key.to_owned())
}

/// The entries of the front matter, and the file lines that belong to
/// none (text at the margin that is no `key:` line).
fn entries(lines: &[String]) -> (Vec<Entry>, Vec<usize>) {
    let mut out: Vec<Entry> = Vec::new();
    let mut stray = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let line = i + 2;
        if let Some(key) = top_key(l) {
            out.push(Entry {
                key,
                line,
                text: l.clone(),
            });
            continue;
        }
        let blank = l.trim().is_empty() || l.trim_start().starts_with('#');
        let continues = blank || l.starts_with(char::is_whitespace) || l.starts_with('-');
        match out.last_mut() {
            Some(e) if continues => e.text.push_str(l),
            _ if blank => {}
            _ => stray.push(line),
        }
    }
    (out, stray)
}

/// An entry that is not YAML, as written: a list of its `- item` lines,
/// else the text after the key with its continuation lines joined by a
/// space (as YAML folds a plain scalar), without enclosing quotes.
fn as_written(e: &Entry) -> Value {
    let mut lines = e.text.lines();
    let first = lines.next().unwrap_or_default();
    let value = first.split_once(':').map_or("", |(_, v)| v).trim();
    let rest: Vec<&str> = lines
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    if value.is_empty() && !rest.is_empty() && rest.iter().all(|l| l.starts_with('-')) {
        let items = rest
            .iter()
            .map(|l| Value::String(unquote(l.trim_start_matches('-').trim()).to_owned()))
            .collect();
        return Value::Array(items);
    }
    let joined = std::iter::once(value)
        .chain(rest)
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    Value::String(unquote(&joined).to_owned())
}

fn unquote(s: &str) -> &str {
    for q in ['"', '\''] {
        if let Some(inner) = s.strip_prefix(q).and_then(|s| s.strip_suffix(q)) {
            return inner;
        }
    }
    s
}

/// Reads each entry on its own, after the whole front matter failed as
/// YAML (`why`: the file line and the reason); an entry past a bound
/// refuses the file. `text`: the entries, the stray lines, all lines.
fn lenient(
    file: &Path,
    text: (Vec<Entry>, &[usize], &[String]),
    why: (usize, String),
    body: String,
) -> Result<FrontMatter, DefinitionError> {
    let (entries, stray, lines) = text;
    let shown = file.display();
    let mut fm = FrontMatter {
        map: Map::new(),
        lines: BTreeMap::new(),
        body,
        warnings: Vec::new(),
        untold: 0,
    };
    for e in entries {
        if let Some(first) = fm.lines.get(&e.key) {
            fm.warnings.push(format!(
                "{shown}:{}: `{}` is given again; the first (line {first}) is used",
                e.line, e.key
            ));
            continue;
        }
        let value = match yaml::parse(&e.text) {
            Ok(Value::Object(m)) if m.len() == 1 => m.into_iter().next().map(|(_, v)| v),
            Err(YamlError::Refused { message, .. }) => {
                return Err(refused_at(file, e.line, lines, message));
            }
            other => {
                let why = other
                    .err()
                    .map_or("not one field".into(), |err| err.to_string());
                fm.warnings.push(format!(
                    "{shown}:{}: `{}` is not valid YAML ({why}); read as written",
                    e.line, e.key
                ));
                None
            }
        };
        let value = value.unwrap_or_else(|| as_written(&e));
        fm.map.insert(e.key.clone(), value);
        fm.lines.insert(e.key, e.line);
    }
    // Only those kept are made (a front matter may be all stray lines).
    for line in stray.iter().take(WARNINGS_MAX + 1) {
        fm.warnings
            .push(format!("{shown}:{line}: not a `key: value` line; ignored"));
    }
    fm.untold = stray.len().saturating_sub(WARNINGS_MAX + 1);
    if fm.warnings.is_empty() {
        fm.warnings.push(format!(
            "{shown}:{}: the front matter is not valid YAML ({}); its fields were read one by one",
            why.0, why.1
        ));
    }
    Ok(fm)
}
