//! The error of a definition file that cannot be used: where and why.
//! Uses nothing else of `definition`; the parser and front-matter reader
//! build on it.

use std::path::{Path, PathBuf};

/// A definition file that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}: {}{message}", file.display(), if *line == 0 { String::new() } else { format!(":{line}") }, field.as_ref().map(|f| format!("{f}: ")).unwrap_or_default())]
pub struct DefinitionError {
    pub file: PathBuf,
    /// 1-based line (of the field, when one is at fault); 0 when the file
    /// could not be read.
    pub line: usize,
    /// The field at fault, if any.
    pub field: Option<String>,
    pub message: String,
    /// The name the file gives, when it gives one: the name it blocks.
    pub name: Option<String>,
}

impl DefinitionError {
    pub(super) fn new(
        file: &Path,
        line: usize,
        field: Option<&str>,
        message: impl Into<String>,
    ) -> Self {
        DefinitionError {
            file: file.to_path_buf(),
            line,
            field: field.map(str::to_owned),
            message: message.into(),
            name: None,
        }
    }

    /// A file that could not be read (`message` says why).
    pub fn unreadable(file: &Path, message: impl Into<String>) -> Self {
        DefinitionError::new(file, 0, None, message)
    }
}
