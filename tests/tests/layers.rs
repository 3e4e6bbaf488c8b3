//! The crates' module layering: no module cycle in supervisor,
//! child-runner or policy, and no production file over 700 lines. The
//! layer order is docs/architecture.md's module map. `cargo run -p
//! subagentd-e2e --bin module-graph` prints the graph.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use subagentd_e2e::modgraph::{crate_roots, production_lines, show, Graph};

/// The largest production file (test modules not counted).
const MAX_LINES: usize = 700;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every crate root the workspace ships: libraries and binaries.
fn roots() -> Vec<PathBuf> {
    crate_roots(&workspace()).unwrap()
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

/// The supervisor's layers, bottom first (docs/architecture.md, "Modules
/// and their layers"): a module may use its own layer and those below it,
/// never one above. A module is placed by the longest entry naming it or
/// one of its parents.
const SUPERVISOR_LAYERS: &[(&str, &[&str])] = &[
    (
        "foundation",
        &[
            "timefmt",
            "ids",
            "securedir",
            "lockfile",
            "runas",
            "rights",
            "runlog",
            "runservice",
            "sanitize",
            "isolation",
        ],
    ),
    (
        "host",
        &[
            "gitsnap",
            "observe",
            "paths",
            "runnerpath",
            "uids",
            "trust",
            "agents",
            "sessions",
            "livesample",
            "slurm",
        ],
    ),
    ("run model", &["run"]),
    ("run services", &["egress", "gateway", "metrics"]),
    (
        "protocol",
        &[
            "protocol",
            "paging",
            "status",
            "usage",
            "result_md",
            "store",
        ],
    ),
    (
        "engine parts",
        &[
            "engine::config",
            "engine::error",
            "engine::pidfd",
            "engine::probe",
            "engine::spawn",
            "engine::instructions",
            "engine::state",
            "engine::program",
            "engine::draft",
            "engine::worktree",
            "engine::drivers",
            "engine::jobs",
            "engine::services",
        ],
    ),
    (
        "engine phases",
        &[
            "engine::accept",
            "engine::launch",
            "engine::finish",
            "engine::recover",
            "engine::prune",
            "engine::slurm",
            "engine::sample",
        ],
    ),
    ("engine", &["engine"]),
    (
        "front ends",
        &["server", "client", "view", "mcp", "cli", "selfcheck"],
    ),
];

/// The layer of `m`, by the longest entry that is `m` or a parent of it.
fn layer_of(m: &[String]) -> Option<(usize, &'static str)> {
    let mut best: Option<(usize, usize, &str)> = None;
    for (i, (name, entries)) in SUPERVISOR_LAYERS.iter().enumerate() {
        for e in *entries {
            let parts: Vec<&str> = e.split("::").collect();
            let hit = m.len() >= parts.len() && m.iter().zip(&parts).all(|(a, b)| a == b);
            if hit && best.is_none_or(|(len, _, _)| parts.len() > len) {
                best = Some((parts.len(), i, name));
            }
        }
    }
    best.map(|(_, i, name)| (i, name))
}

#[test]
fn the_supervisor_uses_only_its_own_layer_and_those_below() {
    let g = graph(&workspace().join("supervisor/src/lib.rs"));
    let mut wrong = Vec::new();
    for (m, _) in g.modules() {
        if !m.is_empty() && layer_of(m).is_none() {
            wrong.push(format!("{} is on no layer: add it to the map", show(m)));
        }
    }
    for (from, tos) in &g.edges {
        let Some((lf, nf)) = layer_of(from) else {
            continue;
        };
        for to in tos {
            if let Some((lt, nt)) = layer_of(to) {
                if lt > lf {
                    wrong.push(format!(
                        "{} ({nf}) uses {} ({nt}), a layer above",
                        show(from),
                        show(to)
                    ));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the layers are broken:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_layer_check_sees_an_upward_use() {
    // The check itself: the run model naming the engine would be caught.
    let from = vec!["run".to_owned(), "record".to_owned()];
    let to = vec!["engine".to_owned(), "state".to_owned()];
    let (lf, _) = layer_of(&from).unwrap();
    let (lt, _) = layer_of(&to).unwrap();
    assert!(lt > lf);
    assert_eq!(layer_of(&["engine".to_owned()]).unwrap().1, "engine");
    assert_eq!(
        layer_of(&["engine".to_owned(), "accept".to_owned(), "plan".to_owned()])
            .unwrap()
            .1,
        "engine phases"
    );
}

#[test]
fn the_graph_finds_a_cycle_and_follows_re_exports() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    let write = |name: &str, text: &str| {
        let p = src.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write("lib.rs", "pub mod a;\npub mod b;\npub mod c;\npub mod d;\n");
    // a and b use each other; c reaches a's item through d's re-export.
    write(
        "a.rs",
        "use crate::b::Bee;\npub struct Ay;\npub(super) fn f(_: Bee) {}\n",
    );
    write("b.rs", "pub struct Bee(pub crate::a::Ay);\n");
    write("d.rs", "pub use crate::a::Ay;\n");
    write(
        "c.rs",
        "pub fn g(_: crate::d::Ay) {}\n#[cfg(test)]\nmod tests { use crate::b::Bee; }\n",
    );
    let g = Graph::read(&src.join("lib.rs")).unwrap();
    let m = |s: &str| vec![s.to_owned()];
    let cycles = g.cycles();
    assert_eq!(cycles.len(), 1, "{cycles:?}");
    let mut found = cycles[0].clone();
    found.sort();
    assert_eq!(found, vec![m("a"), m("b")]);
    let c_uses = &g.edges[&m("c")];
    assert!(
        c_uses.contains(&m("a")),
        "a re-export is followed to its item: {c_uses:?}"
    );
    assert!(
        !c_uses.contains(&m("b")),
        "test code is left out: {c_uses:?}"
    );
    assert!(!c_uses.contains(&m("d")), "{c_uses:?}");
    assert!(
        !g.edges[&m("a")].contains(&Vec::new()),
        "a visibility is no use of the root"
    );
}
