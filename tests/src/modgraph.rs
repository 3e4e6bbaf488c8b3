//! The module graph of a crate, read from its source with `syn`: which
//! module uses which, for the layering check (`tests/tests/layers.rs`).
//!
//! A module is a node; an edge A → B means code in A names an item that
//! B defines (through `use`, a path in a type or an expression, or a
//! re-export followed to where the item lives). Owning a submodule is not
//! an edge, using it is. Test code (`#[cfg(test)]` items) is left out:
//! the layers are about what ships.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use syn::visit::Visit;

/// A module's path inside its crate, `crate::engine::accept` as
/// `["engine", "accept"]` (the root is empty).
pub type ModPath = Vec<String>;

/// One module: where it is, what its `use` items bind, which paths it
/// names.
#[derive(Debug, Default)]
struct Module {
    file: PathBuf,
    /// Names its `use` items bind (`use a::b as c` binds `c` → `a::b`),
    /// each as written, resolved later.
    uses: BTreeMap<String, Vec<String>>,
    /// Every path its code names, as written.
    paths: Vec<Vec<String>>,
    /// Its submodules.
    children: BTreeSet<String>,
}

/// A crate's modules and the edges between them.
#[derive(Debug, Default)]
pub struct Graph {
    modules: BTreeMap<ModPath, Module>,
    /// A → {B}: A uses something B defines.
    pub edges: BTreeMap<ModPath, BTreeSet<ModPath>>,
}

/// Why a crate's source could not be read.
#[derive(Debug)]
pub enum GraphError {
    /// A file could not be read.
    Read(PathBuf, std::io::Error),
    /// A file is not valid Rust.
    Parse(PathBuf, syn::Error),
    /// A `mod x;` has no x.rs or x/mod.rs.
    Missing(PathBuf, String),
}

impl std::fmt::Display for GraphError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GraphError::Read(p, e) => write!(f, "reading {}: {e}", p.display()),
            GraphError::Parse(p, e) => write!(f, "parsing {}: {e}", p.display()),
            GraphError::Missing(p, m) => write!(f, "{}: no file for `mod {m};`", p.display()),
        }
    }
}

/// Shows a module path as Rust writes it.
pub fn show(m: &[String]) -> String {
    if m.is_empty() {
        "crate".to_owned()
    } else {
        format!("crate::{}", m.join("::"))
    }
}

/// Whether an item is test code.
fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

/// Collects what one module's items use.
struct Collector<'a> {
    module: &'a mut Module,
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Mod(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Trait(i) => &i.attrs,
            syn::Item::Type(i) => &i.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        if is_test(attrs) {
            return;
        }
        match item {
            // Submodules are walked as modules of their own.
            syn::Item::Mod(_) => {}
            syn::Item::Use(u) => collect_use(&u.tree, Vec::new(), self.module),
            _ => syn::visit::visit_item(self, item),
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test(&f.attrs) {
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    // `pub(crate)`, `pub(super)`: a visibility names no item.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if p.leading_colon.is_none() && !segs.is_empty() {
            self.module.paths.push(segs);
        }
        syn::visit::visit_path(self, p);
    }
}

/// Records the names a `use` tree binds and the paths it names.
fn collect_use(tree: &syn::UseTree, prefix: Vec<String>, m: &mut Module) {
    let with = |name: &syn::Ident| {
        let mut p = prefix.clone();
        p.push(name.to_string());
        p
    };
    match tree {
        syn::UseTree::Path(p) => collect_use(&p.tree, with(&p.ident), m),
        syn::UseTree::Name(n) => {
            let full = if n.ident == "self" {
                prefix.clone()
            } else {
                with(&n.ident)
            };
            if let Some(last) = full.last() {
                m.uses.insert(last.clone(), full.clone());
            }
            m.paths.push(full);
        }
        syn::UseTree::Rename(r) => {
            let full = if r.ident == "self" {
                prefix.clone()
            } else {
                with(&r.ident)
            };
            m.uses.insert(r.rename.to_string(), full.clone());
            m.paths.push(full);
        }
        syn::UseTree::Glob(_) => m.paths.push(prefix),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                collect_use(t, prefix.clone(), m);
            }
        }
    }
}

impl Graph {
    /// Reads the crate whose root file is `root` (lib.rs or main.rs).
    pub fn read(root: &Path) -> Result<Graph, GraphError> {
        let mut g = Graph::default();
        let dir = root.parent().unwrap_or(Path::new(".")).to_path_buf();
        g.read_file(root, Vec::new(), &dir)?;
        g.resolve();
        Ok(g)
    }

    /// Every module, with its file.
    pub fn modules(&self) -> impl Iterator<Item = (&ModPath, &Path)> {
        self.modules.iter().map(|(k, m)| (k, m.file.as_path()))
    }

    /// Reads one file as module `path`; its submodules' files are in `dir`.
    fn read_file(&mut self, file: &Path, path: ModPath, dir: &Path) -> Result<(), GraphError> {
        let text = std::fs::read_to_string(file).map_err(|e| GraphError::Read(file.into(), e))?;
        let ast = syn::parse_file(&text).map_err(|e| GraphError::Parse(file.into(), e))?;
        self.read_items(&ast.items, file, path, dir)
    }

    /// Reads the items of module `path` (a file's or an inline module's).
    fn read_items(
        &mut self,
        items: &[syn::Item],
        file: &Path,
        path: ModPath,
        dir: &Path,
    ) -> Result<(), GraphError> {
        let mut module = Module {
            file: file.to_path_buf(),
            ..Module::default()
        };
        let mut subs = Vec::new();
        for item in items {
            Collector {
                module: &mut module,
            }
            .visit_item(item);
            if let syn::Item::Mod(m) = item {
                if !is_test(&m.attrs) {
                    module.children.insert(m.ident.to_string());
                    subs.push(m);
                }
            }
        }
        self.modules.insert(path.clone(), module);
        for m in subs {
            let name = m.ident.to_string();
            let mut sub = path.clone();
            sub.push(name.clone());
            let sub_dir = dir.join(&name);
            match &m.content {
                Some((_, items)) => self.read_items(items, file, sub, &sub_dir)?,
                None => {
                    let flat = dir.join(format!("{name}.rs"));
                    let nested = sub_dir.join("mod.rs");
                    let found = if flat.is_file() { flat } else { nested };
                    if !found.is_file() {
                        return Err(GraphError::Missing(file.into(), name));
                    }
                    self.read_file(&found, sub, &sub_dir)?;
                }
            }
        }
        Ok(())
    }

    /// Turns every module's paths into edges.
    fn resolve(&mut self) {
        let mut edges: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
        for (from, m) in &self.modules {
            let out = edges.entry(from.clone()).or_default();
            for p in &m.paths {
                if let Some(to) = self.target(from, p, 0) {
                    if &to != from {
                        out.insert(to);
                    }
                }
            }
        }
        self.edges = edges;
    }

    /// The absolute form of `p` as written in module `at`, when it names
    /// something in this crate.
    fn absolute(&self, at: &ModPath, p: &[String]) -> Option<Vec<String>> {
        let (first, rest) = p.split_first()?;
        let mut base = match first.as_str() {
            "crate" => Vec::new(),
            "self" => at.clone(),
            "super" => {
                let mut b = at.clone();
                b.pop()?;
                b
            }
            name => {
                let here = self.modules.get(at)?;
                if here.children.contains(name) {
                    let mut b = at.clone();
                    b.push(name.to_owned());
                    b
                } else if let Some(bound) = here.uses.get(name) {
                    // A name a `use` bound: resolve what it was bound to.
                    if bound.as_slice() == p {
                        return None;
                    }
                    let mut full = self.absolute(at, bound)?;
                    full.extend(rest.iter().cloned());
                    return Some(full);
                } else {
                    return None;
                }
            }
        };
        let mut rest = rest;
        while let Some((s, more)) = rest.split_first() {
            if s == "super" {
                base.pop()?;
                rest = more;
            } else {
                break;
            }
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// The module that defines what `p` (written in `at`) names, following
    /// re-exports; `None` when it is outside the crate.
    fn target(&self, at: &ModPath, p: &[String], depth: u32) -> Option<ModPath> {
        let full = self.absolute(at, p)?;
        let mut n = full.len();
        while n > 0 && !self.modules.contains_key(&full[..n]) {
            n -= 1;
        }
        let module = full[..n].to_vec();
        // `module::name…` where `name` is one of module's imports: the
        // item lives where that import points.
        if let (Some(name), true) = (full.get(n), depth < 16) {
            if let Some(m) = self.modules.get(&module) {
                if let Some(bound) = m.uses.get(name) {
                    let mut through = bound.clone();
                    through.extend(full[n + 1..].iter().cloned());
                    if let Some(t) = self.target(&module, &through, depth + 1) {
                        return Some(t);
                    }
                }
            }
        }
        Some(module)
    }

    /// The graph's strongly connected components with more than one
    /// module: each is a dependency cycle.
    pub fn cycles(&self) -> Vec<Vec<ModPath>> {
        let nodes: Vec<&ModPath> = self.modules.keys().collect();
        let index: BTreeMap<&ModPath, usize> =
            nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
        let succ: Vec<Vec<usize>> = nodes
            .iter()
            .map(|n| {
                self.edges
                    .get(*n)
                    .into_iter()
                    .flatten()
                    .filter_map(|t| index.get(t).copied())
                    .collect()
            })
            .collect();
        tarjan(&succ)
            .into_iter()
            .filter(|c| c.len() > 1)
            .map(|c| c.into_iter().map(|i| nodes[i].clone()).collect())
            .collect()
    }

    /// One shortest cycle through `start` inside `within`, for a readable
    /// failure.
    pub fn example_cycle(&self, start: &ModPath, within: &[ModPath]) -> Vec<ModPath> {
        let inside: BTreeSet<&ModPath> = within.iter().collect();
        let mut prev: BTreeMap<ModPath, ModPath> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start.clone()]);
        while let Some(n) = queue.pop_front() {
            for t in self.edges.get(&n).into_iter().flatten() {
                if t == start {
                    let mut path = vec![n.clone()];
                    let mut cur = n.clone();
                    while let Some(p) = prev.get(&cur) {
                        path.push(p.clone());
                        cur = p.clone();
                    }
                    path.reverse();
                    path.push(start.clone());
                    return path;
                }
                if inside.contains(t) && !prev.contains_key(t) && t != start {
                    prev.insert(t.clone(), n.clone());
                    queue.push_back(t.clone());
                }
            }
        }
        vec![start.clone()]
    }
}

/// Tarjan's strongly connected components, iteratively.
fn tarjan(succ: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let n = succ.len();
    let (mut index, mut low, mut on) = (vec![usize::MAX; n], vec![0; n], vec![false; n]);
    let (mut stack, mut out, mut next) = (Vec::new(), Vec::new(), 0);
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        let mut work = vec![(root, 0usize)];
        while let Some((v, i)) = work.pop() {
            if i == 0 {
                index[v] = next;
                low[v] = next;
                next += 1;
                stack.push(v);
                on[v] = true;
            }
            if let Some(&w) = succ[v].get(i) {
                work.push((v, i + 1));
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut comp = Vec::new();
                while let Some(w) = stack.pop() {
                    on[w] = false;
                    comp.push(w);
                    if w == v {
                        break;
                    }
                }
                out.push(comp);
            }
        }
    }
    out
}

/// Every crate root the workspace at `ws` ships: libraries and binaries.
pub fn crate_roots(ws: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = vec![
        ws.join("policy/src/lib.rs"),
        ws.join("supervisor/src/lib.rs"),
        ws.join("child-runner/src/lib.rs"),
        ws.join("child-runner/src/main.rs"),
    ];
    let mut bins = Vec::new();
    for bin in std::fs::read_dir(ws.join("supervisor/src/bin"))? {
        bins.push(bin?.path());
    }
    bins.sort();
    out.extend(bins);
    Ok(out)
}

/// The lines of `file` that are not test code (`#[cfg(test)]` items at
/// the top level are not counted).
pub fn production_lines(file: &Path) -> Result<usize, GraphError> {
    let text = std::fs::read_to_string(file).map_err(|e| GraphError::Read(file.into(), e))?;
    let ast = syn::parse_file(&text).map_err(|e| GraphError::Parse(file.into(), e))?;
    let total = text.lines().count();
    let tests: usize = ast
        .items
        .iter()
        .filter_map(|item| match item {
            syn::Item::Mod(m) if is_test(&m.attrs) => {
                use syn::spanned::Spanned;
                let s = m.span();
                Some(s.end().line + 1 - s.start().line)
            }
            _ => None,
        })
        .sum();
    Ok(total - tests)
}
