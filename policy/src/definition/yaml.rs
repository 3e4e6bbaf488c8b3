//! YAML a child may have written, read with bounded work: anchors are
//! refused, so no alias can repeat a subtree (no published definition
//! uses either; an alias to nothing stays a syntax error, as a value such
//! as `*bold*` is), and the nodes, the nesting and the scalar bytes are
//! capped, so what is built is at most linear in the text, which the
//! caller caps first.

use serde_json::Value;
use serde_saphyr::budget::{Budget, BudgetBreach};
use serde_saphyr::{DuplicateKeyPolicy, MergeKeyPolicy, Options};

/// The most nodes (scalars, sequences, mappings) one text may hold.
pub const NODES_MAX: usize = 20_000;
/// The deepest nesting of sequences and mappings.
pub const DEPTH_MAX: usize = 32;
/// The most bytes of scalar text.
pub const SCALAR_BYTES_MAX: usize = 1 << 20;

/// Why a text was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum YamlError {
    /// Past a bound (an alias, too many nodes, too deep): the text is
    /// refused whole, never read another way.
    #[error("{message}")]
    Refused {
        line: Option<usize>,
        message: String,
    },
    /// Not YAML; `line` counts from the text's first line (1).
    #[error("{message}")]
    Invalid {
        line: Option<usize>,
        message: String,
    },
}

impl YamlError {
    /// The line of the text at fault, from 1, when known.
    pub fn line(&self) -> Option<usize> {
        match self {
            YamlError::Refused { line, .. } | YamlError::Invalid { line, .. } => *line,
        }
    }
}

/// The parser's settings: YAML 1.2 booleans only, `<<` an ordinary key, a
/// key given twice an error (the lenient reading then keeps the first).
fn options() -> Options {
    let mut budget = Budget::default();
    budget.max_anchors = 0;
    budget.max_nodes = NODES_MAX;
    budget.max_depth = DEPTH_MAX;
    budget.max_events = 4 * NODES_MAX;
    budget.max_documents = 1;
    budget.max_total_scalar_bytes = SCALAR_BYTES_MAX;
    budget.max_merge_keys = 0;
    let mut o = Options::default();
    o.budget = Some(budget);
    o.alias_limits.max_total_replayed_events = 0;
    o.alias_limits.max_alias_expansions_per_anchor = 0;
    o.duplicate_keys = DuplicateKeyPolicy::Error;
    o.merge_keys = MergeKeyPolicy::AsOrdinary;
    o.strict_booleans = true;
    o.with_snippet = false;
    o
}

/// What a breached budget says.
fn breach_message(b: &BudgetBreach) -> String {
    match b {
        BudgetBreach::Aliases { .. } | BudgetBreach::Anchors { .. } => {
            "YAML anchors and aliases (`&name`, `*name`) are refused".to_owned()
        }
        BudgetBreach::Nodes { .. } | BudgetBreach::Events { .. } => {
            format!("more than {NODES_MAX} YAML nodes")
        }
        BudgetBreach::Depth { .. } => format!("YAML nested deeper than {DEPTH_MAX}"),
        BudgetBreach::ScalarBytes { .. } => {
            format!("more than {SCALAR_BYTES_MAX} bytes of YAML text")
        }
        other => format!("over a YAML parsing bound ({other:?})"),
    }
}

/// The message of `e`, without its position (given apart).
fn message(e: &serde_saphyr::Error) -> String {
    let s = e.to_string();
    let s = s.split(" at line ").next().unwrap_or(&s);
    // A hint to the caller's programmer, not to the file's author.
    let s = s.split(", set DuplicateKeyPolicy").next().unwrap_or(s);
    s.lines().next().unwrap_or(s).trim().to_owned()
}

/// The value `text` holds (null for an empty text).
pub fn parse(text: &str) -> Result<Value, YamlError> {
    serde_saphyr::from_str_with_options::<Value>(text, options()).map_err(|e| {
        let line = e
            .location()
            .map(|l| l.line())
            .filter(|&l| l > 0)
            .and_then(|l| usize::try_from(l).ok());
        match e.without_snippet() {
            serde_saphyr::Error::Budget { breach, .. } => YamlError::Refused {
                line,
                message: breach_message(breach),
            },
            serde_saphyr::Error::AliasReplayLimitExceeded { .. }
            | serde_saphyr::Error::AliasExpansionLimitExceeded { .. }
            | serde_saphyr::Error::AliasReplayStackDepthExceeded { .. } => YamlError::Refused {
                line,
                message: breach_message(&BudgetBreach::Aliases { aliases: 1 }),
            },
            _ => YamlError::Invalid {
                line,
                message: message(&e),
            },
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(text: &str) -> String {
        match parse(text) {
            Err(YamlError::Refused { message, .. }) => message,
            other => panic!("{text:?}: {other:?}"),
        }
    }

    #[test]
    fn plain_yaml_is_read_as_yaml_1_2() {
        let v = parse("a: 1\nb: [x, \"y\"]\nc: yes\nd: true\ne:\n<<: m\n").unwrap();
        assert_eq!(
            v,
            serde_json::json!({"a": 1, "b": ["x", "y"], "c": "yes", "d": true, "e": null, "<<": "m"})
        );
        assert_eq!(parse("").unwrap(), Value::Null);
    }

    #[test]
    fn an_anchor_is_refused_even_a_single_one() {
        assert!(refused("x: &x a\ny: *x\n").contains("aliases"));
        assert!(refused("x: &x [a]\ny: {<<: *x}\n").contains("aliases"));
        assert!(refused("x: &x a\n").contains("anchors"));
        // An alias to nothing builds nothing: a syntax error as before.
        assert!(matches!(
            parse("d: *bold*\n"),
            Err(YamlError::Invalid { .. })
        ));
    }

    #[test]
    fn an_alias_bomb_is_refused_quickly() {
        let mut text = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        for (prev, name) in ["a", "b", "c", "d", "e", "f", "g", "h", "i"]
            .iter()
            .zip(["b", "c", "d", "e", "f", "g", "h", "i", "j"])
        {
            let refs = vec![format!("*{prev}"); 10].join(", ");
            text.push_str(&format!("{name}: &{name} [{refs}]\n"));
        }
        let started = std::time::Instant::now();
        assert!(refused(&text).contains("aliases"));
        // Liveness: expanded, this is 10^10 nodes.
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
    }

    #[test]
    fn nodes_and_nesting_are_capped() {
        let many = format!("a: [{}]\n", vec!["x"; NODES_MAX + 1].join(","));
        assert!(refused(&many).contains("nodes"), "{}", refused(&many));
        let deep = format!(
            "a: {}{}\n",
            "[".repeat(DEPTH_MAX + 1),
            "]".repeat(DEPTH_MAX + 1)
        );
        let why = refused(&deep);
        assert!(why.contains("deeper") || why.contains("nodes"), "{why}");
        let ok = format!("a: [{}]\n", vec!["x"; 1000].join(","));
        assert!(parse(&ok).is_ok());
    }

    #[test]
    fn a_syntax_error_names_its_line() {
        match parse("a: 1\nb: [unclosed\n") {
            Err(YamlError::Invalid { line, message }) => {
                assert!(line.is_some_and(|l| l >= 2), "{line:?}");
                assert!(!message.is_empty());
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse("a: 1\na: 2\n"),
            Err(YamlError::Invalid { .. })
        ));
    }
}
