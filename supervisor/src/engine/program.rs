//! The agent program and what it needs to start, for their Landlock
//! execute rules: its `#!` interpreter, the program that interpreter's
//! `env` runs, and the dynamic loader (PT_INTERP) of each ELF among them.
//!
//! Each element is a regular file at a canonical path, checked on a
//! descriptor opened with no symlink on the way, and granted as that one
//! file: never a directory, never `/`. The program itself may lie where a
//! child can write (a project script is a legitimate agent), but what its
//! bytes name is then child-controlled: such an element is refused when it
//! too lies where a child can write, and a loader named by such an ELF
//! must be a dynamic loader in the system roots. A refused element gets no
//! rule (the child cannot execute it); the reason is logged.

use super::state::Inner;
use crate::paths::RunFiles;
use crate::protocol::SpawnParams;
use policy::sandbox::program::{
    elf_interpreter, in_system_roots, is_loader_name, shebang, shebang_env_target,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use subagent_runner::safefile::{self, SafeFileError};

/// The bytes of an element read: a `#!` line, or an ELF's program headers
/// and its PT_INTERP.
const HEAD: u64 = 4096;

/// Why an element was left out of the chain.
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    /// The name resolves to nothing.
    #[error("{name:?} is not found")]
    NotFound {
        /// The name, as given.
        name: String,
    },
    /// The file is not a regular file (or changed under the check).
    #[error(transparent)]
    File(#[from] SafeFileError),
    /// A child-controlled file names a file a child can write.
    #[error("{path}, named by {by} (which a child can write), lies where a child can write")]
    Writable {
        /// The element.
        path: PathBuf,
        /// The file whose bytes named it.
        by: PathBuf,
    },
    /// An ELF's PT_INTERP is not a dynamic loader it may name.
    #[error("{path}, the PT_INTERP of {by}, is not a dynamic loader{where_}")]
    NotALoader {
        /// The element.
        path: PathBuf,
        /// The ELF.
        by: PathBuf,
        /// Where it had to be, when that is why.
        where_: &'static str,
    },
}

/// The places a child can write (canonical where they resolve).
#[derive(Debug, Clone, Default)]
pub struct WritableRoots(Vec<PathBuf>);

impl WritableRoots {
    /// The roots, canonicalized where they resolve.
    pub fn new(roots: impl IntoIterator<Item = PathBuf>) -> WritableRoots {
        WritableRoots(
            roots
                .into_iter()
                .map(|r| r.canonicalize().unwrap_or(r))
                .collect(),
        )
    }

    /// Whether the canonical `path` lies in one of them.
    pub fn holds(&self, path: &Path) -> bool {
        self.0.iter().any(|r| path.starts_with(r))
    }
}

/// One element: its canonical path, its first bytes, and whether a child
/// can write where it lies.
#[derive(Debug)]
struct Element {
    path: PathBuf,
    head: Vec<u8>,
    writable: bool,
}

/// The file `name` runs as the child's `execvp` finds it (`PATH` unless it
/// has a `/`; relative to `cwd`), canonical, checked to be a regular file.
pub fn resolve_program(
    name: &str,
    path_var: Option<&str>,
    cwd: &Path,
) -> Result<PathBuf, ChainError> {
    let candidate = if name.contains('/') {
        Some(cwd.join(name))
    } else {
        // execvp's default when PATH is unset.
        path_var
            .unwrap_or("/bin:/usr/bin")
            .split(':')
            .map(|d| cwd.join(d).join(name))
            .find(|p| p.is_file())
    };
    let not_found = || ChainError::NotFound {
        name: name.to_owned(),
    };
    let canonical = candidate
        .ok_or_else(not_found)?
        .canonicalize()
        .map_err(|_| not_found())?;
    // Opened again with no link anywhere on the way: a link there now was
    // put there since the path was resolved.
    safefile::open_unlinked(&canonical)?;
    Ok(canonical)
}

fn element(path: PathBuf, writable: &WritableRoots) -> Result<Element, ChainError> {
    let head = safefile::open_unlinked(&path)?.read_head(HEAD)?;
    Ok(Element {
        writable: writable.holds(&path),
        path,
        head,
    })
}

/// `name` resolved as an element named by `by`'s bytes: refused when `by`
/// and it both lie where a child can write.
fn derived(
    name: &str,
    by: &Element,
    path_var: Option<&str>,
    cwd: &Path,
    writable: &WritableRoots,
) -> Result<Element, ChainError> {
    let e = element(resolve_program(name, path_var, cwd)?, writable)?;
    if by.writable && e.writable {
        return Err(ChainError::Writable {
            path: e.path,
            by: by.path.clone(),
        });
    }
    Ok(e)
}

/// The dynamic loader the ELF `by` names, if it names one it may.
fn loader(
    by: &Element,
    cwd: &Path,
    writable: &WritableRoots,
) -> Option<Result<PathBuf, ChainError>> {
    let named = elf_interpreter(&by.head)?;
    let check = || {
        let path = resolve_program(&named.to_string_lossy(), None, cwd)?;
        let not_a_loader = |where_| ChainError::NotALoader {
            path: path.clone(),
            by: by.path.clone(),
            where_,
        };
        if !is_loader_name(&path) {
            return Err(not_a_loader(""));
        }
        if by.writable && (!in_system_roots(&path) || writable.holds(&path)) {
            return Err(not_a_loader(" in the system roots"));
        }
        Ok(path)
    };
    Some(check())
}

/// The agent program and what it needs to start, and what was refused.
#[derive(Debug, Default)]
pub struct Chain {
    /// The elements to grant, each once.
    pub programs: Vec<PathBuf>,
    /// What was left out, and why.
    pub refused: Vec<ChainError>,
}

/// The chain of `argv0` as the child would run it from `cwd` with `PATH`
/// `path_var`; see the module doc.
pub fn program_chain(
    argv0: &str,
    path_var: Option<&str>,
    cwd: &Path,
    writable: &WritableRoots,
) -> Chain {
    let mut chain = Chain::default();
    let program = match resolve_program(argv0, path_var, cwd).and_then(|p| element(p, writable)) {
        Ok(e) => e,
        Err(e) => {
            chain.refused.push(e);
            return chain;
        }
    };
    let mut elements = Vec::new();
    if let Some(line) = shebang(&program.head) {
        // The kernel resolves a relative interpreter from the cwd, never
        // through PATH.
        let interp = line.interpreter.to_string_lossy().into_owned();
        let interp = if interp.contains('/') {
            interp
        } else {
            format!("./{interp}")
        };
        let named = [Some(interp), shebang_env_target(&line)];
        for name in named.into_iter().flatten() {
            match derived(&name, &program, path_var, cwd, writable) {
                Ok(e) => elements.push(e),
                Err(e) => chain.refused.push(e),
            }
        }
    }
    elements.insert(0, program);
    for e in &elements {
        match loader(e, cwd, writable) {
            Some(Ok(l)) if !chain.programs.contains(&l) => chain.programs.push(l),
            Some(Err(why)) => chain.refused.push(why),
            _ => {}
        }
        if !chain.programs.contains(&e.path) {
            chain.programs.push(e.path.clone());
        }
    }
    chain
}

/// Where a child of this run, or of another run, can write: the project
/// (and the run's worktree), the run's own dirs, every run's temp and
/// state, the requested and configured write paths, and the world's
/// temporary dirs.
fn writable_roots(
    inner: &Inner,
    p: &SpawnParams,
    workdir: &Path,
    temp_dir: &Path,
    files: &RunFiles,
) -> WritableRoots {
    let mut roots = vec![
        p.session.project_dir.clone(),
        workdir.to_path_buf(),
        temp_dir.to_path_buf(),
        files.artifacts(),
        files.delta_dir(),
        inner.cfg.temp_base.clone(),
        inner.cfg.state_dir.clone(),
    ];
    roots.extend(["/tmp", "/var/tmp", "/dev/shm"].map(PathBuf::from));
    roots.extend(p.sandbox.write_paths.iter().cloned());
    roots.extend(inner.cfg.settings.write_paths.iter().cloned());
    WritableRoots::new(roots)
}

/// The program chain of a run being created (see [`program_chain`]); what
/// is refused is logged.
pub(crate) fn for_run(
    inner: &Inner,
    p: &SpawnParams,
    argv0: &str,
    env: &BTreeMap<String, String>,
    workdir: &Path,
    temp_dir: &Path,
    files: &RunFiles,
) -> Vec<PathBuf> {
    let writable = writable_roots(inner, p, workdir, temp_dir, files);
    let chain = program_chain(
        argv0,
        env.get("PATH").map(String::as_str),
        workdir,
        &writable,
    );
    for why in &chain.refused {
        tracing::warn!(session = %p.session.id, "no execute rule for the agent program's chain: {why}");
    }
    chain.programs
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// An executable file at `dir/name` holding `bytes`.
    fn exe(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p.canonicalize().unwrap()
    }

    /// A minimal 64-bit little-endian ELF header with one PT_INTERP
    /// program header naming `interp`.
    fn elf(interp: &str) -> Vec<u8> {
        let mut b = vec![0u8; 64 + 56];
        b[..6].copy_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1]);
        b[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        b[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        b[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        b[64..68].copy_from_slice(&3u32.to_le_bytes());
        b[72..80].copy_from_slice(&120u64.to_le_bytes());
        let size = interp.len() as u64 + 1;
        b[96..104].copy_from_slice(&size.to_le_bytes());
        b.extend_from_slice(interp.as_bytes());
        b.push(0);
        b
    }

    fn system(p: &str) -> PathBuf {
        Path::new(p).canonicalize().unwrap()
    }

    struct Case {
        _dir: tempfile::TempDir,
        root: PathBuf,
        writable: WritableRoots,
    }

    /// A temp dir that counts as a writable root.
    fn case() -> Case {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        Case {
            writable: WritableRoots::new([root.clone()]),
            root,
            _dir: dir,
        }
    }

    impl Case {
        fn chain(&self, argv0: &str) -> Chain {
            program_chain(argv0, Some("/usr/bin:/bin"), &self.root, &self.writable)
        }
    }

    fn refusals(c: &Chain) -> String {
        c.refused
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    }

    #[test]
    fn the_env_options_attack_grants_env_and_python_never_the_root() {
        let c = case();
        let script = exe(
            &c.root,
            "agent.sh",
            b"#!/usr/bin/env -S -u / /usr/bin/python3\nprint(1)\n",
        );
        let chain = c.chain("./agent.sh");
        assert!(chain.refused.is_empty(), "{}", refusals(&chain));
        assert!(chain.programs.contains(&script));
        assert!(chain.programs.contains(&system("/usr/bin/env")));
        assert!(chain.programs.contains(&system("/usr/bin/python3")));
        for p in &chain.programs {
            assert!(p.is_file(), "{}", p.display());
        }
    }

    #[test]
    fn directories_fifos_and_links_to_directories_are_never_granted() {
        let c = case();
        std::fs::create_dir(c.root.join("d")).unwrap();
        std::os::unix::fs::symlink(c.root.join("d"), c.root.join("to-dir")).unwrap();
        nix::unistd::mkfifo(&c.root.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let outside = tempfile::tempdir().unwrap();
        let outside_dir = outside.path().canonicalize().unwrap();
        std::os::unix::fs::symlink(&outside_dir, c.root.join("out-link")).unwrap();
        for (line, want) in [
            ("#!/\n", "a directory"),
            (
                &*format!("#!{}\n", c.root.join("d").display()),
                "a directory",
            ),
            (
                &*format!("#!{}\n", c.root.join("to-dir").display()),
                "a directory",
            ),
            (&*format!("#!{}\n", c.root.join("fifo").display()), "a FIFO"),
            (&*format!("#!{}\n", outside_dir.display()), "a directory"),
            ("#!/usr/bin/env -S --split / x\n", "a directory"),
        ] {
            let script = exe(&c.root, "agent", line.as_bytes());
            let chain = c.chain("./agent");
            assert_eq!(chain.programs[0], script, "{line}");
            for p in &chain.programs {
                assert!(p.is_file(), "{line}: {}", p.display());
            }
            assert!(
                refusals(&chain).contains(want),
                "{line}: {}",
                refusals(&chain)
            );
        }
        // The program itself: a directory, `/`, a FIFO, a link to a
        // directory are no programs.
        for argv0 in ["/", "./d", "./fifo", "./to-dir", "./out-link"] {
            let chain = c.chain(argv0);
            assert!(chain.programs.is_empty(), "{argv0}: {:?}", chain.programs);
            assert_eq!(chain.refused.len(), 1, "{argv0}");
        }
    }

    #[test]
    fn what_a_writable_script_names_must_lie_outside_the_writable_roots() {
        let c = case();
        let interp = exe(&c.root, "interp", b"#!/bin/sh\n");
        exe(
            &c.root,
            "agent",
            format!("#!{}\n", interp.display()).as_bytes(),
        );
        let chain = c.chain("./agent");
        assert!(!chain.programs.contains(&interp));
        assert!(
            refusals(&chain).contains("lies where a child can write"),
            "{}",
            refusals(&chain)
        );
        // A script outside the writable roots may name one there (the
        // operator's choice), and the project's own script is granted as
        // that one file.
        let trusted = tempfile::tempdir().unwrap();
        let t = exe(
            trusted.path(),
            "tool",
            format!("#!{}\n", interp.display()).as_bytes(),
        );
        let chain = program_chain(t.to_str().unwrap(), None, &c.root, &c.writable);
        assert!(chain.programs.contains(&interp), "{}", refusals(&chain));
        assert!(chain.programs.contains(&t));
    }

    #[test]
    fn a_writable_elf_may_name_only_a_system_loader() {
        let c = case();
        let bash = exe(&c.root, "bad-elf", &elf("/bin/bash"));
        let chain = c.chain("./bad-elf");
        assert_eq!(chain.programs, vec![bash]);
        assert!(
            refusals(&chain).contains("is not a dynamic loader"),
            "{}",
            refusals(&chain)
        );
        let fake = exe(&c.root, "ld-linux-x86-64.so.2", b"not a loader");
        exe(&c.root, "elf2", &elf(fake.to_str().unwrap()));
        let chain = c.chain("./elf2");
        assert!(!chain.programs.contains(&fake));
        assert!(
            refusals(&chain).contains("in the system roots"),
            "{}",
            refusals(&chain)
        );
        // A real loader is granted.
        let sh = std::fs::read("/bin/sh").unwrap();
        if let Some(l) = elf_interpreter(&sh[..sh.len().min(4096)]) {
            let copy = exe(&c.root, "sh-copy", &sh);
            let chain = c.chain("./sh-copy");
            assert!(chain.refused.is_empty(), "{}", refusals(&chain));
            assert_eq!(chain.programs, vec![l.canonicalize().unwrap(), copy]);
        }
    }

    #[test]
    fn names_resolve_through_path_and_relative_to_the_cwd() {
        let c = case();
        std::fs::create_dir(c.root.join("bin")).unwrap();
        let tool = exe(&c.root.join("bin"), "tool", b"#!/bin/sh\n");
        let chain = program_chain("tool", Some("bin:/usr/bin"), &c.root, &c.writable);
        assert!(chain.programs.contains(&tool), "{}", refusals(&chain));
        assert!(chain.programs.contains(&system("/bin/sh")));
        let chain = c.chain("no-such-program-xyz");
        assert!(chain.programs.is_empty());
        assert!(refusals(&chain).contains("not found"));
    }
}
