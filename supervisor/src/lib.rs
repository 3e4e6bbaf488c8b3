//! subagentd library.
