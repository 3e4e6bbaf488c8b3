//! The run's data: its record ([`record`]: run.json, typed by phase) and
//! what the record is made of (its worktree, its delta report, its driver
//! and delivery, its egress counts, its placement), with their serde form and small pure
//! methods.
//!
//! May use `ids`, `timefmt`, `paths`, policy and subagent_runner types,
//! std and serde; imports nothing from engine, protocol, egress, gateway,
//! cli, server or mcp.

pub mod delta;
pub mod driver;
pub mod egress;
pub mod placement;
pub mod record;
pub mod worktree;
