//! Each session's working state as a row: its owner, project dir and
//! recent files.
