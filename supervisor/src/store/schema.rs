//! The schema of state.db: its tables and indexes, its application_id and
//! version, and the migrations that move one version to the next.
