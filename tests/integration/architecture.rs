//! Mechanical architecture invariants (see ARCHITECTURE.md): tests that read
//! the sources and fail when a layer reaches for something it must not.

use std::path::{Path, PathBuf};

use crate::support::repo_root;

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

/// Lines of `dir`'s sources that contain any of `forbidden`.
fn offenders(dir: &str, forbidden: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for file in rust_files(&repo_root().join("src").join(dir)) {
        let text = std::fs::read_to_string(&file).unwrap();
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for needle in forbidden {
                if code.contains(needle) {
                    found.push(format!(
                        "{}:{}: `{needle}` in `{}`",
                        file.display(),
                        i + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    found
}

/// What a pure layer must never touch: async runtime, processes, database,
/// sockets, or the runtime layers.
const IMPURE: [&str; 12] = [
    "tokio",
    "rusqlite",
    "axum",
    "notify",
    "std::process",
    "std::net::TcpListener",
    "crate::runtime",
    "crate::store",
    "crate::bus",
    "crate::supervisor",
    "crate::surfaces",
    "crate::cli",
];

#[test]
fn model_is_pure() {
    let found = offenders("model", &IMPURE);
    assert!(
        found.is_empty(),
        "src/model must stay pure:\n{}",
        found.join("\n")
    );
}

#[test]
fn plan_is_pure() {
    let found = offenders("plan", &IMPURE);
    assert!(
        found.is_empty(),
        "src/plan must stay pure:\n{}",
        found.join("\n")
    );
}

/// Only `store` opens SQLite; only `supervisor` spawns processes.
#[test]
fn only_store_opens_sqlite_and_only_supervisor_spawns() {
    for file in rust_files(&repo_root().join("src")) {
        let rel = file
            .strip_prefix(repo_root())
            .unwrap()
            .display()
            .to_string();
        let text = std::fs::read_to_string(&file).unwrap();
        let code: String = text
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        if !rel.starts_with("src/store") {
            assert!(
                !code.contains("rusqlite"),
                "{rel} uses rusqlite; only src/store may"
            );
        }
        if !rel.starts_with("src/supervisor") {
            for needle in ["Command::new", "process::Command", "portable_pty"] {
                assert!(
                    !code.contains(needle),
                    "{rel} spawns processes (`{needle}`); only src/supervisor may"
                );
            }
        }
    }
}

#[test]
fn every_module_file_starts_with_a_doc_paragraph() {
    for file in rust_files(&repo_root().join("src")) {
        let text = std::fs::read_to_string(&file).unwrap();
        let rel = file
            .strip_prefix(repo_root())
            .unwrap()
            .display()
            .to_string();
        if rel == "src/main.rs" {
            continue;
        }
        let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        assert!(
            first.starts_with("//!"),
            "{rel} does not start with a `//!` paragraph"
        );
    }
}

#[test]
fn main_stays_tiny() {
    let main = std::fs::read_to_string(repo_root().join("src/main.rs")).unwrap();
    assert!(
        main.lines().count() <= 10,
        "src/main.rs should only call into the library"
    );
}

/// The guarded file layer is a leaf: every layer (the pure model included)
/// may read through it, so it depends on nothing in the crate.
#[test]
fn repofs_is_a_leaf() {
    let found = offenders("repofs", &["crate::"]);
    assert!(
        found.is_empty(),
        "src/repofs must not depend on the rest of the crate:\n{}",
        found.join("\n")
    );
}

/// Architecture invariant: the REST API answers only through `ApiBackend`
/// (the daemon's implementation is `runtime::api`).
#[test]
fn the_api_surface_never_reaches_into_the_runtime() {
    let found = offenders(
        "surfaces/api",
        &["crate::runtime", "crate::supervisor", "crate::mcp"],
    );
    assert!(
        found.is_empty(),
        "src/surfaces/api must go through `ApiBackend`:\n{}",
        found.join("\n")
    );
}
