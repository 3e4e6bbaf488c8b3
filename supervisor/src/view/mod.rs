//! What both front ends show, the `subagent` CLI ([`crate::cli`]) and
//! `subagent mcp` ([`crate::mcp`]): a log's tail and the definitions as
//! JSON. Below both; it uses neither.
//!
//! - [`logtail`]: where the last lines of a log begin.
//! - [`agents`]: the definitions found, as JSON.

pub mod agents;
pub mod logtail;
