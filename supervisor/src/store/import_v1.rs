//! The upgrade import of a state dir of per-run JSON files (run.json,
//! notices/, session.json) into the database, idempotent.
