//! Prints each crate's module graph (`module -> what it uses`), the one
//! tests/tests/layers.rs checks: `cargo run -p subagentd-e2e --bin
//! module-graph`.

use std::path::Path;
use subagentd_e2e::modgraph::{crate_roots, show, Graph};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for root in crate_roots(&ws)? {
        println!("# {}", root.display());
        let g = Graph::read(&root).map_err(|e| e.to_string())?;
        for (from, to) in &g.edges {
            let to: Vec<String> = to.iter().map(|m| show(m)).collect();
            println!("{} -> {}", show(from), to.join(", "));
        }
    }
    Ok(())
}
