//! State that arrives with a clone is input, never npc's own: a `.npc/`
//! committed to a repository (a token, a database, a git mirror with
//! hooks) is moved aside unread and npc makes its own, through the real
//! binary and a real `git clone`. See `docs/security.md`.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::{Daemon, npc};
use crate::worktrees::git;

const API_ANY_PORT: &str = "version = 1\n[daemon]\nlisten = \"127.0.0.1:0\"\n";

/// A token a hostile repository commits as `.npc/api.token`.
const SHIPPED_TOKEN: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// The daemon's API address, from its first `api.listening` event after
/// the event `after`.
fn api_after(d: &Daemon, after: i64) -> String {
    let event = d.wait_event(after, "api.listening");
    let url = event["payload"]["url"].as_str().unwrap();
    url.strip_prefix("http://").unwrap().to_string()
}

/// The status of `GET /api/v1/status` on the API at `addr` with `token`.
fn status_with(addr: &str, token: &str) -> u16 {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        stream,
        "GET /api/v1/status HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).unwrap();
    String::from_utf8_lossy(&head[9..12]).parse().unwrap()
}

/// The entries of `dir` whose names hold `.untrusted-`.
fn moved_aside(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .contains(".untrusted-")
        })
        .collect()
}

/// A repository that commits a whole `.npc/` (what `git add -f` allows):
/// a token, a database, a mirror whose hooks and fsmonitor write `canary`.
/// Returned as a fresh clone, as a user gets it.
fn hostile_clone(canary: &Path) -> (tempfile::TempDir, tempfile::TempDir) {
    let origin = tempfile::tempdir().unwrap();
    let dir = origin.path();
    git(dir, &["init", "--quiet", "--initial-branch=main"]);
    std::fs::write(dir.join("npcagent.toml"), API_ANY_PORT).unwrap();
    let state = dir.join(".npc");
    std::fs::create_dir_all(state.join("mirror.git/hooks")).unwrap();
    std::fs::write(state.join("api.token"), SHIPPED_TOKEN).unwrap();
    std::fs::write(state.join("state.db"), b"SQLite format 3\0 shipped rows").unwrap();
    std::fs::write(
        state.join("npc.owner"),
        "npc state v1 0000000000000000000000000000000000000000000000000000000000000000\n",
    )
    .unwrap();
    let hook = format!("#!/bin/sh\ntouch {}\n", canary.display());
    for name in [
        "post-checkout",
        "reference-transaction",
        "post-index-change",
    ] {
        let path = state.join("mirror.git/hooks").join(name);
        std::fs::write(&path, &hook).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::write(
        state.join("mirror.git/config"),
        format!(
            "[core]\n\tbare = true\n\tfsmonitor = \"touch {}\"\n",
            canary.display()
        ),
    )
    .unwrap();
    git(dir, &["add", "--all", "--force"]);
    git(dir, &["commit", "--quiet", "-m", "ship state"]);
    let clone = tempfile::tempdir().unwrap();
    git(
        clone.path(),
        &["clone", "--quiet", dir.to_str().unwrap(), "."],
    );
    assert!(clone.path().join(".npc/api.token").exists());
    (origin, clone)
}

#[test]
fn a_state_directory_that_came_with_a_clone_is_moved_aside_unread() {
    let canary_dir = tempfile::tempdir().unwrap();
    let canary = canary_dir.path().join("ran");
    let (_origin, clone) = hostile_clone(&canary);
    let root = clone.path();
    let shipped_db = std::fs::read(root.join(".npc/state.db")).unwrap();

    let mut d = Daemon::start_in(root);
    let api = api_after(&d, 0);
    // The shipped token is no credential; the one npc made is.
    assert_eq!(status_with(&api, SHIPPED_TOKEN), 401);
    let token = std::fs::read_to_string(root.join(".npc/api.token")).unwrap();
    assert_ne!(token.trim(), SHIPPED_TOKEN);
    assert_eq!(status_with(&api, token.trim()), 200);
    // What came with the clone is beside, whole and unread.
    let aside = moved_aside(root);
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(
        std::fs::read_to_string(aside[0].join("api.token")).unwrap(),
        SHIPPED_TOKEN
    );
    assert_eq!(
        std::fs::read(aside[0].join("state.db")).unwrap(),
        shipped_db
    );
    assert!(
        d.log().contains("moved aside unread"),
        "the daemon says so: {}",
        d.log()
    );
    // npc's own directory is private and proves itself on the next start:
    // kept, with its token.
    let mode = std::fs::metadata(root.join(".npc"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
    let before = d.last_event_id();
    d.terminate();
    d.restart();
    let api = api_after(&d, before);
    assert_eq!(moved_aside(root).len(), 1);
    assert_eq!(
        std::fs::read_to_string(root.join(".npc/api.token")).unwrap(),
        token
    );
    assert_eq!(status_with(&api, token.trim()), 200);
    drop(d);
    assert!(!canary.exists(), "nothing the shipped mirror holds ran");
}

#[test]
fn a_copied_state_directory_is_not_proven_by_its_owner_file() {
    // The owner file binds the directory's identity: copying npc's own
    // state elsewhere (as an archive or another checkout would) proves
    // nothing there.
    let first = tempfile::tempdir().unwrap();
    std::fs::write(first.path().join("npcagent.toml"), "version = 1\n").unwrap();
    npc()
        .current_dir(first.path())
        .args(["apply", "--auto-approve"])
        .assert()
        .success();
    assert!(first.path().join(".npc/npc.owner").exists());
    let second = tempfile::tempdir().unwrap();
    std::fs::write(second.path().join("npcagent.toml"), "version = 1\n").unwrap();
    let copy = std::process::Command::new("cp")
        .args(["-a"])
        .arg(first.path().join(".npc"))
        .arg(second.path().join(".npc"))
        .status()
        .unwrap();
    assert!(copy.success());
    npc()
        .current_dir(second.path())
        .args(["apply", "--auto-approve"])
        .assert()
        .success();
    assert_eq!(moved_aside(second.path()).len(), 1);
    assert_eq!(moved_aside(first.path()).len(), 0);
    // The original is still npc's own where it was made.
    npc()
        .current_dir(first.path())
        .args(["apply", "--auto-approve"])
        .assert()
        .success();
    assert_eq!(moved_aside(first.path()).len(), 0);
}

#[test]
fn a_token_file_others_may_read_is_replaced_never_used() {
    let mut d = Daemon::start(API_ANY_PORT);
    let root = d.root().to_path_buf();
    let own = std::fs::read_to_string(root.join(".npc/api.token")).unwrap();
    assert_eq!(status_with(&api_after(&d, 0), own.trim()), 200);
    let before = d.last_event_id();
    d.terminate();
    // Something other than npc (an agent's run, an unpacked archive) puts
    // a token there as files are usually written: readable by all.
    let token = root.join(".npc/api.token");
    std::fs::remove_file(&token).unwrap();
    std::fs::write(&token, SHIPPED_TOKEN).unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
    d.restart();
    let api = api_after(&d, before);
    assert_eq!(status_with(&api, SHIPPED_TOKEN), 401);
    let now = std::fs::read_to_string(&token).unwrap();
    assert_ne!(now.trim(), SHIPPED_TOKEN);
    assert_eq!(status_with(&api, now.trim()), 200);
    let mode = std::fs::metadata(&token).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn processes_opening_a_fresh_repository_at_once_all_succeed() {
    // Each round: a fresh repository, and at once an `npc apply` (the
    // writer), an `npc events` (a reader) and agents' hook calls (each
    // opens the store to record its call): each claims the state directory
    // and finds the database being created.
    const ROUNDS: usize = 8;
    const HOOK_CALLS: usize = 3;
    const MANIFEST: &str = "version = 1\n[[hooks.before_tool]]\ncommand = \"true\"\n";
    const CALL: &str = r#"{"tool_call":{"name":"x","arguments":{}}}"#;
    for _ in 0..ROUNDS {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("npcagent.toml"), MANIFEST).unwrap();
        let mut commands: Vec<Vec<&str>> = vec![vec!["apply", "--auto-approve"], vec!["events"]];
        commands.extend((0..HOOK_CALLS).map(|_| vec!["hook", "run", "before_tool"]));
        let children: Vec<_> = commands
            .iter()
            .map(|args| {
                let mut child = std::process::Command::new(crate::support::npc_path())
                    .current_dir(dir.path())
                    .args(args)
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap();
                // Only the hook calls read it; the others may be gone.
                let _ = child.stdin.take().unwrap().write_all(CALL.as_bytes());
                child
            })
            .collect();
        for (child, args) in children.into_iter().zip(&commands) {
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "npc {args:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert_eq!(
            moved_aside(dir.path()).len(),
            0,
            "one state directory, made once"
        );
    }
}

#[test]
fn a_state_directory_inside_the_runtime_directory_is_never_moved_aside_with_it() {
    // `state_dir = ".npc/data"`: the first command to run only opens the
    // store (a hook call); the runtime directory around it is npc's own
    // from then on, so the next command (which takes the lock in `.npc`)
    // keeps both.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("npcagent.toml"),
        "version = 1\n[project]\nstate_dir = \".npc/data\"\n[[hooks.before_tool]]\ncommand = \"true\"\n",
    )
    .unwrap();
    npc()
        .current_dir(dir.path())
        .args(["hook", "run", "before_tool"])
        .write_stdin(r#"{"tool_call":{"name":"x","arguments":{}}}"#)
        .assert()
        .success();
    let db = dir.path().join(".npc/data/state.db");
    assert!(db.exists());
    npc()
        .current_dir(dir.path())
        .args(["apply", "--auto-approve"])
        .assert()
        .success();
    assert_eq!(moved_aside(dir.path()).len(), 0);
    assert_eq!(moved_aside(&dir.path().join(".npc")).len(), 0);
    assert!(db.exists());
    assert!(dir.path().join(".npc/daemon.lock").exists());
}
