//! The crates' module layering: no module cycle in supervisor,
//! child-runner or policy, and no production file over 700 lines. The
//! layer order is docs/architecture.md's module map.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use subagentd_e2e::modgraph::{production_lines, show, Graph};

/// The largest production file (test modules not counted).
const MAX_LINES: usize = 700;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every crate root the workspace ships: libraries and binaries.
fn roots() -> Vec<PathBuf> {
    let ws = workspace();
    let mut out = vec![
        ws.join("policy/src/lib.rs"),
        ws.join("supervisor/src/lib.rs"),
        ws.join("child-runner/src/lib.rs"),
        ws.join("child-runner/src/main.rs"),
    ];
    for bin in std::fs::read_dir(ws.join("supervisor/src/bin")).unwrap() {
        out.push(bin.unwrap().path());
    }
    out
}

fn graph(root: &Path) -> Graph {
    Graph::read(root).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn no_module_cycle_in_any_crate() {
    let mut found = Vec::new();
    for root in roots() {
        let g = graph(&root);
        for cycle in g.cycles() {
            let example = g.example_cycle(&cycle[0], &cycle);
            let names: Vec<String> = cycle.iter().map(|m| show(m)).collect();
            let path: Vec<String> = example.iter().map(|m| show(m)).collect();
            found.push(format!(
                "{}: {} modules in a cycle: {}\n  e.g. {}",
                root.display(),
                cycle.len(),
                names.join(", "),
                path.join(" -> ")
            ));
        }
    }
    assert!(found.is_empty(), "module cycles:\n{}", found.join("\n"));
}

#[test]
fn no_production_file_over_the_limit() {
    let mut over = Vec::new();
    for root in roots() {
        for (_, file) in graph(&root).modules() {
            let n = production_lines(file).unwrap_or_else(|e| panic!("{e}"));
            if n > MAX_LINES {
                over.push(format!("{}: {n} lines", file.display()));
            }
        }
    }
    over.sort();
    over.dedup();
    assert!(
        over.is_empty(),
        "files over {MAX_LINES} lines without tests:\n{}",
        over.join("\n")
    );
}

/// Prints each crate's module edges (`cargo test --test layers -- --ignored --nocapture`).
#[test]
#[ignore = "prints the module graph; not a check"]
fn print_module_graph() {
    for root in roots() {
        println!("# {}", root.display());
        for (from, to) in &graph(&root).edges {
            let to: Vec<String> = to.iter().map(|m| show(m)).collect();
            println!("{} -> {}", show(from), to.join(", "));
        }
    }
}
