//! A run being made: what its creation has made so far (its folder under a
//! draft name, its temp dir, its worktree, its uid lease), undone when the
//! draft is dropped unless it was published.
//!
//! The folder is written as `<state>/drafts/<run id>.tmp-<8 hex>` and
//! renamed to its session's `runs/<run id>` once the run is recorded, so a
//! run folder is never seen half made; recovery sweeps the one drafts
//! folder (see [`is_draft_name`]). Its files are not fsynced: the run's
//! records (its row and runner spec) are in state.db, and every file here
//! is made again from them or only observes; its entries are fsynced when
//! the draft is published.

use super::error::{StorageError, WorkspaceError};
use super::EngineError;
use crate::ids::RunId;
use crate::paths::RunFiles;
use crate::run::worktree::Worktree;
use crate::uids::UidLease;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use subagent_runner::atomic::fsync_dir;
use subagent_runner::ioerr::at;

/// What separates a draft folder's name from its run id.
const DRAFT_MARK: &str = ".tmp-";

/// Whether `name` (an entry of a `runs/` or drafts folder) is a draft run
/// folder.
pub fn is_draft_name(name: &str) -> bool {
    draft_run_id(name).is_some()
}

/// The run id a draft folder named `name` is for.
pub fn draft_run_id(name: &str) -> Option<RunId> {
    RunId::parse(name.split_once(DRAFT_MARK)?.0)
}

fn storage(op: &'static str, path: &Path, source: std::io::Error) -> EngineError {
    EngineError::StateDir(StorageError::Io(at(op, path)(source)))
}

fn mkdir_private(path: &Path, recursive: bool) -> Result<(), EngineError> {
    std::fs::DirBuilder::new()
        .recursive(recursive)
        .mode(0o700)
        .create(path)
        .map_err(|e| storage("create", path, e))
}

/// Makes the new file `path` (0600) holding `bytes`, not yet fsynced.
pub fn create_file(path: &Path, bytes: &[u8]) -> Result<std::fs::File, EngineError> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| storage("create", path, e))?;
    f.write_all(bytes).map_err(|e| storage("write", path, e))?;
    Ok(f)
}

/// A worktree made for the run, with what removing it needs.
struct MadeWorktree {
    project_dir: PathBuf,
    worktree: Worktree,
}

/// A run being made. Dropping it removes what it made; [`RunDraft::publish`]
/// keeps it.
pub struct RunDraft {
    id: RunId,
    /// The session's `runs/`, where the folder is renamed to its run id.
    runs_dir: PathBuf,
    /// The folder being written, under its draft name.
    draft_dir: PathBuf,
    /// Renamed to its run id (then that name is what a failure removes).
    renamed: bool,
    temp_dir: Option<PathBuf>,
    worktree: Option<MadeWorktree>,
    lease: Option<UidLease>,
    published: bool,
}

impl RunDraft {
    /// Starts run `id` of `runs_dir` (made if missing): its draft folder
    /// in `drafts` with empty `artifacts/`, `context/` and `delta/`. The
    /// draft holds `lease` until it is published.
    pub fn begin(
        drafts: &Path,
        runs_dir: PathBuf,
        id: RunId,
        lease: Option<UidLease>,
    ) -> Result<RunDraft, EngineError> {
        mkdir_private(&runs_dir, true)?;
        mkdir_private(drafts, true)?;
        let name = format!("{id}{DRAFT_MARK}{}", crate::ids::random_hex8());
        let draft = RunDraft {
            draft_dir: drafts.join(name),
            id,
            runs_dir,
            renamed: false,
            temp_dir: None,
            worktree: None,
            lease,
            published: false,
        };
        mkdir_private(&draft.draft_dir, false)?;
        let staged = draft.staged();
        for dir in [staged.artifacts(), staged.context(), staged.delta_dir()] {
            mkdir_private(&dir, false)?;
        }
        Ok(draft)
    }

    /// The run's id.
    pub fn id(&self) -> &RunId {
        &self.id
    }

    /// The run's files where they will live (the paths its records hold).
    pub fn files(&self) -> RunFiles {
        RunFiles {
            dir: self.runs_dir.join(self.id.as_str()),
        }
    }

    /// The run's files in the draft folder, where they are written now.
    pub fn staged(&self) -> RunFiles {
        RunFiles {
            dir: self.draft_dir.clone(),
        }
    }

    /// The run's uid, when it has one of its own.
    pub fn uid(&self) -> Option<u32> {
        self.lease.as_ref().map(|l| l.uid)
    }

    /// Makes the run's temp dir under `temp_base` (see
    /// [`crate::securedir::make_temp_dir`]).
    pub fn make_temp_dir(
        &mut self,
        temp_base: &Path,
        session: &str,
    ) -> Result<PathBuf, EngineError> {
        let t = crate::securedir::make_temp_dir(temp_base, session)
            .map_err(|e| EngineError::RunDirs(WorkspaceError::TempDir(e)))?;
        self.temp_dir = Some(t.clone());
        Ok(t)
    }

    /// Makes the run's git worktree of `project_dir` (see
    /// [`super::worktree::create_worktree`]).
    pub fn make_worktree(
        &mut self,
        project_dir: &Path,
        session_dir: &Path,
    ) -> Result<Worktree, EngineError> {
        let w = super::worktree::create_worktree(project_dir, session_dir, self.id.as_str())?;
        self.worktree = Some(MadeWorktree {
            project_dir: project_dir.to_path_buf(),
            worktree: w.clone(),
        });
        Ok(w)
    }

    /// The run's uid lease, while the draft holds it.
    pub fn lease(&self) -> Option<&UidLease> {
        self.lease.as_ref()
    }

    /// Writes the new file `path` in the draft (not fsynced).
    pub fn write(&mut self, path: &Path, bytes: &[u8]) -> Result<(), EngineError> {
        create_file(path, bytes).map(drop)
    }

    /// Makes the folder's own entries durable.
    pub fn sync(&mut self) -> Result<(), EngineError> {
        fsync_dir(&self.draft_dir).map_err(|e| EngineError::StateDir(e.into()))
    }

    /// Keeps everything made, under the draft name: the run is recorded,
    /// and recovery puts its folder in place.
    pub fn keep(&mut self) {
        self.published = true;
    }

    /// Makes the entries durable ([`RunDraft::sync`]) and gives the folder
    /// its run id, durably (the rename, the runs folder). Everything made
    /// is kept from then on; a failure leaves it to be undone on drop.
    pub fn publish(&mut self) -> Result<(), EngineError> {
        self.sync()?;
        let dest = self.files().dir;
        std::fs::rename(&self.draft_dir, &dest)
            .map_err(|e| storage("rename into place", &dest, e))?;
        self.renamed = true;
        fsync_dir(&self.runs_dir).map_err(|e| EngineError::StateDir(e.into()))?;
        self.published = true;
        Ok(())
    }

    /// Takes the uid lease out of a published draft (to hold until the
    /// run's runner has it).
    pub fn take_lease(&mut self) -> Option<UidLease> {
        self.lease.take()
    }
}

impl Drop for RunDraft {
    fn drop(&mut self) {
        if self.published {
            return;
        }
        if let Some(w) = &self.worktree {
            let _ = super::worktree::remove_worktree(&w.project_dir, &w.worktree, self.id.as_str());
        }
        let dir = if self.renamed {
            self.files().dir
        } else {
            self.draft_dir.clone()
        };
        let _ = std::fs::remove_dir_all(dir);
        if let Some(t) = &self.temp_dir {
            let _ = std::fs::remove_dir_all(t);
            crate::securedir::remove_empty_session_dir(t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draft_names_are_recognised_and_run_ids_are_not() {
        let id = RunId::new();
        assert!(is_draft_name(&format!("{id}.tmp-0123abcd")));
        assert!(!is_draft_name(id.as_str()));
        assert!(!is_draft_name("notarunid.tmp-0123abcd"));
        assert!(!is_draft_name(".tmp-0123abcd"));
    }

    #[test]
    fn a_published_draft_is_the_run_folder_and_nothing_else_is_left() {
        let root = tempfile::tempdir().unwrap();
        let runs = root.path().join("s").join("runs");
        let drafts = root.path().join("drafts");
        let mut draft = RunDraft::begin(&drafts, runs.clone(), RunId::new(), None).unwrap();
        let (files, staged) = (draft.files(), draft.staged());
        assert!(is_draft_name(
            staged.dir.file_name().unwrap().to_str().unwrap()
        ));
        draft.write(&staged.observed_before(), b"{}").unwrap();
        draft.write(&staged.context().join("a"), b"x").unwrap();
        // A draft's files are new: an existing one is never written through.
        assert!(draft.write(&staged.observed_before(), b"[]").is_err());
        draft.publish().unwrap();
        assert!(draft.take_lease().is_none());
        drop(draft);
        assert_eq!(std::fs::read(files.observed_before()).unwrap(), b"{}");
        assert_eq!(std::fs::read(files.context().join("a")).unwrap(), b"x");
        assert!(files.artifacts().is_dir() && files.delta_dir().is_dir());
        assert_eq!(std::fs::read_dir(&runs).unwrap().count(), 1);
        assert_eq!(std::fs::read_dir(&drafts).unwrap().count(), 0);
    }

    #[test]
    fn a_dropped_draft_removes_its_folder_and_temp_dir() {
        let root = tempfile::tempdir().unwrap();
        let runs = root.path().join("runs");
        let base = root.path().join("tmp");
        let drafts = root.path().join("drafts");
        let mut draft = RunDraft::begin(&drafts, runs.clone(), RunId::new(), None).unwrap();
        let t = draft.make_temp_dir(&base, "s").unwrap();
        assert!(t.is_dir());
        let record = draft.staged().observed_before();
        draft.write(&record, b"{}").unwrap();
        drop(draft);
        assert_eq!(std::fs::read_dir(&runs).unwrap().count(), 0);
        assert_eq!(std::fs::read_dir(&drafts).unwrap().count(), 0);
        assert!(!t.exists() && !base.join("s").exists());
    }
}
