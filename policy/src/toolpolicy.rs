//! The tool policy: the catalog (built-in plus the operator's tools), the
//! tools each audience may hold, and the filter that gives a child exactly
//! the tools its parent may delegate.

use crate::audience::Audience;
use crate::tools::{builtin, Capability, Tool, NEVER_DELEGATED};
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
    /// The built-in catalog plus `extra` tools; audiences from `overrides`
    /// where given, else the defaults: personal and team hold every tool,
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
        let all: BTreeSet<String> = catalog.iter().map(|t| t.name.clone()).collect();
        let mut policy = ToolPolicy {
            catalog,
            audiences: BTreeMap::new(),
        };
        for a in [Audience::Personal, Audience::Team, Audience::Public] {
            let set = match overrides.get(&a) {
                Some(names) => {
                    policy.check_known(names, &format!("audiences.{}.tools", a.as_str()))?;
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

    /// A tool by name.
    pub fn tool(&self, name: &str) -> Option<&Tool> {
        self.catalog.iter().find(|t| t.name == name)
    }

    /// The tools `audience` may hold.
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
    /// catalog order. Unknown names are an error; nothing is dropped
    /// silently.
    pub fn child_tools(
        &self,
        audience: Audience,
        parent: &[String],
        definition: Option<&[String]>,
    ) -> Result<Vec<String>, ToolError> {
        self.check_known(parent, "session.tools")?;
        if let Some(d) = definition {
            self.check_known(d, "agent tools")?;
        }
        let allowed = self.audiences.get(&audience);
        Ok(self
            .catalog
            .iter()
            .filter(|t| parent.contains(&t.name))
            .filter(|t| allowed.is_some_and(|a| a.contains(&t.name)))
            .filter(|t| definition.is_none_or(|d| d.contains(&t.name)))
            .filter(|t| t.class.delegable() && !NEVER_DELEGATED.contains(&t.name.as_str()))
            .map(|t| t.name.clone())
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
        let mut chosen: Vec<&Tool> = tools.iter().filter_map(|n| self.tool(n)).collect();
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
        let e = p
            .child_tools(Audience::Team, &names(&["file_read"]), Some(&names(&["x"])))
            .unwrap_err();
        assert!(matches!(e, ToolError::Unknown { ref field, .. } if field == "agent tools"));
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
