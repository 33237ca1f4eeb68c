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
const IMPURE: [&str; 14] = [
    "tokio",
    "rusqlite",
    "tokio_postgres",
    "deadpool_postgres",
    "axum",
    // The file watcher crate, used by its path (`notify::Watcher`); the
    // manifest's `[notify.NAME]` sinks are plain data here.
    "notify::",
    "std::process",
    "std::net::TcpListener",
    "crate::runtime",
    "crate::store",
    "crate::bus",
    "crate::supervisor",
    "crate::surfaces",
    "crate::cli",
];

/// Architecture invariant: the pure core (`model`, `plan`, `event`) has no
/// async runtime, processes, database, sockets or upper rooms.
#[test]
fn the_pure_core_is_pure() {
    for room in ["model", "plan", "event"] {
        let found = offenders(room, &IMPURE);
        assert!(
            found.is_empty(),
            "src/{room} must stay pure:\n{}",
            found.join("\n")
        );
    }
}

/// What the pure core reads only through its seams (`model::Files`,
/// `model::Env`; `disk` implements them): the disk and the environment.
const DISK_AND_ENVIRONMENT: [&str; 10] = [
    "std::fs",
    "std::env",
    "crate::repofs",
    "crate::disk",
    "File::open",
    ".is_file()",
    ".is_dir()",
    ".exists()",
    "read_dir(",
    "canonicalize(",
];

/// Lines of `dir`'s production code (no `tests.rs`, no `tests/` folder,
/// nothing after a `#[cfg(test)]`) that contain any of `forbidden`.
fn production_offenders(dir: &str, forbidden: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for file in rust_files(&repo_root().join("src").join(dir)) {
        let in_tests = file.components().any(|c| c.as_os_str() == "tests")
            || file.file_name().is_some_and(|f| f == "tests.rs");
        if in_tests {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for (i, line) in production_code(&text).lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for needle in forbidden {
                if code.contains(needle) {
                    found.push(format!("{}:{}: `{needle}`", file.display(), i + 1));
                }
            }
        }
    }
    found
}

/// `text` up to its first `#[cfg(test)]` item that is code (a test
/// module's body, a test function), so that a `#[cfg(test)] mod tests;`
/// declaration near the top hides nothing after it.
fn production_code(text: &str) -> &str {
    let mut from = 0;
    while let Some(at) = text[from..].find("#[cfg(test)]") {
        let after = text[from + at + "#[cfg(test)]".len()..].trim_start();
        let declaration = after
            .strip_prefix("mod ")
            .and_then(|rest| rest.split_once(';'))
            .is_some_and(|(name, _)| name.trim().chars().all(|c| c.is_alphanumeric() || c == '_'));
        if !declaration {
            return &text[..from + at];
        }
        from += at + "#[cfg(test)]".len();
    }
    text
}

/// Architecture invariant: the pure core neither reads the disk nor the
/// process environment; both come in through `model::Files` and
/// `model::Env`, which `disk` implements.
#[test]
fn the_pure_core_reads_no_disk_and_no_environment() {
    for room in ["model", "plan"] {
        let found = production_offenders(room, &DISK_AND_ENVIRONMENT);
        assert!(
            found.is_empty(),
            "src/{room} reads the disk or the environment; take it through `model::Files` / `model::Env` (see `disk`):\n{}",
            found.join("\n")
        );
    }
}

/// An event is built only from `event::Event` (`NewEvent::from`,
/// `Event::for_component`), so a kind is never a string and a payload never
/// a loose `json!` object: no struct literal or string constructor of
/// `NewEvent` outside `src/event` (`NewEvent::untyped` exists only under
/// `cfg(test)`, for the bus's and the store's own tests), and
/// `NewEvent::relayed` — a copy of an event a fleet worker already stored —
/// only in `runs::fleet`.
#[test]
fn every_event_is_made_from_the_event_enum() {
    let mut found = Vec::new();
    for file in rust_files(&repo_root().join("src")) {
        let rel = file
            .strip_prefix(repo_root())
            .unwrap()
            .display()
            .to_string();
        if rel.starts_with("src/event/") {
            continue;
        }
        let mut needles = vec!["NewEvent {", "NewEvent::new("];
        if rel != "src/runs/fleet.rs" {
            needles.push("NewEvent::relayed(");
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for needle in &needles {
                // `fn f() -> NewEvent {` names the type, it builds nothing.
                if code.contains(needle) && !(code.contains("fn ") && *needle == "NewEvent {") {
                    found.push(format!("{rel}:{}: `{}`", i + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "events are made from `event::Event` only (add a kind to `src/event/`):\n{}",
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
            for needle in [
                "rusqlite",
                "tokio_postgres",
                "deadpool_postgres",
                "deadpool::",
            ] {
                assert!(
                    !code.contains(needle),
                    "{rel} uses `{needle}`; only src/store may talk to a database"
                );
            }
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
        "api",
        &["crate::runtime", "crate::supervisor", "crate::mcp"],
    );
    assert!(
        found.is_empty(),
        "src/api must go through `ApiBackend`:\n{}",
        found.join("\n")
    );
}

// ---------------------------------------------------------------------------
// Layers: the law of imports (ARCHITECTURE.md, "Layers").
// ---------------------------------------------------------------------------

/// The rooms of `src/`, bottom to top, in their layers (ARCHITECTURE.md,
/// "Layers"). A room may name only rooms listed before it; a new top-level
/// module fails [`every_room_imports_only_rooms_below_it`] until it is
/// placed here.
const LAYERS: &[(&str, &[&str])] = &[
    ("leaf", &["stdx", "repofs"]),
    ("pure core", &["model", "plan", "event"]),
    (
        "effects",
        &["store", "bus", "supervisor", "surfaces", "disk"],
    ),
    ("contract", &["driver"]),
    (
        "engines",
        &[
            "render",
            "providers",
            "native",
            "plugins",
            "mcp",
            "panes",
            "hooks",
            "runs",
            "workflows",
            "triggers",
            "notify",
        ],
    ),
    ("presentation", &["api"]),
    ("composition", &["runtime"]),
    ("front ends", &["acp", "cli"]),
];

/// Upward arrows still being moved (room → room). Empty when the layers hold.
const KNOWN: &[(&str, &str)] = &[];

fn rank(room: &str) -> Option<usize> {
    LAYERS
        .iter()
        .flat_map(|(_, rooms)| rooms.iter())
        .position(|r| *r == room)
}

/// `src/mcp/pool.rs` → `mcp`; `lib.rs`, `main.rs` and `bin/` are no room.
fn room_of(rel: &Path) -> Option<String> {
    let first = rel.components().next()?.as_os_str().to_str()?;
    let room = first.strip_suffix(".rs").unwrap_or(first);
    (!matches!(room, "lib" | "main" | "bin")).then(|| room.to_string())
}

/// How many `super::` climb from `rel`'s module to the crate root
/// (`mcp/mod.rs` 1, `mcp/pool.rs` 2, `mcp/builtin/npc.rs` 3).
fn depth(rel: &Path) -> usize {
    let n = rel.components().count();
    if rel.file_name().is_some_and(|f| f == "mod.rs") {
        n - 1
    } else {
        n
    }
}

/// The tokens of Rust source that matter to paths: identifiers (with
/// `$crate` as one), `::`, braces, `,`, `;`, and a placeholder for anything
/// else. Comments, string, byte-string, raw-string and char literals are
/// dropped, so text that mentions a path is no import.
fn path_tokens(src: &str) -> Vec<(String, usize)> {
    let b = src.as_bytes();
    let (mut i, mut line) = (0usize, 1usize);
    let mut out = Vec::new();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    while i < b.len() {
        let c = b[i];
        match c {
            b'\n' => {
                line += 1;
                i += 1;
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let mut nest = 0usize;
                while i < b.len() {
                    if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                        nest += 1;
                        i += 2;
                    } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                        nest -= 1;
                        i += 2;
                        if nest == 0 {
                            break;
                        }
                    } else {
                        line += usize::from(b[i] == b'\n');
                        i += 1;
                    }
                }
            }
            b'r' | b'b' if raw_string_start(b, i).is_some() => {
                let (open, hashes) = raw_string_start(b, i).unwrap();
                i = open + 1;
                let close: Vec<u8> = std::iter::once(b'"')
                    .chain(std::iter::repeat_n(b'#', hashes))
                    .collect();
                while i < b.len() && !b[i..].starts_with(&close) {
                    line += usize::from(b[i] == b'\n');
                    i += 1;
                }
                i += close.len();
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    line += usize::from(b[i] == b'\n');
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'\'' => {
                // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
                if b.get(i + 1) == Some(&b'\\') {
                    i += 2;
                    while i < b.len() && b[i] != b'\'' {
                        i += 1;
                    }
                    i += 1;
                } else if b.get(i + 2) == Some(&b'\'') {
                    i += 3;
                } else {
                    let ch = src[i + 1..].chars().next().map_or(1, char::len_utf8);
                    if b.get(i + 1 + ch) == Some(&b'\'') {
                        i += 2 + ch;
                    } else {
                        i += 1; // a lifetime: its name follows as an identifier
                    }
                }
            }
            b'$' if b[i + 1..].starts_with(b"crate") => {
                out.push(("crate".to_string(), line));
                i += 6;
            }
            _ if ident(c) && !c.is_ascii_digit() => {
                let start = i;
                while i < b.len() && ident(b[i]) {
                    i += 1;
                }
                out.push((src[start..i].to_string(), line));
            }
            b':' if b.get(i + 1) == Some(&b':') => {
                out.push(("::".to_string(), line));
                i += 2;
            }
            b'{' | b'}' | b',' | b';' => {
                out.push(((c as char).to_string(), line));
                i += 1;
            }
            _ if c.is_ascii_whitespace() => i += 1,
            _ => {
                out.push(("·".to_string(), line));
                i += src[i..].chars().next().map_or(1, char::len_utf8);
            }
        }
    }
    out
}

/// Where a raw (byte) string literal starting at `i` opens its quote, and
/// how many `#` it uses.
fn raw_string_start(b: &[u8], i: usize) -> Option<(usize, usize)> {
    if i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_') {
        return None;
    }
    let mut j = i;
    if b[j] == b'b' {
        j += 1;
        if b.get(j) == Some(&b'"') {
            return Some((j, 0)); // b"..." is an ordinary string for our purpose
        }
    }
    if b.get(j) != Some(&b'r') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while b.get(j) == Some(&b'#') {
        hashes += 1;
        j += 1;
    }
    (b.get(j) == Some(&b'"')).then_some((j, hashes))
}

/// The first identifiers of the items of a `{…}` group starting at
/// `tokens[open]` (nested groups skipped), and the index after it.
fn group_heads(tokens: &[(String, usize)], open: usize) -> (Vec<(String, usize)>, usize) {
    let mut heads = Vec::new();
    let (mut i, mut nest, mut at_item) = (open + 1, 1usize, true);
    while i < tokens.len() && nest > 0 {
        let (t, line) = &tokens[i];
        match t.as_str() {
            "{" => nest += 1,
            "}" => nest -= 1,
            "," if nest == 1 => at_item = true,
            _ if nest == 1 && at_item => {
                heads.push((t.clone(), *line));
                at_item = false;
            }
            _ => {}
        }
        i += 1;
    }
    (heads, i)
}

/// How many `super::` a chain starting at `tokens[i]` climbs, and the
/// index of the token after its last `::`.
fn super_chain(tokens: &[(String, usize)], i: usize) -> (usize, usize) {
    let (mut j, mut ups) = (i, 0);
    while tokens.get(j).is_some_and(|(t, _)| t == "super")
        && tokens.get(j + 1).is_some_and(|(t, _)| t == "::")
    {
        ups += 1;
        j += 2;
    }
    (ups, j)
}

/// Every crate-root name a file names, with its line: `crate::X`,
/// `$crate::X`, `crate::{X, Y}`, and `super::` chains that climb to the
/// root (counting inline `mod name { … }` blocks).
fn roots_named(rel: &Path, src: &str) -> Vec<(String, usize)> {
    let tokens = path_tokens(src);
    let file_depth = depth(rel);
    let mut out = Vec::new();
    // Brace depths at which inline modules opened.
    let mut inline: Vec<usize> = Vec::new();
    let mut braces = 0usize;
    let after_root = |i: usize, out: &mut Vec<(String, usize)>| {
        // tokens[i] is the `::` after the root.
        match tokens.get(i + 1).map(|(t, _)| t.as_str()) {
            Some("{") => out.extend(group_heads(&tokens, i + 1).0),
            Some(_) => out.push(tokens[i + 1].clone()),
            None => {}
        }
    };
    let mut i = 0;
    while i < tokens.len() {
        let t = tokens[i].0.as_str();
        match t {
            "{" => braces += 1,
            "}" => {
                braces = braces.saturating_sub(1);
                if inline.last() == Some(&braces) {
                    inline.pop();
                }
            }
            "mod" if tokens.get(i + 2).is_some_and(|(t, _)| t == "{") => {
                inline.push(braces);
            }
            "crate" if tokens.get(i + 1).is_some_and(|(t, _)| t == "::") => {
                let prev = i.checked_sub(1).map(|p| tokens[p].0.as_str());
                if prev != Some("::") {
                    after_root(i + 1, &mut out);
                }
            }
            "super" if i == 0 || tokens[i - 1].0 != "::" => {
                let (ups, j) = super_chain(&tokens, i);
                if ups > 0 && ups >= file_depth + inline.len() {
                    after_root(j - 1, &mut out);
                }
                i = j.max(i + 1);
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// Every arrow between rooms in `src/`: (from, to, where), tests included.
fn arrows() -> Vec<(String, String, String)> {
    let src = repo_root().join("src");
    let mut out = Vec::new();
    for file in rust_files(&src) {
        let rel = file.strip_prefix(&src).unwrap();
        let Some(room) = room_of(rel) else { continue };
        let text = std::fs::read_to_string(&file).unwrap();
        for (named, line) in roots_named(rel, &text) {
            if named != room && room_of(Path::new(&named)).is_some() && is_room(&src, &named) {
                let at = format!("src/{}:{line}", rel.display());
                out.push((room.clone(), named, at));
            }
        }
    }
    out
}

/// Whether `name` is a top-level module of `src/` (a file or a folder).
fn is_room(src: &Path, name: &str) -> bool {
    src.join(format!("{name}.rs")).is_file() || src.join(name).join("mod.rs").is_file()
}

/// Architecture invariant: a room imports only rooms below it
/// (ARCHITECTURE.md, "Layers"), in production code and in tests alike.
#[test]
fn every_room_imports_only_rooms_below_it() {
    let src = repo_root().join("src");
    let mut found = Vec::new();
    let mut rooms: Vec<String> = std::fs::read_dir(&src)
        .unwrap()
        .flatten()
        .filter_map(|e| room_of(Path::new(&e.file_name())))
        .filter(|r| is_room(&src, r))
        .collect();
    rooms.sort();
    rooms.dedup();
    for room in &rooms {
        if rank(room).is_none() {
            found.push(format!(
                "room `{room}` is in no layer: place it in `LAYERS` (tests/integration/architecture.rs) and in ARCHITECTURE.md's layer table"
            ));
        }
    }
    for (from, to, at) in arrows() {
        let (Some(a), Some(b)) = (rank(&from), rank(&to)) else {
            continue;
        };
        if b >= a && !KNOWN.contains(&(from.as_str(), to.as_str())) {
            found.push(format!(
                "{at}: `{from}` names `{to}`, which is not below it; move the item down, or go through a trait `{from}` defines"
            ));
        }
    }
    assert!(
        found.is_empty(),
        "an import runs up the layers (ARCHITECTURE.md, Layers):\n{}",
        found.join("\n")
    );
}

/// The arrows still being moved are still there (a stale entry would let
/// a new upward arrow between the same rooms pass unseen).
#[test]
fn every_known_upward_arrow_still_exists() {
    let all = arrows();
    for (from, to) in KNOWN {
        assert!(
            all.iter().any(|(f, t, _)| f == from && t == to),
            "`{from}` → `{to}` is gone; remove it from `KNOWN`"
        );
    }
}

/// The guard sees every way a file can name another room.
#[test]
fn the_guard_sees_every_form_of_a_path_to_another_room() {
    let named = |rel: &str, src: &str| -> Vec<String> {
        roots_named(Path::new(rel), src)
            .into_iter()
            .map(|(n, _)| n)
            .collect()
    };
    assert_eq!(
        named("store/mod.rs", "use crate::runs::component;"),
        ["runs"]
    );
    assert_eq!(
        named(
            "store/mod.rs",
            "use crate::{\n  bus::EventBus,\n  runs::{self, x},\n};"
        ),
        ["bus", "runs"]
    );
    assert_eq!(
        named(
            "store/mod.rs",
            "fn f() { let x = crate::mcp::builtin::f(); }"
        ),
        ["mcp"]
    );
    assert_eq!(
        named("store/queue.rs", "use super::super::runs::x;"),
        ["runs"]
    );
    assert_eq!(
        named("store/queue.rs", "use super::Store;"),
        Vec::<String>::new()
    );
    assert_eq!(
        named(
            "store/mod.rs",
            "mod tests { use super::super::hooks::x; use super::y; }"
        ),
        ["hooks"]
    );
    assert_eq!(
        named(
            "cli/output.rs",
            "macro_rules! m { () => { $crate::bus::x() } }"
        ),
        ["bus"]
    );
    assert_eq!(
        named(
            "store/mod.rs",
            "// crate::runs::x\n/* crate::hooks */ let s = \"crate::mcp\"; let r = r#\"crate::api\"#; let c = '\"'; let l: &'a str;"
        ),
        Vec::<String>::new()
    );
    assert_eq!(
        named("store/mod.rs", "pub(in crate::store) fn f() {}"),
        ["store"]
    );
}

/// ARCHITECTURE.md's layer table lists the rooms of `LAYERS`, in order.
#[test]
fn the_layer_table_in_architecture_md_matches_layers() {
    let doc = std::fs::read_to_string(repo_root().join("ARCHITECTURE.md")).unwrap();
    let section = doc
        .split("\n## Layers")
        .nth(1)
        .expect("ARCHITECTURE.md has a `## Layers` section")
        .split("\n## ")
        .next()
        .unwrap();
    let rows: Vec<(String, Vec<String>)> = section
        .lines()
        .filter(|l| l.starts_with("| L"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let rooms = cells[2]
                .split(',')
                .map(|r| r.trim().trim_matches('`').to_string())
                .collect();
            (cells[1].split_once(' ').unwrap().1.to_string(), rooms)
        })
        .collect();
    let want: Vec<(String, Vec<String>)> = LAYERS
        .iter()
        .map(|(layer, rooms)| {
            (
                layer.to_string(),
                rooms.iter().map(|r| r.to_string()).collect(),
            )
        })
        .collect();
    assert_eq!(
        rows, want,
        "ARCHITECTURE.md's layer table and `LAYERS` differ"
    );
}

// ---------------------------------------------------------------------------
// Files inside a room: no import circle (ARCHITECTURE.md, "Layers").
// ---------------------------------------------------------------------------

/// A file's module path: `mcp/client/pool.rs` and `mcp/client/pool/mod.rs`
/// are both `mcp::client::pool`.
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// The names `tokens[i..]` spells after a path's base (`:: a :: b`, or a
/// `:: { … }` group, nested groups included), each appended to `base`.
fn path_tails(tokens: &[(String, usize)], mut i: usize, base: Vec<String>) -> Vec<Vec<String>> {
    let ident = |t: &str| {
        t.chars()
            .next()
            .is_some_and(|c| c.is_alphabetic() || c == '_')
    };
    let mut path = base;
    while tokens.get(i).is_some_and(|(t, _)| t == "::") {
        match tokens.get(i + 1).map(|(t, _)| t.as_str()) {
            Some("{") => {
                let mut out = Vec::new();
                let (mut j, mut nest, mut at_item) = (i + 2, 1usize, true);
                while j < tokens.len() && nest > 0 {
                    let t = tokens[j].0.as_str();
                    match t {
                        "{" => nest += 1,
                        "}" => nest -= 1,
                        "," if nest == 1 => at_item = true,
                        "self" if nest == 1 && at_item => {
                            out.push(path.clone());
                            at_item = false;
                        }
                        _ if nest == 1 && at_item && ident(t) => {
                            let mut item = path.clone();
                            item.push(t.to_string());
                            out.extend(path_tails(tokens, j + 1, item));
                            at_item = false;
                        }
                        _ => {}
                    }
                    j += 1;
                }
                return out;
            }
            Some(t) if ident(t) => {
                path.push(t.to_string());
                i += 2;
            }
            _ => break,
        }
    }
    vec![path]
}

/// Every module path the production code of the file of `module` names
/// (before its first `#[cfg(test)]`): `crate::…`, `super::…` chains,
/// `self::…`, and paths through its own child modules.
fn module_paths_named(module: &[String], src: &str) -> Vec<Vec<String>> {
    let code = src.split("#[cfg(test)]").next().unwrap_or_default();
    let tokens = path_tokens(code);
    let children: Vec<&str> = tokens
        .windows(3)
        .filter(|w| w[0].0 == "mod" && w[2].0 == ";")
        .map(|w| w[1].0.as_str())
        .collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let after_sep = i > 0 && tokens[i - 1].0 == "::";
        let next_sep = tokens.get(i + 1).is_some_and(|(t, _)| t == "::");
        let t = tokens[i].0.as_str();
        if after_sep || !next_sep {
            i += 1;
            continue;
        }
        let (base, at) = match t {
            "crate" => (Vec::new(), i + 1),
            "self" => (module.to_vec(), i + 1),
            "super" => {
                let (ups, j) = super_chain(&tokens, i);
                let keep = module.len().saturating_sub(ups);
                (module[..keep].to_vec(), j - 1)
            }
            _ if children.contains(&t) => {
                let mut base = module.to_vec();
                base.push(t.to_string());
                (base, i + 1)
            }
            _ => {
                i += 1;
                continue;
            }
        };
        out.extend(path_tails(&tokens, at, base));
        i = at + 1;
    }
    out
}

/// The arrows between files of one room: module → modules of the same room
/// it names (a module's own parent or child does not count: declaring and
/// re-exporting are not use). Files named `tests.rs` and folders named
/// `tests` are left out.
fn file_arrows() -> std::collections::BTreeMap<Vec<String>, std::collections::BTreeSet<Vec<String>>>
{
    let src = repo_root().join("src");
    let files: Vec<(Vec<String>, PathBuf)> = rust_files(&src)
        .into_iter()
        .filter_map(|file| {
            let rel = file.strip_prefix(&src).unwrap().to_path_buf();
            let in_tests = rel.components().any(|c| c.as_os_str() == "tests")
                || rel.file_name().is_some_and(|f| f == "tests.rs");
            let module = module_of(&rel);
            (!in_tests && room_of(&rel).is_some() && module.len() >= 2 || {
                // A room that is a folder is a module of its own (`mcp/mod.rs`).
                !in_tests && module.len() == 1 && src.join(&module[0]).is_dir()
            })
            .then_some((module, file))
        })
        .collect();
    let known: std::collections::BTreeSet<Vec<String>> =
        files.iter().map(|(m, _)| m.clone()).collect();
    let mut arrows: std::collections::BTreeMap<_, std::collections::BTreeSet<_>> =
        Default::default();
    for (module, file) in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for path in module_paths_named(module, &text) {
            let Some(target) = (1..=path.len())
                .rev()
                .map(|k| path[..k].to_vec())
                .find(|p| known.contains(p))
            else {
                continue;
            };
            let related = target.starts_with(module) || module.starts_with(&target);
            if target[0] == module[0] && !related {
                arrows.entry(module.clone()).or_default().insert(target);
            }
        }
    }
    arrows
}

/// The sets of at least two modules that reach each other (Tarjan).
fn circles(
    arrows: &std::collections::BTreeMap<Vec<String>, std::collections::BTreeSet<Vec<String>>>,
) -> Vec<Vec<String>> {
    struct Walk<'a> {
        arrows:
            &'a std::collections::BTreeMap<Vec<String>, std::collections::BTreeSet<Vec<String>>>,
        index: std::collections::HashMap<&'a [String], (usize, usize)>,
        stack: Vec<&'a [String]>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a [String]) {
            self.index.insert(v, (self.next, self.next));
            self.next += 1;
            self.stack.push(v);
            for w in self.arrows.get(v).into_iter().flatten() {
                let w = w.as_slice();
                match self.index.get(w).copied() {
                    None => {
                        self.visit(w);
                        let low = self.index[w].1.min(self.index[v].1);
                        self.index.get_mut(v).unwrap().1 = low;
                    }
                    Some((wi, _)) if self.stack.contains(&w) => {
                        let low = wi.min(self.index[v].1);
                        self.index.get_mut(v).unwrap().1 = low;
                    }
                    Some(_) => {}
                }
            }
            let (vi, low) = self.index[v];
            if vi == low {
                let mut circle = Vec::new();
                while let Some(w) = self.stack.pop() {
                    circle.push(w.join("::"));
                    if w == v {
                        break;
                    }
                }
                if circle.len() > 1 {
                    circle.sort();
                    self.out.push(circle);
                }
            }
        }
    }
    let mut walk = Walk {
        arrows,
        index: Default::default(),
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in arrows.keys() {
        if !walk.index.contains_key(v.as_slice()) {
            walk.visit(v);
        }
    }
    walk.out
}

/// Architecture invariant: no two files of a room import each other, even
/// through a third (ARCHITECTURE.md, "Layers"): inside a room, as between
/// rooms, a seam goes through a trait or a type the lower file defines.
#[test]
fn no_files_of_a_room_import_each_other() {
    let arrows = file_arrows();
    assert!(
        arrows.values().map(|t| t.len()).sum::<usize>() > 50,
        "the file graph found almost no arrows; the path reader is broken"
    );
    let found = circles(&arrows);
    assert!(
        found.is_empty(),
        "files of a room import each other; move the shared item into the lower file (or the room's `mod.rs`), or go through a trait:\n{}",
        found
            .iter()
            .map(|c| c.join(", "))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The file graph sees every form of a path to a sibling file, and finds a
/// circle when there is one.
#[test]
fn the_file_guard_sees_sibling_paths_and_circles() {
    let named = |module: &str, src: &str| -> Vec<String> {
        let module: Vec<String> = module.split("::").map(str::to_string).collect();
        module_paths_named(&module, src)
            .into_iter()
            .map(|p| p.join("::"))
            .collect()
    };
    assert_eq!(
        named("mcp::call", "use super::client::pool::{Pool, X};"),
        ["mcp::client::pool::Pool", "mcp::client::pool::X"]
    );
    assert_eq!(
        named(
            "mcp::client::wire",
            "use crate::mcp::{lock, passthrough::{self, P}};"
        ),
        ["mcp::lock", "mcp::passthrough", "mcp::passthrough::P"]
    );
    assert_eq!(
        named("mcp", "mod pool;\nfn f() { pool::g(); self::call::h(); }"),
        ["mcp::pool::g", "mcp::call::h"]
    );
    assert_eq!(
        named(
            "runs::fleet",
            "// super::mirror::x\nlet s = \"super::mirror\";\n#[cfg(test)]\nmod tests { use super::super::mirror::y; }"
        ),
        Vec::<String>::new()
    );
    let module = |s: &str| s.split("::").map(str::to_string).collect::<Vec<_>>();
    let mut arrows: std::collections::BTreeMap<_, std::collections::BTreeSet<_>> =
        Default::default();
    arrows
        .entry(module("r::a"))
        .or_default()
        .insert(module("r::b"));
    arrows
        .entry(module("r::b"))
        .or_default()
        .insert(module("r::c"));
    assert!(circles(&arrows).is_empty());
    arrows
        .entry(module("r::c"))
        .or_default()
        .insert(module("r::a"));
    assert_eq!(circles(&arrows), vec![vec!["r::a", "r::b", "r::c"]]);
}

// ---------------------------------------------------------------------------
// Rooms' own invariants that a source scan can hold (ARCHITECTURE.md, Rooms).
// ---------------------------------------------------------------------------

/// Production lines of the files `rels` (paths below `src/`) that contain
/// any of `forbidden`, comments left out.
fn file_offenders(rels: &[&str], forbidden: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for rel in rels {
        let path = repo_root().join("src").join(rel);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("src/{rel} is gone ({e}); update this test"));
        for (i, line) in production_code(&text).lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for needle in forbidden {
                if code.contains(needle) {
                    found.push(format!("src/{rel}:{}: `{needle}`", i + 1));
                }
            }
        }
    }
    found
}

/// What opens a socket of its own: binding, connecting, an HTTP client.
const SOCKET_OPENERS: [&str; 12] = [
    "TcpListener::bind",
    "TcpStream::connect",
    "UnixListener::bind",
    "UnixStream::connect",
    "UnixDatagram::",
    "UdpSocket::",
    "TcpSocket::",
    "reqwest::Client",
    "reqwest::get",
    "libc::socket(",
    "libc::bind(",
    "libc::connect(",
];

/// The files outside `surfaces` that open sockets, each for a reason of
/// its own. `store::pg` connects through `tokio_postgres`, which only
/// `store` may name (`only_store_opens_sqlite_and_only_supervisor_spawns`).
const SOCKET_EXCEPTIONS: &[(&str, &str)] = &[
    ("runtime/lock.rs", "the lock's abstract socket"),
    (
        "mcp/builtin/fetch.rs",
        "`fetch_url`, pinned to the address it checked",
    ),
    ("mcp/builtin/search.rs", "the web search backends"),
    (
        "panes/recovery.rs",
        "`npc-recovery` asks an agent's loopback server",
    ),
    (
        "runs/sandbox.rs",
        "the egress proxy's socket of a sandboxed run",
    ),
    (
        "supervisor/sandbox.rs",
        "the stub's forwarder inside the network namespace",
    ),
];

/// Architecture invariant: only `surfaces` binds or connects sockets, but
/// for the files of `SOCKET_EXCEPTIONS`.
#[test]
fn only_surfaces_binds_or_connects_sockets() {
    let src = repo_root().join("src");
    let mut found = Vec::new();
    for file in rust_files(&src) {
        let rel = file.strip_prefix(&src).unwrap().display().to_string();
        let in_tests = rel.ends_with("tests.rs") || rel.contains("/tests/");
        let excepted = SOCKET_EXCEPTIONS.iter().any(|(f, _)| *f == rel);
        if rel.starts_with("surfaces/") || in_tests || excepted {
            continue;
        }
        found.extend(file_offenders(&[rel.as_str()], &SOCKET_OPENERS));
    }
    assert!(
        found.is_empty(),
        "only src/surfaces opens sockets; put the listener or client there, or name the file in `SOCKET_EXCEPTIONS` with its reason:\n{}",
        found.join("\n")
    );
    for (rel, why) in SOCKET_EXCEPTIONS {
        assert!(
            !file_offenders(&[rel], &SOCKET_OPENERS).is_empty(),
            "src/{rel} ({why}) opens no socket any more; remove it from `SOCKET_EXCEPTIONS`"
        );
    }
}

/// Architecture invariant: inside `mcp`, `client` names neither `server`
/// nor `call`, and `passthrough` (the one bridge) neither half.
#[test]
fn the_mcp_client_and_the_bridge_name_no_other_half() {
    let forbidden: [(&str, &[&str]); 2] = [
        ("mcp::client", &["mcp::server", "mcp::call"]),
        ("mcp::passthrough", &["mcp::client", "mcp::server"]),
    ];
    let arrows = file_arrows();
    let mut found = Vec::new();
    for (from, targets) in &arrows {
        let from = from.join("::");
        for (half, others) in forbidden {
            if from != half && !from.starts_with(&format!("{half}::")) {
                continue;
            }
            for target in targets {
                let target = target.join("::");
                if others
                    .iter()
                    .any(|o| target == *o || target.starts_with(&format!("{o}::")))
                {
                    found.push(format!("`{from}` names `{target}`"));
                }
            }
        }
    }
    assert!(
        arrows
            .keys()
            .any(|m| m.join("::").starts_with("mcp::client")),
        "the file graph lost `mcp::client`; the path reader is broken"
    );
    assert!(
        found.is_empty(),
        "the MCP client and the bridge stay apart from the server half; go through a type `mcp` defines:\n{}",
        found.join("\n")
    );
}

/// Architecture invariant: the ACP client of an agent's program is sans-IO:
/// frames in, steps out; no runtime, disk, environment, process or socket.
#[test]
fn the_acp_client_does_no_io() {
    // `surfaces::jsonrpc`'s frames are wire types, no socket.
    let mut forbidden: Vec<&str> = IMPURE
        .into_iter()
        .filter(|n| *n != "crate::surfaces")
        .collect();
    forbidden.extend(DISK_AND_ENVIRONMENT);
    forbidden.extend(["std::io", "std::net"]);
    let mut found = file_offenders(&["providers/acp.rs"], &forbidden);
    found.extend(production_offenders("providers/acp", &forbidden));
    assert!(
        found.is_empty(),
        "src/providers/acp does I/O; leave it to `runs::agent::acp`:\n{}",
        found.join("\n")
    );
}

/// Architecture invariant: `disk` interprets nothing: it reads bytes and
/// variables and hands them to `model`, naming no parser, no format and
/// no stage of the loader.
#[test]
fn disk_interprets_nothing() {
    let found = file_offenders(
        &["disk.rs"],
        &[
            "serde",
            "toml",
            "json",
            "regex",
            "minijinja",
            "Diagnostic",
            "model::de",
            "model::raw",
            "model::parse",
            "model::lower::lower",
            "model::template",
        ],
    );
    assert!(
        found.is_empty(),
        "src/disk.rs interprets what it reads; leave that to `model`:\n{}",
        found.join("\n")
    );
}

/// Architecture invariant: the fleet front of a daemon (`runtime::fleet`)
/// only enqueues: it never claims a run nor carries one out.
#[test]
fn the_fleet_front_never_claims_or_carries_out_a_run() {
    let found = file_offenders(
        &["runtime/fleet.rs"],
        &[
            ".claim(",
            "claim_run(",
            "Worker",
            "execute(",
            "executor::run",
        ],
    );
    assert!(
        found.is_empty(),
        "src/runtime/fleet.rs claims or runs a run; that is `npc worker`'s (`runs::fleet`):\n{}",
        found.join("\n")
    );
}

/// Fewest files of `src/cli` (fewer means the walk lost them).
const MIN_CLI_FILES: usize = 10;

/// Architecture invariant: the command line prints only through
/// `cli::output` (clippy denies `println!` there too); `npc pane attach`
/// alone writes a pane's bytes to the terminal itself.
#[test]
fn the_cli_writes_only_through_its_output() {
    let rels: Vec<String> = rust_files(&repo_root().join("src/cli"))
        .into_iter()
        .map(|f| {
            f.strip_prefix(repo_root().join("src"))
                .unwrap()
                .display()
                .to_string()
        })
        .filter(|rel| rel != "cli/output.rs")
        .collect();
    let rels: Vec<&str> = rels.iter().map(String::as_str).collect();
    assert!(
        rels.len() >= MIN_CLI_FILES,
        "src/cli has few files: {rels:?}"
    );
    let found = file_offenders(&rels, &["println!", "eprintln!", "print!(", "eprint!("]);
    assert!(
        found.is_empty(),
        "write through `cli::output` (`out!`, `outln!`, `errln!`):\n{}",
        found.join("\n")
    );
}

/// Durations written as literals in production code that are still to be
/// named (file below `src/`, the literal as written). Empty when every
/// timeout and pause is a named constant.
const UNNAMED_DURATIONS: &[(&str, &str)] = &[];

/// Architecture invariant: a timeout or pause is a named constant next to
/// the code it bounds: no `Duration::from_secs(5)` in production code but
/// in a `const` (and the few `UNNAMED_DURATIONS` still to be named).
#[test]
fn every_timeout_is_a_named_constant() {
    let src = repo_root().join("src");
    let mut found = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for file in rust_files(&src) {
        let rel = file.strip_prefix(&src).unwrap().display().to_string();
        if rel.ends_with("tests.rs") || rel.contains("/tests/") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let mut previous = "";
        for (i, line) in production_code(&text).lines().enumerate() {
            let code = line.split("//").next().unwrap_or("").trim();
            let in_const =
                code.contains("const ") || (previous.contains("const ") && previous.ends_with('='));
            for unit in ["Duration::from_secs(", "Duration::from_millis("] {
                let mut rest = code;
                while let Some(at) = rest.find(unit) {
                    let after = &rest[at + unit.len()..];
                    let literal = after.starts_with(|c: char| c.is_ascii_digit());
                    if literal && !in_const {
                        let close = after.find(')').map_or(after.len(), |c| c + 1);
                        let written = format!("{unit}{}", &after[..close]);
                        if UNNAMED_DURATIONS.contains(&(rel.as_str(), written.as_str())) {
                            seen.insert((rel.clone(), written));
                        } else {
                            found.push(format!("src/{rel}:{}: `{written}`", i + 1));
                        }
                    }
                    rest = after;
                }
            }
            if !code.is_empty() {
                previous = code;
            }
        }
    }
    assert!(
        found.is_empty(),
        "name each timeout as a constant next to the code it bounds:\n{}",
        found.join("\n")
    );
    for (rel, written) in UNNAMED_DURATIONS {
        assert!(
            seen.contains(&(rel.to_string(), written.to_string())),
            "`{written}` in src/{rel} is gone; remove it from `UNNAMED_DURATIONS`"
        );
    }
}

// ---------------------------------------------------------------------------
// ARCHITECTURE.md's shape: short rooms, each invariant naming its test.
// ---------------------------------------------------------------------------

/// The bound on ARCHITECTURE.md: a map to read in one sitting (about a
/// third of it the names of the tests that hold its invariants); the
/// detail lives in `docs/dev/`.
const MAX_ARCHITECTURE_BYTES: usize = 32_000;
/// Lines of a room's description (before its invariants).
const MAX_ROOM_DESCRIPTION_LINES: usize = 3;
/// Lines of one invariant, its bullet and its indented continuation.
const MAX_INVARIANT_LINES: usize = 4;
/// Columns of a line of a room's section.
const MAX_ROOM_LINE_CHARS: usize = 100;
/// How an invariant's bullet starts.
const INVARIANT_BULLET: &str = "- Architecture invariant:";
/// How a room's closing link to its deep dive starts.
const DEEP_DIVE: &str = "Deep dive:";
/// The one section under "Rooms" that is no room.
const OUTSIDE_SRC: &str = "Outside src";
/// Lines after a test attribute within which its `fn` follows (other
/// attributes, a doc line between).
const TEST_FN_WITHIN_LINES: usize = 4;
/// Fewest tests the scan finds, and fewest invariants ARCHITECTURE.md
/// holds: fewer means a reader is broken, not that they went.
const MIN_TESTS: usize = 1_000;
const MIN_INVARIANTS: usize = 60;

/// The names of every test function under `src/` and `tests/`: a `fn`
/// within a few lines after `#[test]` or `#[tokio::test…]`.
fn test_names() -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut files = rust_files(&repo_root().join("src"));
    files.extend(rust_files(&repo_root().join("tests")));
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let attr = line.trim_start();
            if !(attr.starts_with("#[test]") || attr.starts_with("#[tokio::test")) {
                continue;
            }
            let name = lines[i + 1..]
                .iter()
                .take(TEST_FN_WITHIN_LINES)
                .find_map(|l| l.split("fn ").nth(1))
                .map(|rest| rest.split(['(', '<']).next().unwrap_or("").trim());
            if let Some(name) = name.filter(|n| !n.is_empty() && !n.starts_with('$')) {
                names.insert(name.to_string());
            }
        }
    }
    names
}

/// A `### ` section of ARCHITECTURE.md's "Rooms": its heading, its
/// description lines, its invariants (bullet and continuation joined), and
/// every line with its number.
struct RoomSection {
    heading: String,
    description: Vec<String>,
    invariants: Vec<(usize, String, usize)>,
    lines: Vec<(usize, String)>,
}

fn room_sections(doc: &str) -> Vec<RoomSection> {
    let rooms_at = doc
        .find("\n## Rooms")
        .expect("ARCHITECTURE.md has a `## Rooms` section");
    let first_line = doc[..rooms_at].lines().count() + 1;
    let rooms = &doc[rooms_at + 1..];
    let rooms = rooms[1..].split("\n## ").next().unwrap();
    let mut sections: Vec<RoomSection> = Vec::new();
    for (n, line) in rooms.lines().enumerate() {
        let number = first_line + n;
        if let Some(heading) = line.strip_prefix("### ") {
            sections.push(RoomSection {
                heading: heading.trim().to_string(),
                description: Vec::new(),
                invariants: Vec::new(),
                lines: Vec::new(),
            });
            continue;
        }
        let Some(section) = sections.last_mut() else {
            continue;
        };
        section.lines.push((number, line.to_string()));
        let continues = line.starts_with("  ") && !line.trim().is_empty();
        if line.starts_with(INVARIANT_BULLET) {
            section.invariants.push((number, line.to_string(), 1));
        } else if continues && !section.invariants.is_empty() {
            let (_, text, count) = section.invariants.last_mut().unwrap();
            text.push(' ');
            text.push_str(line.trim());
            *count += 1;
        } else if !line.trim().is_empty()
            && !line.starts_with(DEEP_DIVE)
            && section.invariants.is_empty()
        {
            section.description.push(line.to_string());
        }
    }
    sections
}

/// The backticked names of an invariant's closing parenthesis: "… (`a`,
/// `b`)." gives `a` and `b`; none when it does not end so.
fn named_tests(invariant: &str) -> Vec<String> {
    let end = invariant.trim_end();
    let end = end.strip_suffix('.').unwrap_or(end);
    let Some(inner) = end.strip_suffix(')') else {
        return Vec::new();
    };
    let Some((_, list)) = inner.rsplit_once('(') else {
        return Vec::new();
    };
    let names: Vec<&str> = list.split(',').map(str::trim).collect();
    let all_names = names.iter().all(|n| {
        n.len() > 2
            && n.starts_with('`')
            && n.ends_with('`')
            && n[1..n.len() - 1]
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    });
    if !all_names {
        return Vec::new();
    }
    names
        .iter()
        .map(|n| n.trim_matches('`').to_string())
        .collect()
}

/// Architecture invariant: every invariant of ARCHITECTURE.md ends naming,
/// in a closing parenthesis, the tests that hold it, and each is a test of
/// `src/` or `tests/`.
#[test]
fn every_architecture_invariant_names_a_test_that_exists() {
    let doc = std::fs::read_to_string(repo_root().join("ARCHITECTURE.md")).unwrap();
    let tests = test_names();
    assert!(tests.len() >= MIN_TESTS, "only {} tests found", tests.len());
    let mut found = Vec::new();
    let mut invariants = 0;
    for section in room_sections(&doc) {
        for (line, text, _) in &section.invariants {
            invariants += 1;
            let named = named_tests(text);
            if named.is_empty() {
                found.push(format!(
                    "ARCHITECTURE.md:{line}: ends naming no test: end it with \"(`test_name`, …)\""
                ));
            }
            for name in named.iter().filter(|n| !tests.contains(*n)) {
                found.push(format!(
                    "ARCHITECTURE.md:{line}: `{name}` is no test under src/ or tests/"
                ));
            }
        }
    }
    let stray = doc
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains("Architecture invariant") && !l.starts_with(INVARIANT_BULLET));
    for (i, line) in stray {
        found.push(format!(
            "ARCHITECTURE.md:{}: an invariant is a bullet `{INVARIANT_BULLET} …` under its room: `{line}`",
            i + 1
        ));
    }
    assert!(
        invariants >= MIN_INVARIANTS,
        "only {invariants} invariants found"
    );
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// ARCHITECTURE.md stays a map: under its size bound; a section per room
/// of `LAYERS`, in layer order; each room's description at most three
/// lines, each invariant at most four, no line wider than the bound; and
/// every relative link (the deep dives) names a file that exists.
#[test]
fn every_room_of_architecture_md_is_short_and_in_layer_order() {
    let doc = std::fs::read_to_string(repo_root().join("ARCHITECTURE.md")).unwrap();
    let mut found = Vec::new();
    if doc.len() > MAX_ARCHITECTURE_BYTES {
        found.push(format!(
            "ARCHITECTURE.md is {} bytes, more than {MAX_ARCHITECTURE_BYTES}: move the detail to docs/dev/",
            doc.len()
        ));
    }
    let sections = room_sections(&doc);
    let headings: Vec<&str> = sections
        .iter()
        .map(|s| s.heading.as_str())
        .filter(|h| *h != OUTSIDE_SRC)
        .collect();
    let rooms: Vec<&str> = LAYERS.iter().flat_map(|(_, r)| r.iter().copied()).collect();
    if headings != rooms {
        found.push(format!(
            "ARCHITECTURE.md's rooms {headings:?} are not `LAYERS`' rooms in order {rooms:?}"
        ));
    }
    for section in &sections {
        let room = &section.heading;
        if section.description.len() > MAX_ROOM_DESCRIPTION_LINES {
            found.push(format!(
                "room `{room}`: a description of {} lines, more than {MAX_ROOM_DESCRIPTION_LINES}: move the rest to its deep dive",
                section.description.len()
            ));
        }
        for (line, _, count) in &section.invariants {
            if *count > MAX_INVARIANT_LINES {
                found.push(format!(
                    "ARCHITECTURE.md:{line}: an invariant of {count} lines, more than {MAX_INVARIANT_LINES}"
                ));
            }
        }
        for (line, text) in &section.lines {
            if text.chars().count() > MAX_ROOM_LINE_CHARS {
                found.push(format!(
                    "ARCHITECTURE.md:{line}: wider than {MAX_ROOM_LINE_CHARS} columns"
                ));
            }
        }
    }
    for (i, line) in doc.lines().enumerate() {
        for target in line.split("](").skip(1) {
            let target = target.split(')').next().unwrap_or("");
            let path = target.split('#').next().unwrap_or("");
            if path.is_empty() || path.contains("://") {
                continue;
            }
            if !repo_root().join(path).exists() {
                found.push(format!(
                    "ARCHITECTURE.md:{}: `{target}` does not exist",
                    i + 1
                ));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The readers of ARCHITECTURE.md see what a person sees.
#[test]
fn the_architecture_md_reader_splits_rooms_and_joins_invariants() {
    let doc = "# A\n\n## Rooms\n\nIntro.\n\n### stdx\n\nOne.\nTwo.\n\n- Architecture invariant: a\n  b (`x`, `y_2`).\n- Architecture invariant: c (`z`)\n\nDeep dive: [d](d.md)\n\n### cli\n\n- Architecture invariant: e (see `f`) g\n\n## Next\n\n### not a room\n";
    let sections = room_sections(doc);
    let headings: Vec<&str> = sections.iter().map(|s| s.heading.as_str()).collect();
    assert_eq!(headings, ["stdx", "cli"]);
    assert_eq!(sections[0].description, ["One.", "Two."]);
    let invariants: Vec<(&str, usize)> = sections[0]
        .invariants
        .iter()
        .map(|(_, t, n)| (t.as_str(), *n))
        .collect();
    assert_eq!(
        invariants,
        [
            ("- Architecture invariant: a b (`x`, `y_2`).", 2),
            ("- Architecture invariant: c (`z`)", 1)
        ]
    );
    assert_eq!(named_tests(&sections[0].invariants[0].1), ["x", "y_2"]);
    assert!(named_tests(&sections[1].invariants[0].1).is_empty());
    assert!(named_tests("a (`Text::expose`)").is_empty());
    assert!(test_names().contains("the_architecture_md_reader_splits_rooms_and_joins_invariants"));
}
