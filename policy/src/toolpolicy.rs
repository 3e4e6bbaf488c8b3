//! The tool policy: the catalog (built-in plus the operator's tools), the
//! tools each audience may hold, and the filter that gives a child exactly
//! the tools its parent may delegate.

use crate::audience::Audience;
use crate::tools::NEVER_DELEGATED;
use crate::tools::{builtin, covers, is_mcp_pattern, is_mcp_tool, mcp_tool, Capability, Tool};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

/// A tool request that cannot be honoured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    /// Names that are not in the catalog.
    #[error("{field}: unknown tools: {}", names.join(", "))]
    Unknown {
        /// Where they were named (`session.tools`, a definition, the config).
        field: String,
        /// The unknown names, sorted.
        names: Vec<String>,
    },
    /// A tool name given twice in the catalog.
    #[error("tool {0:?} is defined twice")]
    Duplicate(String),
}

/// The catalog and the audiences' tool sets.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolPolicy {
    catalog: Vec<Tool>,
    audiences: BTreeMap<Audience, BTreeSet<String>>,
}

/// The tools Public sessions may hold by default: reading and searching,
/// no writes, no programs, no delegation.
pub const PUBLIC_DEFAULT: &[&str] = &[
    "file_read",
    "glob",
    "grep",
    "web_search",
    "memory_search",
    "todo_write",
];

impl ToolPolicy {
    /// A hash of the catalog's names: what resolving a definition's tool
    /// entries depends on.
    pub fn catalog_hash(&self) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        for t in &self.catalog {
            h.update(t.name.as_bytes());
            h.update([0]);
        }
        h.finalize().into()
    }

    /// The built-in catalog plus `extra` tools; audiences from `overrides`
    /// where given (names, and MCP patterns such as `mcp__github`), else
    /// the defaults: personal and team hold every tool, MCP tools too,
    /// public holds [`PUBLIC_DEFAULT`].
    pub fn new(
        extra: &[Tool],
        overrides: &BTreeMap<Audience, Vec<String>>,
    ) -> Result<ToolPolicy, ToolError> {
        let mut catalog = builtin();
        for t in extra {
            if catalog.iter().any(|c| c.name == t.name) {
                return Err(ToolError::Duplicate(t.name.clone()));
            }
            catalog.push(t.clone());
        }
        let mut all: BTreeSet<String> = catalog.iter().map(|t| t.name.clone()).collect();
        all.insert("mcp__*".to_owned());
        let mut policy = ToolPolicy {
            catalog,
            audiences: BTreeMap::new(),
        };
        for a in [Audience::Personal, Audience::Team, Audience::Public] {
            let set = match overrides.get(&a) {
                Some(names) => {
                    let field = format!("audiences.{}.tools", a.as_str());
                    let concrete: Vec<String> = names
                        .iter()
                        .filter(|n| !is_mcp_pattern(n))
                        .cloned()
                        .collect();
                    policy.check_known(&concrete, &field)?;
                    names.iter().cloned().collect()
                }
                None if a == Audience::Public => {
                    PUBLIC_DEFAULT.iter().map(|s| (*s).to_owned()).collect()
                }
                None => all.clone(),
            };
            policy.audiences.insert(a, set);
        }
        Ok(policy)
    }

    /// The built-in policy.
    pub fn builtin() -> ToolPolicy {
        ToolPolicy::new(&[], &BTreeMap::new()).unwrap_or_else(|_| ToolPolicy {
            catalog: builtin(),
            audiences: BTreeMap::new(),
        })
    }

    /// The catalog, in its fixed order.
    pub fn catalog(&self) -> &[Tool] {
        &self.catalog
    }

    /// A tool by name: one of the catalog, or an MCP tool
    /// (`mcp__<server>__<tool>`).
    pub fn tool(&self, name: &str) -> Option<Cow<'_, Tool>> {
        match self.catalog.iter().find(|t| t.name == name) {
            Some(t) => Some(Cow::Borrowed(t)),
            None if is_mcp_tool(name) => Some(Cow::Owned(mcp_tool(name))),
            None => None,
        }
    }

    /// The tools (and MCP patterns) `audience` may hold.
    pub fn audience_tools(&self, audience: Audience) -> Vec<String> {
        self.audiences
            .get(&audience)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Fails, naming them, when any of `names` is not in the catalog.
    pub fn check_known(&self, names: &[String], field: &str) -> Result<(), ToolError> {
        let mut unknown: Vec<String> = names
            .iter()
            .filter(|n| self.tool(n).is_none())
            .cloned()
            .collect();
        unknown.sort();
        unknown.dedup();
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(ToolError::Unknown {
                field: field.to_owned(),
                names: unknown,
            })
        }
    }

    /// The child's tools: the parent's ∩ the audience's ∩ the definition's
    /// (when it lists any), minus every delegate or attach tool, in
    /// catalog order. An unknown name of the parent's is an error; nothing
    /// it holds is dropped silently.
    pub fn child_tools(
        &self,
        audience: Audience,
        parent: &[String],
        definition: Option<&[String]>,
    ) -> Result<Vec<String>, ToolError> {
        self.child_tools_narrowed(audience, parent, definition, &[])
    }

    /// [`ToolPolicy::child_tools`], minus what `deny` covers. The catalog's
    /// tools come first, in catalog order, then the MCP tools, sorted. A
    /// definition's entries (`allow`, `deny`: names or MCP patterns) were
    /// resolved when it was read; one that names nothing covers nothing.
    pub fn child_tools_narrowed(
        &self,
        audience: Audience,
        parent: &[String],
        allow: Option<&[String]>,
        deny: &[String],
    ) -> Result<Vec<String>, ToolError> {
        self.check_known(parent, "session.tools")?;
        let allowed = self.audiences.get(&audience);
        let keep = |name: &str, class: Capability| {
            parent.iter().any(|p| p == name)
                && allowed.is_some_and(|a| a.iter().any(|e| covers(e, name)))
                && allow.is_none_or(|d| d.iter().any(|e| covers(e, name)))
                && !deny.iter().any(|e| covers(e, name))
                && class.delegable()
                && !NEVER_DELEGATED.contains(&name)
        };
        let mut mcp: Vec<String> = parent
            .iter()
            .filter(|n| self.catalog.iter().all(|t| &t.name != *n) && is_mcp_tool(n))
            .filter(|n| keep(n, Capability::Mcp))
            .cloned()
            .collect();
        mcp.sort();
        mcp.dedup();
        Ok(self
            .catalog
            .iter()
            .filter(|t| keep(&t.name, t.class))
            .map(|t| t.name.clone())
            .chain(mcp)
            .collect())
    }

    /// The capability classes `tools` hold.
    pub fn classes(&self, tools: &[String]) -> BTreeSet<Capability> {
        tools
            .iter()
            .filter_map(|n| self.tool(n))
            .map(|t| t.class)
            .collect()
    }

    /// tools.json: the schemas of exactly `tools`, sorted by name, as
    /// canonical JSON (sorted keys, no whitespace).
    pub fn tools_json(&self, tools: &[String]) -> String {
        let mut chosen: Vec<Cow<'_, Tool>> = tools.iter().filter_map(|n| self.tool(n)).collect();
        chosen.sort_by(|a, b| a.name.cmp(&b.name));
        let value = serde_json::to_value(&chosen).unwrap_or_default();
        // serde_json's Map is a BTreeMap here: keys come out sorted.
        serde_json::to_string(&value).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_child_never_gets_delegation_or_attach() {
        let p = ToolPolicy::builtin();
        let parent = names(&[
            "file_read",
            "file_write",
            "shell",
            "web_fetch",
            "spawn_agent",
            "attach_file",
            "check_agent_run",
        ]);
        let child = p.child_tools(Audience::Personal, &parent, None).unwrap();
        assert_eq!(
            child,
            names(&["file_read", "file_write", "shell", "web_fetch"])
        );
    }

    #[test]
    fn definitions_and_audiences_narrow() {
        let p = ToolPolicy::builtin();
        let parent = names(&["file_read", "file_write", "shell", "web_fetch"]);
        let def = names(&["file_read", "grep"]);
        assert_eq!(
            p.child_tools(Audience::Team, &parent, Some(&def)).unwrap(),
            names(&["file_read"])
        );
        assert_eq!(
            p.child_tools(Audience::Public, &parent, None).unwrap(),
            names(&["file_read"])
        );
    }

    #[test]
    fn unknown_names_are_errors_that_name_them() {
        let p = ToolPolicy::builtin();
        let e = p
            .child_tools(
                Audience::Team,
                &names(&["file_read", "teleport", "blink"]),
                None,
            )
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "session.tools: unknown tools: blink, teleport"
        );
        // A definition's entry that names nothing (it was warned about
        // when the definition was read) covers nothing.
        assert_eq!(
            p.child_tools(Audience::Team, &names(&["file_read"]), Some(&names(&["x"])))
                .unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn mcp_tools_pass_by_name_or_server_and_deny_subtracts() {
        let p = ToolPolicy::builtin();
        let parent = names(&[
            "mcp__github__create_issue",
            "file_read",
            "mcp__ctx__docs",
            "shell",
            "mcp__github__list",
        ]);
        let all = p.child_tools(Audience::Team, &parent, None).unwrap();
        assert_eq!(
            all,
            names(&[
                "file_read",
                "shell",
                "mcp__ctx__docs",
                "mcp__github__create_issue",
                "mcp__github__list"
            ])
        );
        assert_eq!(
            p.classes(&names(&["mcp__ctx__docs"])),
            BTreeSet::from([Capability::Mcp])
        );
        let allow = names(&["mcp__github", "file_read", "shell"]);
        let deny = names(&["shell", "mcp__github__list"]);
        assert_eq!(
            p.child_tools_narrowed(Audience::Team, &parent, Some(&allow), &deny)
                .unwrap(),
            names(&["file_read", "mcp__github__create_issue"])
        );
        assert_eq!(
            p.child_tools_narrowed(Audience::Team, &parent, None, &names(&["mcp__*"]))
                .unwrap(),
            names(&["file_read", "shell"])
        );
        assert_eq!(
            p.child_tools(Audience::Public, &parent, None).unwrap(),
            names(&["file_read"]),
            "public sessions hold no MCP tool by default"
        );
        let e = p
            .child_tools(Audience::Team, &names(&["mcp__github__*"]), None)
            .unwrap_err();
        assert!(
            matches!(e, ToolError::Unknown { .. }),
            "a parent names tools, not patterns"
        );
        let over = BTreeMap::from([(Audience::Team, names(&["file_read", "mcp__ctx"]))]);
        let p = ToolPolicy::new(&[], &over).unwrap();
        assert_eq!(
            p.child_tools(Audience::Team, &parent, None).unwrap(),
            names(&["file_read", "mcp__ctx__docs"])
        );
        let j: serde_json::Value =
            serde_json::from_str(&p.tools_json(&names(&["mcp__ctx__docs"]))).unwrap();
        assert_eq!(j[0]["class"], "mcp");
    }

    #[test]
    fn tools_json_is_sorted_canonical_and_exact() {
        let p = ToolPolicy::builtin();
        let j = p.tools_json(&names(&["shell", "file_read"]));
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        let got: Vec<&str> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(got, ["file_read", "shell"]);
        assert!(!j.contains(' ') || j.contains("\"description\""), "compact");
        assert_eq!(
            j,
            p.tools_json(&names(&["file_read", "shell"])),
            "order of the input does not matter"
        );
    }

    #[test]
    fn operator_tools_and_audience_overrides() {
        let extra = vec![Tool {
            name: "db_query".into(),
            description: "Query the database.".into(),
            class: Capability::Network,
            schema: serde_json::json!({"type": "object"}),
        }];
        let mut over = BTreeMap::new();
        over.insert(Audience::Team, names(&["file_read", "db_query"]));
        let p = ToolPolicy::new(&extra, &over).unwrap();
        assert_eq!(
            p.child_tools(
                Audience::Team,
                &names(&["db_query", "file_read", "shell"]),
                None
            )
            .unwrap(),
            names(&["file_read", "db_query"])
        );
        let bad = BTreeMap::from([(Audience::Team, names(&["nope"]))]);
        assert!(ToolPolicy::new(&[], &bad).is_err());
        let dup = vec![Tool {
            name: "shell".into(),
            ..extra[0].clone()
        }];
        assert_eq!(
            ToolPolicy::new(&dup, &BTreeMap::new()),
            Err(ToolError::Duplicate("shell".into()))
        );
    }
}
