//! The upgrade import of a state dir of per-run JSON files (run.json,
//! notices/, session.json) into the database, idempotent.
//!
//! Every file read here is one a child may have reached: each is opened
//! without following a symlink, must be a regular file and is read up to a
//! bound. Rows are written with INSERT OR IGNORE in batches, and the
//! `import_v1` mark is `done` only at the end, so an import killed at any
//! point runs again and adds nothing twice. The old files stay (their
//! cleanup is a later phase).

use super::error::{Result, StoreError};
use super::runs::{self, sql};
use super::writer::{put_blob, set_meta};
use crate::ids::{RunId, SessionId};
use crate::paths::StateLayout;
use crate::run::record::{EndState, Ended, Phase, RunRecord, RunState};
use crate::sessions::SessionState;
use rusqlite::Connection;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use subagent_runner::safefile;

/// The mark: absent or `running` until the import is done.
pub const MARK: &str = "import_v1";
/// Runs per transaction.
const BATCH: usize = 500;
/// The largest run.json read.
const RECORD_MAX: u64 = 64 << 20;
/// The largest runner.json read.
const SPEC_MAX: u64 = 16 << 20;
/// The largest session.json read.
const SESSION_MAX: u64 = 1 << 20;

/// The open transaction and how many runs it holds.
struct Batch<'a> {
    conn: &'a Connection,
    path: &'a Path,
    runs: usize,
}

impl Batch<'_> {
    fn begin(&self) -> Result<()> {
        self.conn
            .execute_batch("BEGIN IMMEDIATE")
            .map_err(sql(self.path))
    }

    fn commit(&self) -> Result<()> {
        self.conn
            .execute_batch("COMMIT")
            .map_err(|source| StoreError::Commit {
                path: self.path.into(),
                source,
                errno: None,
            })
    }

    /// Counts a run; every [`BATCH`] runs, commits and begins again.
    fn one_more(&mut self) -> Result<()> {
        self.runs += 1;
        if self.runs.is_multiple_of(BATCH) {
            self.commit()?;
            self.begin()?;
        }
        Ok(())
    }
}

/// Imports the old state dir under `layout`, unless done before.
pub(super) fn import(conn: &mut Connection, path: &Path, layout: &StateLayout) -> Result<()> {
    if super::query::meta(conn, path, MARK)?.as_deref() == Some("done") {
        return Ok(());
    }
    let sessions = subdirs(path, &layout.sessions())?;
    let mut batch = Batch {
        conn,
        path,
        runs: 0,
    };
    batch.begin()?;
    if !sessions.is_empty() {
        set_meta(conn, path, MARK, Some("running"))?;
        batch.commit()?;
        batch.begin()?;
    }
    for (name, dir) in sessions {
        if SessionId::parse(&name).is_err() {
            tracing::warn!(dir = %dir.display(), "not importing a folder that is not a session");
            continue;
        }
        import_session(&mut batch, &name, &dir)?;
    }
    set_meta(conn, path, MARK, Some("done"))?;
    batch.commit()?;
    if batch.runs > 0 {
        tracing::info!(runs = batch.runs, "imported the runs of the old state dir");
    }
    Ok(())
}

/// The folders in `dir` (not following links), by name; none when it is
/// missing.
fn subdirs(path: &Path, dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(StoreError::Io {
                path: path.into(),
                op: "list",
                at: dir.into(),
                source,
            })
        }
    };
    let mut out: Vec<(String, PathBuf)> = rd
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
        .collect();
    out.sort();
    Ok(out)
}

/// The names of the files in `dir` that end in `.json`.
fn json_names(dir: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.ends_with(".json") && !n.starts_with('.'))
        .collect()
}

/// The run ids with a notice in pending/ (`<ended_ms>-<run_id>.json`) and
/// in taken/ (`<run_id>.json`).
fn notices(dir: &Path) -> (HashSet<String>, HashSet<String>) {
    let id_of = |n: &str| Some(n.strip_suffix(".json")?.split_once('-')?.1.to_owned());
    let pending = json_names(&dir.join("pending"))
        .iter()
        .filter_map(|n| id_of(n))
        .collect();
    let taken = json_names(&dir.join("taken"))
        .iter()
        .filter_map(|n| Some(n.strip_suffix(".json")?.to_owned()))
        .collect();
    (pending, taken)
}

/// A session: its session.json, then each of its runs.
fn import_session(batch: &mut Batch<'_>, name: &str, dir: &Path) -> Result<()> {
    let file = dir.join("session.json");
    match safefile::read(&file, SESSION_MAX) {
        Ok(bytes) => {
            // One that cannot be read is the daemon's, as it was.
            let s: SessionState = serde_json::from_slice(&bytes).unwrap_or_default();
            let now = crate::timefmt::now_ms();
            super::sessions::put(batch.conn, batch.path, name, &s, now, true)?;
        }
        Err(e) if e.is_missing() => {}
        Err(e) => tracing::warn!("not importing a session's state: {e}"),
    }
    let (pending, taken) = notices(&dir.join("notices"));
    for (run, run_dir) in subdirs(batch.path, &dir.join("runs"))? {
        let Some(rec) = read_run(name, &run, &run_dir) else {
            continue;
        };
        let id = rec.run_id.as_str();
        let notice = if pending.contains(id) {
            Some("pending")
        } else if taken.contains(id) || rec.finalized() {
            // A finalized run with neither was delivered, or never will be.
            Some("taken")
        } else {
            None
        };
        insert_run(batch, &rec, &run_dir, notice)?;
        batch.one_more()?;
    }
    Ok(())
}

/// Whether `name` is a draft run folder (`<run_id>.tmp-<x>`).
fn is_draft_name(name: &str) -> bool {
    name.split_once(".tmp-")
        .is_some_and(|(id, _)| RunId::parse(id).is_some())
}

/// The record of the run folder `dir`: its run.json, or a `lost`
/// placeholder for a corrupt one; `None` for a draft (removed: its spawn
/// was never answered) or a folder without a record (left as it is: it
/// may be a run of the new format whose database was moved away).
fn read_run(session: &str, name: &str, dir: &Path) -> Option<RunRecord> {
    if is_draft_name(name) {
        tracing::warn!(dir = %dir.display(), "removing a half-made run folder");
        let _ = std::fs::remove_dir_all(dir);
        return None;
    }
    let file = dir.join("run.json");
    let corrupt = dir.join("run.json.corrupt");
    let read = match safefile::read(&file, RECORD_MAX) {
        Err(e) if e.is_missing() && !corrupt.exists() => None,
        Err(e) if e.is_missing() => Some(Err("kept from an earlier start".to_owned())),
        Err(e) => Some(Err(e.to_string())),
        Ok(bytes) => Some(
            serde_json::from_slice::<RunRecord>(&bytes)
                .map_err(|e| format!("parse {}: {e}", file.display())),
        ),
    };
    match read {
        None => {
            tracing::warn!(dir = %dir.display(), "not importing a run folder without run.json");
            None
        }
        Some(Ok(rec)) if rec.run_id.as_str() != name || rec.session_id.as_str() != session => {
            let why = format!("{} names another run or session", file.display());
            tracing::error!("a run.json cannot be used; the run is marked lost: {why}");
            lost_placeholder(session, dir, &why)
        }
        Some(Ok(mut rec)) => {
            // The folder it was read from, never a path the file names.
            rec.run_dir = dir.to_path_buf();
            Some(rec)
        }
        Some(Err(why)) => {
            tracing::error!(
                "a run.json cannot be loaded; the run is marked lost and the file kept: {why}"
            );
            lost_placeholder(session, dir, &why)
        }
    }
}

/// A record for a run whose run.json is corrupt: `lost`, with the reason;
/// the corrupt file is kept as run.json.corrupt for inspection.
fn lost_placeholder(session: &str, dir: &Path, why: &str) -> Option<RunRecord> {
    let id = RunId::parse(&dir.file_name()?.to_string_lossy())?;
    let session_id = SessionId::parse(session).ok()?;
    let file = dir.join("run.json");
    if std::fs::symlink_metadata(&file).is_ok() {
        let _ = std::fs::rename(&file, dir.join("run.json.corrupt"));
    }
    let now = crate::timefmt::now_ms();
    Some(RunRecord {
        format: crate::run::record::RECORD_FORMAT,
        run_id: id,
        session_id,
        audience: policy::Audience::Personal,
        project_dir: "/".into(),
        task: String::new(),
        context: None,
        command: Vec::new(),
        env: Default::default(),
        limits: Default::default(),
        keep_temp: true,
        reason: Some(format!(
            "run.json was corrupt ({why}); kept as run.json.corrupt"
        )),
        cancel_requested: false,
        created_at_ms: now,
        temp_dir: "/nonexistent".into(),
        run_dir: dir.to_path_buf(),
        log_truncated: false,
        sandbox: Default::default(),
        agent: None,
        tools: None,
        rights: None,
        git: None,
        worktree: None,
        max_attempts: 1,
        uid: None,
        on_behalf: None,
        network: None,
        network_allow: Vec::new(),
        notes: Vec::new(),
        driver_run: None,
        backend: None,
        phase: Phase::Ended(Box::new(Ended::bare(EndState::Lost, None, now, None))),
    })
}

/// The state lists show before the end is handled: terminal only once it
/// is settled.
fn published(rec: &RunRecord) -> RunState {
    match rec.end() {
        Some(_) if rec.settled() => rec.state(),
        Some(_) if rec.started_at_ms().is_some() => RunState::Running,
        Some(_) => RunState::Accepted,
        None => rec.state(),
    }
}

/// One run's rows: a live run also gets its runner spec, one not finalized
/// its first picture.
fn insert_run(batch: &Batch<'_>, rec: &RunRecord, dir: &Path, notice: Option<&str>) -> Result<()> {
    let (conn, path) = (batch.conn, batch.path);
    if !runs::insert(conn, path, rec, published(rec), notice, true)? {
        return Ok(());
    }
    runs::set_usage(conn, path, rec)?;
    let id = rec.run_id.as_str();
    let side = [
        (
            rec.end().is_none(),
            "runner.json",
            SPEC_MAX,
            "run_specs",
            "spec",
        ),
        (
            !rec.finalized(),
            "observed-before.json",
            crate::observe::BEFORE_MAX_BYTES,
            "run_before",
            "before",
        ),
    ];
    for (wanted, file, max, table, col) in side {
        if !wanted {
            continue;
        }
        match safefile::read(&dir.join(file), max) {
            Ok(bytes) => put_blob(conn, path, table, col, id, &bytes)?,
            Err(e) if e.is_missing() => {}
            Err(e) => tracing::warn!("not importing a run's {file}: {e}"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::tests::{accepted, layout, succeeded};
    use super::super::{ListQuery, Op, Store, Stored};
    use super::*;
    use crate::run::record::RecordV1;

    fn write_run(root: &Path, w: &RecordV1) -> PathBuf {
        let dir = root.join(format!("sessions/s/runs/{}", w.run_id));
        std::fs::create_dir_all(&dir).unwrap();
        let w = RecordV1 {
            run_dir: dir.clone(),
            ..w.clone()
        };
        std::fs::write(dir.join("run.json"), serde_json::to_vec_pretty(&w).unwrap()).unwrap();
        dir
    }

    /// A state dir as the per-file daemon left it.
    fn old_state(root: &Path) -> [RunId; 5] {
        let ids = [(); 5].map(|_| RunId::new());
        let s = root.join("sessions/s");
        std::fs::create_dir_all(s.join("notices/pending")).unwrap();
        std::fs::create_dir_all(s.join("notices/taken")).unwrap();
        let session =
            "{\"owner_uid\": 4242, \"project_dir\": \"/p\", \"recent_files\": [\"/p/a\"]}";
        std::fs::write(s.join("session.json"), session).unwrap();
        // Accepted, with its runner spec and first picture.
        let dir = write_run(root, &accepted(&ids[0], "s"));
        std::fs::write(dir.join("runner.json"), b"{\"spec\":true}").unwrap();
        std::fs::write(dir.join("observed-before.json"), b"{}").unwrap();
        // Succeeded, its notice pending.
        write_run(root, &succeeded(&ids[1], "s", 10));
        let pending = s.join(format!("notices/pending/0000000000010-{}.json", ids[1]));
        std::fs::write(pending, b"{}").unwrap();
        // Succeeded, its notice taken.
        write_run(root, &succeeded(&ids[2], "s", 11));
        std::fs::write(s.join(format!("notices/taken/{}.json", ids[2])), b"{}").unwrap();
        // Corrupt.
        let bad = s.join(format!("runs/{}", ids[3]));
        std::fs::create_dir_all(&bad).unwrap();
        std::fs::write(bad.join("run.json"), b"{\"format\": 1, \"run_id\": ").unwrap();
        // Finalized with no notice file: delivered.
        write_run(root, &succeeded(&ids[4], "s", 12));
        // A draft (a spawn never answered) and a folder without a record.
        std::fs::create_dir_all(s.join(format!("runs/{}.tmp-x", RunId::new()))).unwrap();
        std::fs::create_dir_all(s.join(format!("runs/{}", RunId::new()))).unwrap();
        ids
    }

    /// Every table's rows, as text.
    fn dump(store: &Store) -> Vec<String> {
        let conn = rusqlite::Connection::open(store.path()).unwrap();
        let mut out = Vec::new();
        for t in [
            "runs",
            "run_details",
            "run_ends",
            "run_specs",
            "run_before",
            "sessions",
        ] {
            let mut st = conn
                .prepare(&format!("SELECT * FROM {t} ORDER BY 1"))
                .unwrap();
            let n = st.column_count();
            let rows = st
                .query_map([], |r| {
                    let cells: Vec<String> = (0..n)
                        .map(|i| format!("{:?}", r.get_ref(i).unwrap()))
                        .collect();
                    Ok(format!("{t}: {}", cells.join("|")))
                })
                .unwrap();
            out.extend(rows.map(|r| r.unwrap()));
        }
        out
    }

    fn notice_of(store: &Store, id: &RunId) -> Option<String> {
        let conn = rusqlite::Connection::open(store.path()).unwrap();
        conn.query_row(
            "SELECT notice FROM runs WHERE run_id = ?1",
            [id.as_str()],
            |r| r.get(0),
        )
        .unwrap()
    }

    #[test]
    fn an_old_state_dir_is_imported_once_and_again_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let ids = old_state(dir.path());
        let store = Store::open(&layout(dir.path())).unwrap();
        let all = ListQuery {
            limit: 100,
            ..Default::default()
        };
        let runs = store.list(&all).unwrap().runs;
        let got: Vec<&RunId> = runs.iter().map(|r| &r.run_id).collect();
        assert_eq!(got, ids.iter().collect::<Vec<_>>());
        assert_eq!(
            store.spec(&ids[0]).unwrap().as_deref(),
            Some(&b"{\"spec\":true}"[..])
        );
        assert_eq!(store.before(&ids[0]).unwrap().as_deref(), Some(&b"{}"[..]));
        let states: Vec<Option<String>> = ids.iter().map(|i| notice_of(&store, i)).collect();
        let want = [None, Some("pending"), Some("taken"), None, Some("taken")];
        assert_eq!(states, want.map(|s| s.map(String::from)));
        let Some(Stored::Live(lost)) = store.get(&ids[3]).unwrap() else {
            panic!("the corrupt run is not there");
        };
        assert_eq!(lost.state(), RunState::Lost);
        assert!(lost.reason.as_deref().unwrap_or("").contains("corrupt"));
        let bad = dir.path().join(format!("sessions/s/runs/{}", ids[3]));
        assert!(bad.join("run.json.corrupt").is_file() && !bad.join("run.json").exists());
        // The run that is not settled is recovery's, the lost one too.
        let live: Vec<RunId> = store
            .live_runs()
            .unwrap()
            .into_iter()
            .map(|r| r.run_id)
            .collect();
        assert_eq!(live, [ids[0].clone(), ids[3].clone()]);
        let runs_dir = dir.path().join("sessions/s/runs");
        assert_eq!(
            std::fs::read_dir(&runs_dir).unwrap().count(),
            6,
            "the draft is removed, a folder without a record left as it is"
        );
        let s = store.session("s").unwrap().unwrap();
        assert_eq!((s.owner_uid, s.recent_files.len()), (Some(4242), 1));
        let first = dump(&store);
        assert_eq!(store.meta(MARK).unwrap().as_deref(), Some("done"));
        // Killed before `done`: the import runs again and adds nothing.
        let unmark = Op::SetMeta {
            key: MARK.into(),
            value: None,
        };
        store.commit_blocking(vec![unmark]).unwrap();
        drop(store);
        let store = Store::open(&layout(dir.path())).unwrap();
        assert_eq!(dump(&store), first);
        let take = Op::TakeNotices {
            session: "s".into(),
        };
        let taken = store.commit_blocking(vec![take]).unwrap().notices;
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].run_id, ids[1].to_string());
        drop(store);
        // Once done, a start reads none of the old files.
        std::fs::write(bad.join("run.json"), b"not json").unwrap();
        let store = Store::open(&layout(dir.path())).unwrap();
        assert!(bad.join("run.json").exists());
        assert_eq!(store.list(&all).unwrap().runs.len(), 5);
    }

    #[test]
    fn a_symlinked_record_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let id = RunId::new();
        let run = dir.path().join(format!("sessions/s/runs/{id}"));
        std::fs::create_dir_all(&run).unwrap();
        let elsewhere = dir.path().join("elsewhere.json");
        let w = RecordV1 {
            run_dir: run.clone(),
            ..accepted(&id, "s")
        };
        std::fs::write(&elsewhere, serde_json::to_vec(&w).unwrap()).unwrap();
        std::os::unix::fs::symlink(&elsewhere, run.join("run.json")).unwrap();
        let store = Store::open(&layout(dir.path())).unwrap();
        let Some(Stored::Live(rec)) = store.get(&id).unwrap() else {
            panic!("not imported");
        };
        assert_eq!(rec.state(), RunState::Lost, "{rec:?}");
        assert!(elsewhere.exists());
    }
}
