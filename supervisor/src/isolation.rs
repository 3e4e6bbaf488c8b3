//! The isolation report's rows: each mechanism by name with its mark, in
//! the order result.md and `subagentd --check` list them. Uses only the
//! runner's report type; both renderers sit above it.

use subagent_runner::sandbox::report::{Enforcement, IsolationReport};

/// One mechanism of an isolation report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row<'a> {
    /// The mechanism's name (`landlock`, `seccomp`, ...).
    pub name: &'static str,
    /// Whether it held for the run, and what exactly.
    pub state: &'a Enforcement,
}

impl Row<'_> {
    /// `enforced` or `NOT enforced`.
    pub fn mark(&self) -> &'static str {
        if self.state.enforced {
            "enforced"
        } else {
            "NOT enforced"
        }
    }
}

/// The report's mechanisms, in display order.
pub fn rows(iso: &IsolationReport) -> [Row<'_>; 8] {
    let row = |name, state| Row { name, state };
    [
        row("landlock", &iso.landlock),
        row("seccomp", &iso.seccomp),
        row("network", &iso.network),
        row("cgroup", &iso.cgroup),
        row("capabilities", &iso.capabilities),
        row("namespaces", &iso.namespaces),
        row("root", &iso.root),
        row("disk", &iso.disk),
    ]
}
