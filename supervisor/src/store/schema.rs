//! The schema of state.db: its tables and indexes, its application_id and
//! version, and the migrations that move one version to the next.

use super::error::{Result, StoreError};
use rusqlite::{Connection, OptionalExtension};
use std::path::Path;

/// `PRAGMA application_id` of subagentd's database: "SUBA".
pub const APPLICATION_ID: i64 = 0x5355_4241;

/// The schema version this code reads and writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Migration *n* (1-based) moves version n-1 to n.
pub const MIGRATIONS: &[&str] = &[V1, V2, V3];

const V1: &str = "
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    owner_uid INTEGER NOT NULL,
    state TEXT NOT NULL,
    end_state TEXT,
    created_at_ms INTEGER NOT NULL,
    started_at_ms INTEGER,
    ended_at_ms INTEGER,
    runner_pid INTEGER,
    runner_start_ticks INTEGER,
    exit_code INTEGER,
    signal INTEGER,
    reason TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    log_truncated INTEGER NOT NULL DEFAULT 0,
    finalized INTEGER NOT NULL DEFAULT 0,
    finalize_error TEXT,
    uid INTEGER,
    run_dir TEXT NOT NULL,
    temp_dir TEXT NOT NULL,
    keep_temp INTEGER NOT NULL DEFAULT 0,
    worktree_dir TEXT,
    notice TEXT CHECK (notice IN ('pending', 'taken')),
    notice_taken_at_ms INTEGER,
    dir_bytes INTEGER,
    prune_state TEXT CHECK (prune_state IN ('pruning', 'pruned')),
    pruned_at_ms INTEGER,
    prune_reason TEXT
) WITHOUT ROWID;
CREATE TABLE run_details (
    run_id TEXT PRIMARY KEY REFERENCES runs ON DELETE CASCADE,
    accepted TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE run_ends (
    run_id TEXT PRIMARY KEY REFERENCES runs ON DELETE CASCADE,
    end TEXT NOT NULL,
    driver TEXT
) WITHOUT ROWID;
CREATE TABLE run_specs (
    run_id TEXT PRIMARY KEY REFERENCES runs ON DELETE CASCADE,
    spec BLOB NOT NULL
) WITHOUT ROWID;
CREATE TABLE run_context (
    run_id TEXT PRIMARY KEY REFERENCES runs ON DELETE CASCADE,
    files TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE run_before (
    run_id TEXT PRIMARY KEY REFERENCES runs ON DELETE CASCADE,
    before BLOB NOT NULL
) WITHOUT ROWID;
CREATE TABLE sessions (
    session_id TEXT PRIMARY KEY,
    owner_uid INTEGER,
    project_dir TEXT,
    recent_files TEXT NOT NULL,
    updated_at_ms INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX runs_session ON runs(session_id, run_id);
CREATE INDEX runs_state ON runs(state, run_id);
CREATE INDEX runs_owner ON runs(owner_uid, run_id);
CREATE INDEX runs_session_created ON runs(session_id, created_at_ms);
CREATE INDEX runs_ended ON runs(ended_at_ms) WHERE prune_state IS NULL;
CREATE INDEX runs_notice_pending ON runs(session_id, ended_at_ms, run_id)
    WHERE notice = 'pending';
CREATE INDEX runs_live ON runs(run_id)
    WHERE state IN ('accepted', 'running') OR finalized = 0 OR prune_state = 'pruning';
";

/// Lists and forgetting without history: the list indexes hold only the
/// runs a list can return (tombstones left out), `since`/`until` are run id
/// bounds (the old `runs_session_created` is gone), and tombstones have an
/// index of their own, by the time they were pruned. `runs_live` is made
/// again after `runs_listed`: of two indexes equally good for recovery's
/// read, SQLite takes the one made last.
const V2: &str = "
DROP INDEX IF EXISTS runs_session;
DROP INDEX IF EXISTS runs_state;
DROP INDEX IF EXISTS runs_owner;
DROP INDEX IF EXISTS runs_session_created;
CREATE INDEX runs_listed ON runs(run_id) WHERE prune_state IS NULL;
CREATE INDEX runs_session ON runs(session_id, run_id) WHERE prune_state IS NULL;
CREATE INDEX runs_state ON runs(state, run_id) WHERE prune_state IS NULL;
CREATE INDEX runs_owner ON runs(owner_uid, run_id) WHERE prune_state IS NULL;
CREATE INDEX runs_tombstones ON runs(pruned_at_ms, run_id) WHERE prune_state = 'pruned';
DROP INDEX IF EXISTS runs_live;
CREATE INDEX runs_live ON runs(run_id)
    WHERE state IN ('accepted', 'running') OR finalized = 0 OR prune_state = 'pruning';
";

/// Usage summed without reading JSON: each run's driver and the turns,
/// tokens and cost its agent reported become columns of its row (filled
/// here from the ended runs' `run_ends.driver`, a figure out of range left
/// NULL as the daemon leaves it), kept on a tombstone, and summed through
/// `runs_usage`, an index by session that holds every figure (its cost is
/// the session's runs, not the history's). `runs_session` and `runs_live`
/// are made again after it: of two indexes equally good for a list's or
/// recovery's read, SQLite takes the one made last.
const V3: &str = "
ALTER TABLE runs ADD COLUMN driver TEXT;
ALTER TABLE runs ADD COLUMN turns INTEGER;
ALTER TABLE runs ADD COLUMN input_tokens INTEGER;
ALTER TABLE runs ADD COLUMN output_tokens INTEGER;
ALTER TABLE runs ADD COLUMN cost_usd REAL;
UPDATE runs SET
    driver = CASE WHEN json_type(e.driver, '$.driver') = 'text'
        THEN json_extract(e.driver, '$.driver') END,
    turns = CASE WHEN json_type(e.driver, '$.report.turns') = 'integer'
        AND json_extract(e.driver, '$.report.turns') BETWEEN 0 AND 1099511627776
        THEN json_extract(e.driver, '$.report.turns') END,
    input_tokens = CASE WHEN json_type(e.driver, '$.report.input_tokens') = 'integer'
        AND json_extract(e.driver, '$.report.input_tokens') BETWEEN 0 AND 1099511627776
        THEN json_extract(e.driver, '$.report.input_tokens') END,
    output_tokens = CASE WHEN json_type(e.driver, '$.report.output_tokens') = 'integer'
        AND json_extract(e.driver, '$.report.output_tokens') BETWEEN 0 AND 1099511627776
        THEN json_extract(e.driver, '$.report.output_tokens') END,
    cost_usd = CASE WHEN json_type(e.driver, '$.report.cost_usd') IN ('integer', 'real')
        AND json_extract(e.driver, '$.report.cost_usd') BETWEEN 0 AND 1e9
        THEN json_extract(e.driver, '$.report.cost_usd') END
FROM run_ends e WHERE e.run_id = runs.run_id AND json_valid(e.driver);
CREATE INDEX runs_usage ON runs(session_id, run_id, owner_uid, driver,
    turns, input_tokens, output_tokens, cost_usd);
DROP INDEX IF EXISTS runs_session;
CREATE INDEX runs_session ON runs(session_id, run_id) WHERE prune_state IS NULL;
DROP INDEX IF EXISTS runs_live;
CREATE INDEX runs_live ON runs(run_id)
    WHERE state IN ('accepted', 'running') OR finalized = 0 OR prune_state = 'pruning';
";

/// The tables a version-1 file has (version 2 changed only indexes).
const TABLES: &[&str] = &[
    "runs",
    "run_details",
    "run_ends",
    "run_specs",
    "run_context",
    "run_before",
    "sessions",
    "meta",
];

/// Sets the pragmas every connection has.
pub fn pragmas(conn: &Connection, path: &Path) -> Result<()> {
    conn.execute_batch(
        "PRAGMA foreign_keys = ON; PRAGMA busy_timeout = 5000; PRAGMA synchronous = FULL;",
    )
    .map_err(|e| classify(path, e))
}

/// Sets the writer's pragmas (WAL, its bound).
pub fn writer_pragmas(conn: &Connection, path: &Path) -> Result<()> {
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(|e| classify(path, e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        let why = format!("journal_mode stayed {mode}");
        return Err(StoreError::Corrupt {
            path: path.into(),
            why,
        });
    }
    conn.execute_batch("PRAGMA journal_size_limit = 67108864;")
        .map_err(|e| classify(path, e))
}

/// An open-time error: corrupt and not-a-database files are told apart.
pub fn classify(path: &Path, e: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode as C;
    match e.sqlite_error_code() {
        Some(C::NotADatabase | C::DatabaseCorrupt) => StoreError::Corrupt {
            path: path.into(),
            why: e.to_string(),
        },
        _ => StoreError::Open {
            path: path.into(),
            source: e,
        },
    }
}

fn pragma_i64(conn: &Connection, path: &Path, name: &str) -> Result<i64> {
    conn.query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))
        .map_err(|e| classify(path, e))
}

/// Checks what the file is and returns its schema version: a new file is
/// 0; a foreign or newer one is refused.
pub fn identify(conn: &Connection, path: &Path) -> Result<i64> {
    let app = pragma_i64(conn, path, "application_id")?;
    let version = pragma_i64(conn, path, "user_version")?;
    let tables: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
        .map_err(|e| classify(path, e))?;
    if app != APPLICATION_ID && (app != 0 || tables > 0 || version != 0) {
        return Err(StoreError::Foreign { path: path.into() });
    }
    if version > SCHEMA_VERSION {
        return Err(StoreError::Newer {
            path: path.into(),
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    Ok(version)
}

/// Moves a file identified at `from` to [`SCHEMA_VERSION`] and checks its
/// tables.
pub fn migrate_and_check(conn: &mut Connection, path: &Path, from: i64) -> Result<()> {
    migrate(conn, path, from)?;
    check_tables(conn, path)
}

/// Runs the migrations after `from`, each in its own transaction with its
/// version.
pub fn migrate(conn: &mut Connection, path: &Path, from: i64) -> Result<()> {
    for (n, sql) in MIGRATIONS.iter().enumerate().skip(from.max(0) as usize) {
        let n = n as i64 + 1;
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(|e| classify(path, e))?;
        // Read again inside the lock: another opener may have migrated.
        let now: i64 = tx
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| classify(path, e))?;
        if now >= n {
            continue;
        }
        let batch =
            format!("PRAGMA application_id = {APPLICATION_ID}; {sql}; PRAGMA user_version = {n};");
        tx.execute_batch(&batch).map_err(|e| classify(path, e))?;
        tx.commit().map_err(|source| StoreError::Commit {
            path: path.into(),
            source,
            errno: None,
        })?;
    }
    Ok(())
}

/// Refuses a file that says it is ours but lacks a table.
fn check_tables(conn: &Connection, path: &Path) -> Result<()> {
    for t in TABLES {
        let found: Option<i64> = conn
            .query_row(
                "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = ?1",
                [t],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| classify(path, e))?;
        if found.is_none() {
            return Err(StoreError::Corrupt {
                path: path.into(),
                why: format!("its table {t} is missing"),
            });
        }
    }
    Ok(())
}

/// The checks of [`identify`] and [`migrate_and_check`] for a reader, which changes nothing:
/// a file that is not (yet) at this version is refused too.
pub fn check_read_only(conn: &Connection, path: &Path) -> Result<()> {
    let app = pragma_i64(conn, path, "application_id")?;
    if app != APPLICATION_ID {
        return Err(StoreError::Foreign { path: path.into() });
    }
    let version = pragma_i64(conn, path, "user_version")?;
    if version < SCHEMA_VERSION {
        return Err(StoreError::Corrupt {
            path: path.into(),
            why: format!("schema version {version}: start subagentd once to upgrade it"),
        });
    }
    if version > SCHEMA_VERSION {
        return Err(StoreError::Newer {
            path: path.into(),
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    check_tables(conn, path)
}
