//! What the loader learns of one Agent Plugins package through
//! [`Files::package`](super::Files::package): the package's own problems
//! (quoted at the manifest's `path`) and, when it loaded, what it adds to
//! the manifest — its MCP servers as `PLUGIN__SERVER` entries and its
//! hooks and skills. The model knows nothing of packages but this view:
//! reading, checking and resolving one is `crate::plugins`'s.

use super::types::{McpServer, PluginParts};

/// One plugin package as the loader sees it.
#[derive(Debug, Clone, Default)]
pub struct PackageView {
    /// The package's problems, as listed (errors and warnings).
    pub problems: Vec<PackageProblem>,
    /// Problems found beyond those listed.
    pub omitted: usize,
    /// How many of those were errors.
    pub omitted_errors: usize,
    /// What the package contributes, when it loaded.
    pub contents: Option<PackageContents>,
}

/// One problem of a package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageProblem {
    /// An error (the manifest is invalid while the package is), not a warning.
    pub error: bool,
    /// Where in the package: a file, and a JSON Pointer into it (`file#/ptr`).
    pub place: String,
    pub message: String,
    pub hint: Option<String>,
}

/// What a loaded package contributes.
#[derive(Debug, Clone)]
pub enum PackageContents {
    /// Its servers (as manifest servers, in file order), the servers it
    /// skipped, and its hooks and skills.
    Resolved {
        servers: Vec<(String, McpServer)>,
        skipped: Vec<SkippedServer>,
        parts: PluginParts,
    },
    /// It has no data directory (`reason`); an error of the manifest only
    /// when the package runs something (servers or hooks).
    NoDataDir {
        reason: String,
        runs_something: bool,
    },
}

/// A package server that does not join the manifest, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedServer {
    pub server: String,
    pub reason: String,
}
