//! The child's context, composed as a pure function of recorded inputs:
//! system.md (operating rules, operator playbook, project instructions,
//! the subagent's own body, a tool index, the headless execution contract),
//! first_message.md (Context/Task, a handoff note, the working-context and
//! session blocks) and plan.json, the audit of the assembly. The same
//! inputs give byte-identical files.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::PathBuf;

/// The built-in operating rules of every subagent.
pub const CORE_RULES: &str = "\
You are a subagent: a parent agent delegated one task to you. Do that task and nothing else.
- Work only in your project directory and your own temp and artifact directories.
- Prefer small, verifiable steps; check your work before you report it.
- Never try to reach the network, other processes or files you were not given; the sandbox refuses, and trying wastes your budget.
- Report what you did and what you did not do, plainly. Do not invent results.";

/// Default cap on one injected layer, in characters.
pub const DEFAULT_MAX_FILE_CHARS: usize = 20_000;
/// Default cap on everything injected, in characters.
pub const DEFAULT_MAX_TOTAL_CHARS: usize = 60_000;
/// The exit code with which a child asks to be continued.
pub const EXIT_CONTINUE: i32 = 75;

/// Limits on what is injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Caps {
    /// Per layer.
    #[serde(default = "default_file")]
    pub max_file_chars: usize,
    /// All layers together.
    #[serde(default = "default_total")]
    pub max_total_chars: usize,
}

fn default_file() -> usize {
    DEFAULT_MAX_FILE_CHARS
}
fn default_total() -> usize {
    DEFAULT_MAX_TOTAL_CHARS
}

impl Default for Caps {
    fn default() -> Self {
        Caps {
            max_file_chars: DEFAULT_MAX_FILE_CHARS,
            max_total_chars: DEFAULT_MAX_TOTAL_CHARS,
        }
    }
}

/// A text and where it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sourced {
    /// Its file.
    pub path: PathBuf,
    /// Its content.
    pub text: String,
}

/// The run's paths as the child sees them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionPaths {
    /// The parent session.
    pub session_id: String,
    /// Scratch space.
    pub temp_dir: PathBuf,
    /// Where results go.
    pub artifact_dir: PathBuf,
    /// The worktree, with worktree isolation.
    pub worktree_dir: Option<PathBuf>,
    /// child.log.
    pub log_path: PathBuf,
    /// Where the delta goes.
    pub delta_path: PathBuf,
}

/// Everything the composition depends on (recorded in runner.json).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComposeInput {
    /// The operator's playbook (config `rules_file`).
    pub playbook: Option<Sourced>,
    /// The project's instructions (the first file found).
    pub project_instructions: Option<Sourced>,
    /// The subagent definition's body.
    pub agent: Option<Sourced>,
    /// The child's tools: (name, one-line description), in order.
    pub tools: Vec<(String, String)>,
    /// tools.json, canonical.
    pub tools_json: String,
    /// The paths.
    pub paths: SessionPaths,
    /// The task.
    pub task: String,
    /// Its context.
    pub context: Option<String>,
    /// The `[working-context]` block.
    pub working_context: String,
    /// The caps.
    pub caps: Caps,
    /// Attempts allowed in all (1 + max_restarts).
    pub max_attempts: u32,
}

/// One layer in plan.json.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerPlan {
    /// Its name.
    pub name: String,
    /// The file it is in (`system.md` or `first_message.md`).
    pub file: String,
    /// Its source: a path, or `built-in`.
    pub source: String,
    /// Characters before capping.
    pub raw_chars: usize,
    /// Characters injected (the truncation notice included).
    pub injected_chars: usize,
    /// injected_chars / 4.
    pub approx_tokens: usize,
    /// Cut at a cap.
    pub truncated: bool,
    /// sha256 of the injected bytes.
    pub sha256: String,
}

/// A layer left out, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Omitted {
    /// The layer.
    pub name: String,
    /// Why.
    pub reason: String,
}

/// plan.json: the record of one assembly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// The attempt this assembly is for (1-based).
    pub attempt: u32,
    /// Attempts allowed in all.
    pub max_attempts: u32,
    /// The layers, in order.
    pub layers: Vec<LayerPlan>,
    /// Layers left out.
    pub omitted: Vec<Omitted>,
    /// sha256 over system.md and tools.json: the prompt-cache prefix.
    pub stable_prefix: String,
    /// The caps applied.
    pub caps: Caps,
    /// Sums over the layers.
    pub total_raw_chars: usize,
    /// Sums over the layers.
    pub total_injected_chars: usize,
    /// Sums over the layers.
    pub total_approx_tokens: usize,
}

/// The composed files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Composed {
    /// system.md.
    pub system_md: String,
    /// first_message.md.
    pub first_message_md: String,
    /// plan.json (canonical, sorted keys).
    pub plan_json: String,
    /// The plan.
    pub plan: Plan,
}

/// sha256 in hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Cuts `text` to `max` characters (on a character boundary), adding a
/// visible notice; returns the text and whether it was cut.
pub fn cap(text: &str, max: usize) -> (String, bool) {
    let total = text.chars().count();
    if total <= max {
        return (text.to_owned(), false);
    }
    let notice = format!("\n[... truncated by subagentd: {max} of {total} characters shown]");
    let end = text.char_indices().nth(max).map_or(text.len(), |(i, _)| i);
    (format!("{}{notice}", &text[..end]), true)
}

struct Layer {
    name: &'static str,
    file: &'static str,
    heading: Option<String>,
    source: String,
    text: String,
    priority: u8,
}

fn contract() -> String {
    format!(
        "You run unattended. Nobody reads your questions and nobody will answer them: decide, act, and say in your results what you assumed.\n\
- Your temp dir ($SUBAGENT_TEMP_DIR, also $HOME and $TMPDIR) is scratch space, deleted when you end.\n\
- Write your results into your artifact dir ($SUBAGENT_ARTIFACT_DIR); the parent reads them.\n\
- When you create or change project files, write JSON {{\"written\": [...], \"edited\": [...], \"read\": [...]}} to $SUBAGENT_DELTA_PATH (paths absolute or relative to the project, most recent first). Only files that really changed are kept.\n\
- If you run out of context or turns before the task is done, write a handoff note to handoff.md in your artifact dir (what is done, what remains, what you learned, where things are) and exit with code {EXIT_CONTINUE}: a fresh process continues the task with your note, as long as attempts remain (see [session]).\n\
- Exit codes: 0 when the task is done; {EXIT_CONTINUE} to be continued; anything else means failure, and your artifact dir should say why.\n\
- Your paths and your attempt are in the [session] block of your first message."
    )
}

fn session_block(p: &SessionPaths, attempt: u32, max_attempts: u32) -> String {
    format!(
        "[session]\nsession_id: {}\ntemp_dir: {}\nartifact_dir: {}\nworktree_dir: {}\nlog_path: {}\ndelta_path: {}\nattempt: {attempt} of {max_attempts}\n",
        p.session_id,
        p.temp_dir.display(),
        p.artifact_dir.display(),
        p.worktree_dir.as_ref().map_or("(none)".to_owned(), |w| w.display().to_string()),
        p.log_path.display(),
        p.delta_path.display()
    )
}

/// Composes the context of `attempt` (1-based); `handoff` is the previous
/// attempt's note.
pub fn compose(input: &ComposeInput, attempt: u32, handoff: Option<&str>) -> Composed {
    let mut layers = Vec::new();
    let mut omitted = Vec::new();
    let mut push = |name, file, heading: Option<&str>, source: String, text: String, priority| {
        layers.push(Layer {
            name,
            file,
            heading: heading.map(str::to_owned),
            source,
            text,
            priority,
        })
    };
    push(
        "operating_rules",
        "system.md",
        Some("Operating rules"),
        "built-in".into(),
        CORE_RULES.to_owned(),
        1,
    );
    match &input.playbook {
        Some(s) if !s.text.trim().is_empty() => push(
            "playbook",
            "system.md",
            Some("Operator playbook"),
            s.path.display().to_string(),
            s.text.trim().to_owned(),
            6,
        ),
        Some(_) => omitted.push(Omitted {
            name: "playbook".into(),
            reason: "the rules file is empty".into(),
        }),
        None => omitted.push(Omitted {
            name: "playbook".into(),
            reason: "no rules_file configured".into(),
        }),
    }
    match &input.project_instructions {
        Some(s) if !s.text.trim().is_empty() => push(
            "project_instructions",
            "system.md",
            Some("Project instructions"),
            s.path.display().to_string(),
            s.text.trim().to_owned(),
            5,
        ),
        Some(s) => omitted.push(Omitted {
            name: "project_instructions".into(),
            reason: format!("{} is empty", s.path.display()),
        }),
        None => omitted.push(Omitted {
            name: "project_instructions".into(),
            reason: "no project instructions found".into(),
        }),
    }
    match &input.agent {
        Some(s) if !s.text.trim().is_empty() => push(
            "agent",
            "system.md",
            Some("Your role"),
            s.path.display().to_string(),
            s.text.trim().to_owned(),
            4,
        ),
        Some(s) => omitted.push(Omitted {
            name: "agent".into(),
            reason: format!("the definition {} has no body", s.path.display()),
        }),
        None => omitted.push(Omitted {
            name: "agent".into(),
            reason: "no agent definition given".into(),
        }),
    }
    if input.tools.is_empty() {
        omitted.push(Omitted {
            name: "tool_index".into(),
            reason: "no tools".into(),
        });
    } else {
        let index: String = input
            .tools
            .iter()
            .map(|(n, d)| format!("- {n}: {d}\n"))
            .collect();
        push(
            "tool_index",
            "system.md",
            Some("Tools (for awareness; the schemas come with each request)"),
            "built-in".into(),
            index.trim_end().to_owned(),
            3,
        );
    }
    push(
        "execution_contract",
        "system.md",
        Some("Execution contract"),
        "built-in".into(),
        contract(),
        1,
    );
    let context = input
        .context
        .as_deref()
        .filter(|c| !c.trim().is_empty())
        .unwrap_or("(none)");
    push(
        "task",
        "first_message.md",
        None,
        "request".into(),
        format!("Context: {context}\nTask: {}", input.task),
        0,
    );
    match handoff {
        Some(h) => push(
            "handoff",
            "first_message.md",
            None,
            "handoff.md".into(),
            format!("[handoff]\nAn earlier attempt ({} of {}) was cut off and left this note. Check the current state before you repeat anything it says it did.\n\n{}", attempt - 1, input.max_attempts, h.trim()),
            2,
        ),
        None if attempt > 1 => omitted.push(Omitted { name: "handoff".into(), reason: "the earlier attempt left no handoff.md".into() }),
        None => {}
    }
    push(
        "working_context",
        "first_message.md",
        None,
        "built-in".into(),
        input.working_context.trim_end().to_owned(),
        2,
    );
    push(
        "session",
        "first_message.md",
        None,
        "built-in".into(),
        session_block(&input.paths, attempt, input.max_attempts)
            .trim_end()
            .to_owned(),
        1,
    );

    // Per-layer cap, then the total cap, shrinking the lowest-priority
    // layers first.
    let raw: Vec<usize> = layers.iter().map(|l| l.text.chars().count()).collect();
    let mut budget: Vec<usize> = raw
        .iter()
        .map(|&r| r.min(input.caps.max_file_chars))
        .collect();
    let mut total: usize = budget.iter().sum();
    let mut order: Vec<usize> = (0..layers.len())
        .filter(|&i| layers[i].name != "task")
        .collect();
    order.sort_by_key(|&i| std::cmp::Reverse(layers[i].priority));
    for i in order {
        if total <= input.caps.max_total_chars {
            break;
        }
        let cut = (total - input.caps.max_total_chars).min(budget[i]);
        budget[i] -= cut;
        total -= cut;
    }
    let mut system = String::new();
    let mut first = String::new();
    let mut plans = Vec::new();
    for (i, l) in layers.into_iter().enumerate() {
        if budget[i] == 0 && raw[i] > 0 {
            omitted.push(Omitted {
                name: l.name.into(),
                reason: "no room left under the total cap".into(),
            });
            continue;
        }
        let (text, truncated) = cap(&l.text, budget[i]);
        let out = if l.file == "system.md" {
            &mut system
        } else {
            &mut first
        };
        if !out.is_empty() {
            out.push('\n');
        }
        if let Some(h) = &l.heading {
            out.push_str(&format!("## {h}\n\n"));
        }
        out.push_str(&text);
        out.push('\n');
        let injected = text.chars().count();
        plans.push(LayerPlan {
            name: l.name.into(),
            file: l.file.into(),
            source: l.source,
            raw_chars: raw[i],
            injected_chars: injected,
            approx_tokens: injected / 4,
            truncated,
            sha256: sha256_hex(text.as_bytes()),
        });
    }
    let mut prefix = system.as_bytes().to_vec();
    prefix.push(0);
    prefix.extend_from_slice(input.tools_json.as_bytes());
    let plan = Plan {
        attempt,
        max_attempts: input.max_attempts,
        total_raw_chars: plans.iter().map(|p| p.raw_chars).sum(),
        total_injected_chars: plans.iter().map(|p| p.injected_chars).sum(),
        total_approx_tokens: plans.iter().map(|p| p.approx_tokens).sum(),
        layers: plans,
        omitted,
        stable_prefix: sha256_hex(&prefix),
        caps: input.caps,
    };
    let value = serde_json::to_value(&plan).unwrap_or_default();
    let mut plan_json = serde_json::to_string_pretty(&value).unwrap_or_default();
    plan_json.push('\n');
    Composed {
        system_md: system,
        first_message_md: first,
        plan_json,
        plan,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn input() -> ComposeInput {
        ComposeInput {
            playbook: None,
            project_instructions: Some(Sourced { path: "/p/AGENTS.md".into(), text: "Use tabs.\n".into() }),
            agent: None,
            tools: vec![("file_read".into(), "Read a file of the project.".into())],
            tools_json: "[{\"name\":\"file_read\"}]".into(),
            paths: SessionPaths {
                session_id: "s1".into(),
                temp_dir: "/tmp/subagentd-0/s1/c1".into(),
                artifact_dir: "/st/a".into(),
                worktree_dir: None,
                log_path: "/st/child.log".into(),
                delta_path: "/st/delta/delta.json".into(),
            },
            task: "Fix the bug.".into(),
            context: Some("Tests fail.".into()),
            working_context: "[working-context]\nproject_dir: /p\nrecent_files: (none)\ngit: unavailable (not a git repository)\n".into(),
            caps: Caps::default(),
            max_attempts: 4,
        }
    }

    #[test]
    fn deterministic_and_the_task_does_not_move_the_stable_prefix() {
        let a = compose(&input(), 1, None);
        let b = compose(&input(), 1, None);
        assert_eq!(a, b);
        let mut other = input();
        other.task = "Something else.".into();
        let c = compose(&other, 1, None);
        assert_ne!(a.first_message_md, c.first_message_md);
        assert_eq!(a.system_md, c.system_md);
        assert_eq!(a.plan.stable_prefix, c.plan.stable_prefix);
        assert!(a
            .first_message_md
            .starts_with("Context: Tests fail.\nTask: Fix the bug.\n\n[working-context]\n"));
        assert!(a.first_message_md.ends_with("[session]\nsession_id: s1\ntemp_dir: /tmp/subagentd-0/s1/c1\nartifact_dir: /st/a\nworktree_dir: (none)\nlog_path: /st/child.log\ndelta_path: /st/delta/delta.json\nattempt: 1 of 4\n"));
        // Another run (other paths, a later attempt) has the same system.md.
        let mut moved = input();
        moved.paths.temp_dir = "/tmp/elsewhere".into();
        moved.paths.artifact_dir = "/elsewhere/a".into();
        let m = compose(&moved, 2, Some("note"));
        assert_eq!(m.system_md, a.system_md);
        assert_eq!(m.plan.stable_prefix, a.plan.stable_prefix);
        let names: Vec<&str> = a.plan.layers.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "operating_rules",
                "project_instructions",
                "tool_index",
                "execution_contract",
                "task",
                "working_context",
                "session"
            ]
        );
        let omitted: Vec<&str> = a.plan.omitted.iter().map(|o| o.reason.as_str()).collect();
        assert_eq!(
            omitted,
            ["no rules_file configured", "no agent definition given"]
        );
        assert!(
            !a.system_md.contains("Operator playbook"),
            "an empty layer is omitted entirely"
        );
    }

    #[test]
    fn caps_cut_on_character_boundaries_with_a_notice() {
        let (t, cut) = cap("ééééé", 3);
        assert!(cut);
        assert!(
            t.starts_with("ééé\n[... truncated by subagentd: 3 of 5 characters shown]"),
            "{t}"
        );
        let mut big = input();
        big.project_instructions = Some(Sourced {
            path: "/p/AGENTS.md".into(),
            text: "ü".repeat(30_000),
        });
        big.caps = Caps {
            max_file_chars: 20_000,
            max_total_chars: 60_000,
        };
        let c = compose(&big, 1, None);
        let l = c
            .plan
            .layers
            .iter()
            .find(|l| l.name == "project_instructions")
            .unwrap();
        assert!(l.truncated);
        assert_eq!(l.raw_chars, 30_000);
        assert!(c
            .system_md
            .contains("[... truncated by subagentd: 20000 of 30000 characters shown]"));
        // The total cap shrinks the lowest-priority layer first.
        big.caps = Caps {
            max_file_chars: 20_000,
            max_total_chars: 5_000,
        };
        let c = compose(&big, 1, None);
        let task = c.plan.layers.iter().find(|l| l.name == "task").unwrap();
        assert!(!task.truncated, "the task is never cut");
        assert!(
            c.plan
                .layers
                .iter()
                .find(|l| l.name == "project_instructions")
                .unwrap()
                .truncated
        );
    }

    #[test]
    fn a_restart_carries_the_handoff_note() {
        let c = compose(&input(), 2, Some("Did step 1. Next: step 2."));
        assert!(c
            .first_message_md
            .contains("[handoff]\nAn earlier attempt (1 of 4) was cut off"));
        assert!(c.first_message_md.contains("Did step 1. Next: step 2."));
        assert!(c.first_message_md.contains("attempt: 2 of 4"));
        assert_eq!(c.plan.attempt, 2);
    }
}
