//! `npc apply` applies the plan that was shown: an edit of the manifest or
//! of a file it references between the question and the answer (or between
//! `npc plan --out FILE` and `npc apply FILE`) is refused and changes
//! nothing, with a daemon and without. The question is answered through a
//! real pseudo-terminal, after the edit.

use std::io::{Read as _, Write as _};
use std::path::Path;
use std::sync::mpsc;

use crate::support::{Daemon, DaemonSetup, WAIT_LIMIT, npc, npc_path, stderr_of, stdout_of};
use crate::worktrees::git;

const STALE: &str = "the manifest changed since the plan was shown; run `npc plan` again";

const MANIFEST: &str = r#"version = 1
[mcp.servers.alpha]
command = "sleep"
args = ["1000"]
[prompts.review]
file = "prompts/review.md"
"#;

fn repository() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("npcagent.toml"), MANIFEST).unwrap();
    std::fs::create_dir_all(dir.path().join("prompts")).unwrap();
    std::fs::write(dir.path().join("prompts/review.md"), "review it\n").unwrap();
    dir
}

/// `npc apply` in `root` on a terminal: `edit` runs once it asks, then it
/// gets `yes`. Its exit code and everything it wrote.
fn apply_answering_after(root: &Path, edit: impl FnOnce()) -> (u32, String) {
    use portable_pty::{CommandBuilder, PtySize, native_pty_system};
    let pair = native_pty_system()
        .openpty(PtySize {
            rows: 50,
            cols: 400,
            pixel_width: 0,
            pixel_height: 0,
        })
        .unwrap();
    let mut cmd = CommandBuilder::new(npc_path());
    cmd.arg("apply");
    cmd.cwd(root);
    let mut child = pair.slave.spawn_command(cmd).unwrap();
    drop(pair.slave);
    let mut reader = pair.master.try_clone_reader().unwrap();
    let mut writer = pair.master.take_writer().unwrap();
    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let deadline = std::time::Instant::now() + WAIT_LIMIT;
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("Only `yes` applies") {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let chunk = rx.recv_timeout(left).unwrap_or_else(|_| {
            panic!("npc apply did not ask:\n{}", String::from_utf8_lossy(&seen))
        });
        seen.extend(chunk);
    }
    edit();
    writer.write_all(b"yes\n").unwrap();
    writer.flush().unwrap();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(chunk) => seen.extend(chunk),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("npc apply did not end:\n{}", String::from_utf8_lossy(&seen))
            }
        }
    }
    let status = child.wait().unwrap();
    (
        status.exit_code(),
        String::from_utf8_lossy(&seen).into_owned(),
    )
}

#[test]
fn apply_refuses_an_edit_made_while_it_asked_without_a_daemon() {
    let dir = repository();
    let (code, out) = apply_answering_after(dir.path(), || {
        std::fs::write(dir.path().join("prompts/review.md"), "approve it\n").unwrap();
    });
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(STALE), "{out}");
    // Nothing was recorded or written.
    npc()
        .current_dir(dir.path())
        .args(["plan"])
        .assert()
        .success()
        .stdout(predicates::str::contains(
            "compared with nothing applied yet",
        ));
    assert!(!dir.path().join(".mcp.json").exists());
    // Unchanged while it asks: applied.
    let (code, out) = apply_answering_after(dir.path(), || {});
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("Applied without a daemon"), "{out}");
}

#[test]
fn apply_refuses_an_edit_made_while_it_asked_with_a_daemon() {
    let d = Daemon::start_with(
        MANIFEST,
        DaemonSetup {
            files: &[("prompts/review.md", "review it\n")],
            ..DaemonSetup::default()
        },
    );
    // The daemon applied the manifest; a new server makes a change to ask about.
    let grown = format!("{MANIFEST}[mcp.servers.beta]\ncommand = \"sleep\"\nargs = [\"2000\"]\n");
    let mark = d.last_event_id();
    d.write_manifest(&grown);
    d.wait_event(mark, "reconcile.applied");
    // A plan that differs from what runs: a component that cannot start is
    // not applied, so every plan shows it again.
    let broken = format!("{grown}[mcp.servers.gamma]\ncommand = \"/nonexistent/npc-test\"\n");
    let mark = d.last_event_id();
    d.write_manifest(&broken);
    d.wait_event(mark, "reconcile.applied");
    let (code, out) = apply_answering_after(d.root(), || {
        d.write_manifest(&broken.replace("\"2000\"", "\"2001\""));
    });
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(STALE), "{out}");
}

#[test]
fn a_saved_plan_applies_only_what_it_was_computed_from() {
    let dir = repository();
    let run = |args: &[&str]| npc().current_dir(dir.path()).args(args).assert();
    let saved = dir.path().join("plan.json");
    let saved_arg = saved.to_str().unwrap();
    let out = run(&["plan", "--out", saved_arg]).success();
    assert!(stdout_of(&out).contains("npc apply"), "{}", stdout_of(&out));
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&saved).unwrap()).unwrap();
    assert_eq!(doc["format"], "npc-plan");
    assert_eq!(doc["version"], 1);
    // A referenced file changed: refused, nothing recorded.
    std::fs::write(dir.path().join("prompts/review.md"), "approve it\n").unwrap();
    let refused = run(&["apply", saved_arg]).code(1);
    insta::assert_snapshot!("saved_plan_stale", stderr_of(&refused));
    run(&["plan"]).success().stdout(predicates::str::contains(
        "compared with nothing applied yet",
    ));
    // The manifest changed: refused too.
    run(&["plan", "--out", saved_arg]).success();
    std::fs::write(
        dir.path().join("npcagent.toml"),
        MANIFEST.replace("\"1000\"", "\"1001\""),
    )
    .unwrap();
    run(&["apply", saved_arg]).code(1);
    // Nothing changed since: applied, without asking.
    run(&["plan", "--out", saved_arg]).success();
    run(&["apply", saved_arg])
        .success()
        .stdout(predicates::str::contains("Applied without a daemon"));
    // The applied state is part of what it was computed from: applying it
    // again is refused.
    let again = run(&["apply", saved_arg]).code(1);
    assert!(stderr_of(&again).contains(STALE), "{}", stderr_of(&again));
}

#[test]
fn a_saved_plan_of_another_version_or_no_plan_at_all_is_refused() {
    let dir = repository();
    let run = |args: &[&str]| npc().current_dir(dir.path()).args(args).assert();
    let saved = dir.path().join("plan.json");
    let saved_arg = saved.to_str().unwrap();
    run(&["plan", "--out", saved_arg]).success();
    let mut doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&saved).unwrap()).unwrap();
    doc["version"] = 99.into();
    std::fs::write(&saved, doc.to_string()).unwrap();
    let out = run(&["apply", saved_arg]).code(1);
    insta::assert_snapshot!(
        "saved_plan_other_version",
        stderr_of(&out).replace(saved_arg, "PLAN")
    );
    std::fs::write(&saved, "{\"format\": \"something else\"}").unwrap();
    let out = run(&["apply", saved_arg]).code(1);
    insta::assert_snapshot!(
        "saved_plan_not_a_plan",
        stderr_of(&out).replace(saved_arg, "PLAN")
    );
    // Past the bound (`MAX_SAVED_PLAN_BYTES`, 16 MiB): refused.
    let huge = dir.path().join("huge.json");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(16 * 1024 * 1024 + 10)
        .unwrap();
    let out = run(&["apply", huge.to_str().unwrap()]).code(1);
    assert!(
        stderr_of(&out).contains("larger than"),
        "{}",
        stderr_of(&out)
    );
    // A device or a FIFO never blocks it.
    let fifo = dir.path().join("fifo.json");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    for path in [fifo.to_str().unwrap(), "/dev/zero"] {
        let out = run(&["apply", path]).code(1);
        assert!(
            stderr_of(&out).contains("not a regular file"),
            "{}",
            stderr_of(&out)
        );
    }
}

#[test]
fn a_saved_plan_through_the_daemon_is_refused_after_an_edit_and_applied_when_unchanged() {
    let d = Daemon::start_with(
        &format!("{MANIFEST}[mcp.servers.gamma]\ncommand = \"/nonexistent/npc-test\"\n"),
        DaemonSetup {
            files: &[("prompts/review.md", "review it\n")],
            ..DaemonSetup::default()
        },
    );
    let saved = d.root().join("plan.json");
    let saved_arg = saved.to_str().unwrap();
    // `gamma` cannot start, so the plan adds it: unchanged since, the
    // daemon applies it (and it fails again, so the exit is 1).
    let plan = d.npc(&["plan", "--out", saved_arg]).success();
    assert!(
        stdout_of(&plan).contains("mcp_server.gamma"),
        "{}",
        stdout_of(&plan)
    );
    let applied = d.npc_output(&["apply", saved_arg]);
    let out = String::from_utf8_lossy(&applied.stdout);
    let err = String::from_utf8_lossy(&applied.stderr);
    assert!(out.contains("Applied through the daemon"), "{out}{err}");
    assert!(!err.contains(STALE), "{err}");
    // A prompt file edited since: refused.
    d.npc(&["plan", "--out", saved_arg]).success();
    std::fs::write(d.root().join("prompts/review.md"), "approve it\n").unwrap();
    let refused = d.npc(&["apply", saved_arg]).code(1);
    assert!(
        stderr_of(&refused).contains(STALE),
        "{}",
        stderr_of(&refused)
    );
}

/// What npc manages travels with the repository: `npc apply` writes
/// `npcagent.lock` beside the agent files, and a teammate's fresh clone of
/// the commit (no `.npc/`, so no store) plans clean. Without the lock the
/// same clone reports npc's own entry as one npc did not write (what
/// every clone did before); a lock that is not npc's is a note on the
/// plan, never a failure, and a lock naming files outside the repository
/// changes nothing.
#[test]
fn a_teammates_clone_plans_clean_with_the_committed_lock() {
    let origin = tempfile::tempdir().unwrap();
    let root = origin.path();
    std::fs::write(
        root.join("npcagent.toml"),
        "version = 1\n[mcp]\ngateway = true\n[providers.claude]\nkind = \"claude_code\"\n[mcp.servers.alpha]\ncommand = \"sleep\"\nargs = [\"1000\"]\n",
    )
    .unwrap();
    git(root, &["init", "-q", "."]);
    npc()
        .current_dir(root)
        .args(["apply", "--auto-approve"])
        .assert()
        .success();
    let lock: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("npcagent.lock")).unwrap())
            .unwrap();
    assert_eq!(
        lock["files"][".mcp.json"],
        serde_json::json!(["npc"]),
        "{lock}"
    );
    git(root, &["add", "--all"]);
    git(root, &["commit", "-q", "-m", "agent files"]);
    assert!(
        !git(root, &["ls-files"]).contains(".npc/"),
        "npc's state is not committed"
    );
    let clones = tempfile::tempdir().unwrap();
    let clone = |name: &str| {
        let dir = clones.path().join(name);
        git(
            clones.path(),
            &["clone", "-q", &root.to_string_lossy(), name],
        );
        dir
    };
    let plan = |dir: &Path| {
        let out = npc()
            .current_dir(dir)
            .args(["plan", "--detailed-exitcode"])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let teammate = clone("teammate");
    // Its components are new to it (nothing was applied there), its agent
    // files are not: no conflict, no file to change.
    let (code, out) = plan(&teammate);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        !out.contains("--force-agent-files") && !out.contains(".mcp.json"),
        "a fresh clone plans its agent files clean: {out}"
    );
    npc()
        .current_dir(&teammate)
        .args(["apply", "--auto-approve"])
        .assert()
        .success();
    let (code, out) = plan(&teammate);
    assert_eq!(code, Some(0), "{out}");
    // The same clone without the lock: npc's entry looks like the user's.
    let bare = clone("bare");
    std::fs::remove_file(bare.join("npcagent.lock")).unwrap();
    let (code, out) = plan(&bare);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains(".mcp.json: `npc`") && out.contains("--force-agent-files"),
        "{out}"
    );
    // A lock that is not npc's: a note, and the plan goes on.
    std::fs::write(bare.join("npcagent.lock"), "{\"version\": 1, \"files\": 7}").unwrap();
    let (code, out) = plan(&bare);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("is not npc's lock"), "{out}");
    // A lock naming a file outside the repository changes nothing there.
    let outside = clones.path().join("outside.json");
    std::fs::write(
        &outside,
        "{\"mcpServers\": {\"npc\": {\"command\": \"mine\"}}}\n",
    )
    .unwrap();
    std::fs::write(
        bare.join("npcagent.lock"),
        "{\"version\": 1, \"files\": {\"../outside.json\": [\"npc\"]}}",
    )
    .unwrap();
    npc()
        .current_dir(&bare)
        .args(["apply", "--auto-approve"])
        .assert()
        .success();
    assert!(std::fs::read_to_string(&outside).unwrap().contains("mine"));
}
