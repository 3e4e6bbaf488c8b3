//! What both front ends show, the `subagent` CLI ([`crate::cli`]) and
//! `subagent mcp` ([`crate::mcp`]): a log's tail and the definitions as
//! JSON, usage as text. Below both; it uses neither.
//!
//! - [`logtail`]: where the last lines of a log begin.
//! - [`agents`]: the definitions found, as JSON.
//! - [`usage`]: turns, tokens and cost for people (the `ls` cells, a
//!   status's line, `subagent usage`'s table).

pub mod agents;
pub mod logtail;
pub mod usage;
