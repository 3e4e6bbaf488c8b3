//! The child's context, composed as a pure function of recorded inputs:
//! system.md (operating rules, operator playbook, project instructions,
//! the subagent's own body, a tool index, the headless execution contract),
//! first_message.md (Context/Task, a handoff note, the working-context and
//! session blocks) and plan.json, the audit of the assembly. The same
//! inputs give byte-identical files.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

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
    /// Characters of one layer.
    #[serde(default = "default_file")]
    pub max_file_chars: usize,
    /// Characters of all layers together; the task is never cut.
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
    /// Recorded as the layer's source in plan.json.
    pub path: PathBuf,
    pub text: String,
}

/// The run's paths as the child sees them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionPaths {
    /// The parent's session.
    pub session_id: String,
    /// Scratch space, deleted when the run ends.
    pub temp_dir: PathBuf,
    /// Where the child leaves its results for the parent.
    pub artifact_dir: PathBuf,
    /// Set only with worktree isolation.
    pub worktree_dir: Option<PathBuf>,
    /// child.log: the child's stdout and stderr.
    pub log_path: PathBuf,
    /// Where the child lists the project files it wrote, edited and read.
    pub delta_path: PathBuf,
}

/// Everything the composition depends on (recorded in the runner spec).
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
    /// tools.json, canonical: hashed into the stable prefix.
    pub tools_json: String,
    pub paths: SessionPaths,
    pub task: String,
    /// Background for the task; blank is shown as `(none)`.
    pub context: Option<String>,
    /// The `[working-context]` block.
    pub working_context: String,
    pub caps: Caps,
    /// Attempts allowed in all (1 + max_restarts).
    pub max_attempts: u32,
}

/// One layer in plan.json.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerPlan {
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
    /// Cut at a cap (the text ends with a truncation notice).
    pub truncated: bool,
    /// sha256 of the injected bytes.
    pub sha256: String,
}

/// A layer left out, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Omitted {
    pub name: String,
    /// A sentence for people, e.g. `no rules_file configured`.
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
    /// The sum of the layers' `raw_chars`.
    pub total_raw_chars: usize,
    /// The sum of the layers' `injected_chars`.
    pub total_injected_chars: usize,
    /// The sum of the layers' `approx_tokens`.
    pub total_approx_tokens: usize,
}

/// The composed files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Composed {
    pub system_md: String,
    pub first_message_md: String,
    /// plan.json (canonical, sorted keys).
    pub plan_json: String,
    /// plan.json's content.
    pub plan: Plan,
}

/// sha256 in lowercase hex.
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

/// The composed file a layer goes into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum File {
    /// system.md: nothing in it depends on the run (its task, paths or
    /// attempt), so a prompt cache can reuse it across runs.
    System,
    /// first_message.md: the run's task, handoff note, working context and
    /// paths.
    FirstMessage,
}

impl File {
    fn name(self) -> &'static str {
        match self {
            File::System => "system.md",
            File::FirstMessage => "first_message.md",
        }
    }
}

/// The source recorded for a text subagentd writes itself.
const BUILT_IN: &str = "built-in";

struct Layer {
    name: &'static str,
    file: File,
    heading: Option<&'static str>,
    source: String,
    text: String,
    /// Under the total cap, layers of higher priority are shrunk first.
    priority: u8,
}

impl Layer {
    fn system(
        name: &'static str,
        heading: &'static str,
        source: impl Into<String>,
        text: String,
        priority: u8,
    ) -> Layer {
        Layer {
            name,
            file: File::System,
            heading: Some(heading),
            source: source.into(),
            text,
            priority,
        }
    }

    fn first_message(
        name: &'static str,
        source: impl Into<String>,
        text: String,
        priority: u8,
    ) -> Layer {
        Layer {
            name,
            file: File::FirstMessage,
            heading: None,
            source: source.into(),
            text,
            priority,
        }
    }
}

/// A system.md layer read from a file, and the reasons it is left out.
struct FileLayer {
    name: &'static str,
    heading: &'static str,
    priority: u8,
    /// Recorded when there is no file.
    missing: &'static str,
    /// Recorded when the file holds only whitespace.
    blank: fn(&Path) -> String,
}

const PLAYBOOK: FileLayer = FileLayer {
    name: "playbook",
    heading: "Operator playbook",
    priority: 6,
    missing: "no rules_file configured",
    blank: |_| "the rules file is empty".into(),
};

const PROJECT_INSTRUCTIONS: FileLayer = FileLayer {
    name: "project_instructions",
    heading: "Project instructions",
    priority: 5,
    missing: "no project instructions found",
    blank: |path| format!("{} is empty", path.display()),
};

// Shrunk first: a definition may lie in a project a child writes, and
// is not cut by the per-layer cap, so it must not crowd out the others.
const AGENT: FileLayer = FileLayer {
    name: "agent",
    heading: "Your role",
    priority: 7,
    missing: "no agent definition given",
    blank: |path| format!("the definition {} has no body", path.display()),
};

/// The layers of one assembly in their order, and those left out.
#[derive(Default)]
struct Assembly {
    layers: Vec<Layer>,
    omitted: Vec<Omitted>,
}

impl Assembly {
    fn add(&mut self, layer: Layer) {
        self.layers.push(layer);
    }

    fn omit(&mut self, name: &str, reason: impl Into<String>) {
        self.omitted.push(Omitted {
            name: name.to_owned(),
            reason: reason.into(),
        });
    }

    fn add_file(&mut self, layer: &FileLayer, file: Option<&Sourced>) {
        match file {
            Some(s) if !s.text.trim().is_empty() => self.add(Layer::system(
                layer.name,
                layer.heading,
                s.path.display().to_string(),
                s.text.trim().to_owned(),
                layer.priority,
            )),
            Some(s) => self.omit(layer.name, (layer.blank)(&s.path)),
            None => self.omit(layer.name, layer.missing),
        }
    }

    fn add_system_layers(&mut self, input: &ComposeInput) {
        let rules = CORE_RULES.to_owned();
        self.add(Layer::system(
            "operating_rules",
            "Operating rules",
            BUILT_IN,
            rules,
            1,
        ));
        self.add_file(&PLAYBOOK, input.playbook.as_ref());
        self.add_file(&PROJECT_INSTRUCTIONS, input.project_instructions.as_ref());
        self.add_file(&AGENT, input.agent.as_ref());
        if input.tools.is_empty() {
            self.omit("tool_index", "no tools");
        } else {
            self.add(tool_index(&input.tools));
        }
        self.add(Layer::system(
            "execution_contract",
            "Execution contract",
            BUILT_IN,
            contract(),
            1,
        ));
    }

    fn add_first_message_layers(
        &mut self,
        input: &ComposeInput,
        attempt: u32,
        handoff: Option<&str>,
    ) {
        self.add(task_layer(input));
        match handoff {
            Some(note) => self.add(handoff_layer(note, attempt, input.max_attempts)),
            None if attempt > 1 => self.omit("handoff", "the earlier attempt left no handoff.md"),
            None => {}
        }
        let working_context = input.working_context.trim_end().to_owned();
        self.add(Layer::first_message(
            "working_context",
            BUILT_IN,
            working_context,
            2,
        ));
        let session = session_block(&input.paths, attempt, input.max_attempts);
        let session = session.trim_end().to_owned();
        self.add(Layer::first_message("session", BUILT_IN, session, 1));
    }

    /// Writes each layer into its file, within the caps; a layer cut to
    /// nothing is recorded as omitted.
    fn render(self, caps: &Caps) -> Rendered {
        let raw: Vec<usize> = self.layers.iter().map(|l| l.text.chars().count()).collect();
        let budgets = budgets(&self.layers, &raw, caps);
        let mut out = Rendered {
            omitted: self.omitted,
            ..Rendered::default()
        };
        for ((layer, raw_chars), budget) in self.layers.into_iter().zip(raw).zip(budgets) {
            if budget == 0 && raw_chars > 0 {
                out.omitted.push(Omitted {
                    name: layer.name.into(),
                    reason: "no room left under the total cap".into(),
                });
            } else {
                out.write(layer, raw_chars, budget);
            }
        }
        out
    }
}

fn tool_index(tools: &[(String, String)]) -> Layer {
    let index: String = tools.iter().map(|(n, d)| format!("- {n}: {d}\n")).collect();
    Layer::system(
        "tool_index",
        "Tools (for awareness; the schemas come with each request)",
        BUILT_IN,
        index.trim_end().to_owned(),
        3,
    )
}

fn task_layer(input: &ComposeInput) -> Layer {
    let context = input
        .context
        .as_deref()
        .filter(|c| !c.trim().is_empty())
        .unwrap_or("(none)");
    let text = format!("Context: {context}\nTask: {}", input.task);
    Layer::first_message("task", "request", text, 0)
}

fn handoff_layer(note: &str, attempt: u32, max_attempts: u32) -> Layer {
    let text = format!(
        "[handoff]\nAn earlier attempt ({} of {max_attempts}) was cut off and left this note. Check the current state before you repeat anything it says it did.\n\n{}",
        attempt - 1,
        note.trim()
    );
    Layer::first_message("handoff", "handoff.md", text, 2)
}

/// How many characters of each layer are injected: each layer cut to the
/// per-layer cap (but the definition's body), then the lowest-priority
/// layers (first in `layers` among equals) shrunk until the total fits.
/// The task is never cut.
fn budgets(layers: &[Layer], raw: &[usize], caps: &Caps) -> Vec<usize> {
    let mut budget: Vec<usize> = layers
        .iter()
        .zip(raw)
        .map(|(l, &r)| {
            if l.name == AGENT.name {
                r
            } else {
                r.min(caps.max_file_chars)
            }
        })
        .collect();
    let mut total: usize = budget.iter().sum();
    let mut order: Vec<usize> = (0..layers.len())
        .filter(|&i| layers[i].name != "task")
        .collect();
    order.sort_by_key(|&i| std::cmp::Reverse(layers[i].priority));
    for i in order {
        if total <= caps.max_total_chars {
            break;
        }
        let cut = (total - caps.max_total_chars).min(budget[i]);
        budget[i] -= cut;
        total -= cut;
    }
    budget
}

/// The composed files so far, with the plan of each layer written.
#[derive(Default)]
struct Rendered {
    system_md: String,
    first_message_md: String,
    layers: Vec<LayerPlan>,
    omitted: Vec<Omitted>,
}

impl Rendered {
    fn write(&mut self, layer: Layer, raw_chars: usize, budget: usize) {
        let (text, truncated) = cap(&layer.text, budget);
        let out = match layer.file {
            File::System => &mut self.system_md,
            File::FirstMessage => &mut self.first_message_md,
        };
        if !out.is_empty() {
            out.push('\n');
        }
        if let Some(h) = layer.heading {
            out.push_str(&format!("## {h}\n\n"));
        }
        out.push_str(&text);
        out.push('\n');
        let injected = text.chars().count();
        self.layers.push(LayerPlan {
            name: layer.name.into(),
            file: layer.file.name().into(),
            source: layer.source,
            raw_chars,
            injected_chars: injected,
            approx_tokens: injected / 4,
            truncated,
            sha256: sha256_hex(text.as_bytes()),
        });
    }
}

/// The hash of what a prompt cache can reuse across runs: system.md and
/// tools.json.
fn stable_prefix(system_md: &str, tools_json: &str) -> String {
    let mut prefix = system_md.as_bytes().to_vec();
    prefix.push(0);
    prefix.extend_from_slice(tools_json.as_bytes());
    sha256_hex(&prefix)
}

/// Pretty JSON with sorted keys (a `Value`'s map is a BTreeMap), so equal
/// plans give equal bytes.
fn canonical_json(plan: &Plan) -> String {
    let value = serde_json::to_value(plan).unwrap_or_default();
    let mut json = serde_json::to_string_pretty(&value).unwrap_or_default();
    json.push('\n');
    json
}

/// Composes the context of `attempt` (1-based); `handoff` is the previous
/// attempt's note.
pub fn compose(input: &ComposeInput, attempt: u32, handoff: Option<&str>) -> Composed {
    let mut assembly = Assembly::default();
    assembly.add_system_layers(input);
    assembly.add_first_message_layers(input, attempt, handoff);
    let rendered = assembly.render(&input.caps);
    let layers = rendered.layers;
    let plan = Plan {
        attempt,
        max_attempts: input.max_attempts,
        total_raw_chars: layers.iter().map(|p| p.raw_chars).sum(),
        total_injected_chars: layers.iter().map(|p| p.injected_chars).sum(),
        total_approx_tokens: layers.iter().map(|p| p.approx_tokens).sum(),
        layers,
        omitted: rendered.omitted,
        stable_prefix: stable_prefix(&rendered.system_md, &input.tools_json),
        caps: input.caps,
    };
    Composed {
        system_md: rendered.system_md,
        first_message_md: rendered.first_message_md,
        plan_json: canonical_json(&plan),
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
    fn the_definition_body_is_not_cut_by_the_per_layer_cap() {
        let mut big = input();
        big.agent = Some(Sourced {
            path: "/p/.claude/agents/big.md".into(),
            text: "é".repeat(25_000),
        });
        big.caps = Caps {
            max_file_chars: 20_000,
            max_total_chars: 60_000,
        };
        let c = compose(&big, 1, None);
        let l = c.plan.layers.iter().find(|l| l.name == "agent").unwrap();
        assert_eq!(
            (l.raw_chars, l.injected_chars, l.truncated),
            (25_000, 25_000, false)
        );
        assert!(c.system_md.contains(&"é".repeat(25_000)));
    }

    #[test]
    fn a_huge_definition_body_gives_way_before_the_playbook_and_the_instructions() {
        let mut big = input();
        big.playbook = Some(Sourced {
            path: "/etc/subagentd/playbook.md".into(),
            text: "PLAYBOOK: never push.".into(),
        });
        big.agent = Some(Sourced {
            path: "/p/.claude/agents/big.md".into(),
            text: "x".repeat(420_000),
        });
        let c = compose(&big, 1, None);
        let layer = |n: &str| c.plan.layers.iter().find(|l| l.name == n).unwrap();
        assert!(!layer("playbook").truncated, "{:?}", c.plan.omitted);
        assert!(!layer("project_instructions").truncated);
        assert!(c.system_md.contains("PLAYBOOK: never push."));
        assert!(c.system_md.contains("Use tabs."));
        assert!(layer("agent").truncated, "the total cap cuts the body");
        assert!(c.plan.total_injected_chars <= Caps::default().max_total_chars + 200);
    }

    #[test]
    fn a_layer_cut_to_nothing_is_omitted_and_the_task_stays_whole() {
        let mut tight = input();
        tight.playbook = Some(Sourced {
            path: "/etc/playbook.md".into(),
            text: "Be careful.".into(),
        });
        let task_chars = "Context: Tests fail.\nTask: Fix the bug.".chars().count();
        tight.caps = Caps {
            max_file_chars: 20_000,
            max_total_chars: task_chars,
        };
        let c = compose(&tight, 2, None);
        let names: Vec<&str> = c.plan.layers.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["task"]);
        assert_eq!(c.plan.total_injected_chars, task_chars);
        let omitted: Vec<(&str, &str)> = c
            .plan
            .omitted
            .iter()
            .map(|o| (o.name.as_str(), o.reason.as_str()))
            .collect();
        let full = "no room left under the total cap";
        assert_eq!(
            omitted,
            [
                ("agent", "no agent definition given"),
                ("handoff", "the earlier attempt left no handoff.md"),
                ("operating_rules", full),
                ("playbook", full),
                ("project_instructions", full),
                ("tool_index", full),
                ("execution_contract", full),
                ("working_context", full),
                ("session", full),
            ]
        );
        assert!(c.system_md.is_empty());
        assert_eq!(
            c.first_message_md,
            "Context: Tests fail.\nTask: Fix the bug.\n"
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
