//! Unit tests of the guarded file layer on real files, links and FIFOs.

use std::os::unix::fs::{PermissionsExt as _, symlink};
use std::path::Path;

use super::*;

fn setup() -> (tempfile::TempDir, tempfile::TempDir, Root) {
    let repo = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "SECRET").unwrap();
    let root = Root::new(repo.path()).unwrap();
    (repo, outside, root)
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o777
}

#[test]
fn reads_a_file_and_links_that_stay_inside() {
    let (repo, _o, root) = setup();
    std::fs::create_dir(repo.path().join("real")).unwrap();
    std::fs::write(repo.path().join("real/a.md"), "hello").unwrap();
    symlink("real/a.md", repo.path().join("rel")).unwrap();
    symlink(repo.path().join("real"), repo.path().join("absdir")).unwrap();
    symlink("../real/a.md", repo.path().join("real/up")).unwrap();
    assert_eq!(
        root.read_string(Path::new("real/a.md"), 100).unwrap(),
        "hello"
    );
    assert_eq!(root.read_string(Path::new("rel"), 100).unwrap(), "hello");
    assert_eq!(
        root.read_string(Path::new("absdir/a.md"), 100).unwrap(),
        "hello"
    );
    assert_eq!(
        root.read_string(Path::new("real/up"), 100).unwrap(),
        "hello"
    );
    assert_eq!(
        root.read_string(&repo.path().join("rel"), 100).unwrap(),
        "hello"
    );
    assert_eq!(
        root.real_path(Path::new("rel")).unwrap(),
        root.path().join("real/a.md")
    );
}

#[test]
fn a_link_leaving_the_root_is_refused_naming_link_and_target() {
    let (repo, outside, root) = setup();
    let secret = outside.path().join("secret");
    symlink(&secret, repo.path().join("prompt.md")).unwrap();
    symlink(outside.path(), repo.path().join("dir")).unwrap();
    symlink(
        "../../../../../../../../../../etc/passwd",
        repo.path().join("climb"),
    )
    .unwrap();
    for (path, link) in [
        ("prompt.md", "prompt.md"),
        ("dir/secret", "dir"),
        ("climb", "climb"),
    ] {
        let err = root.read(Path::new(path), 100).unwrap_err();
        assert!(
            matches!(&err.reason, Reason::Escapes { link: l, .. } if l == Path::new(link)),
            "{path}: {err}"
        );
        let text = err.to_string();
        assert!(
            text.contains(&format!("`{link}` is a symbolic link to")),
            "{text}"
        );
    }
    let err = root.read(Path::new("prompt.md"), 100).unwrap_err();
    assert!(
        err.to_string().contains(&secret.display().to_string()),
        "{err}"
    );
    let err = root.read(Path::new("../x"), 100).unwrap_err();
    assert!(matches!(err.reason, Reason::Outside { .. }), "{err}");
    let err = root.read(&outside.path().join("secret"), 100).unwrap_err();
    assert!(matches!(err.reason, Reason::Outside { .. }), "{err}");
}

#[test]
fn link_loops_end_with_an_error() {
    let (repo, _o, root) = setup();
    symlink("b", repo.path().join("a")).unwrap();
    symlink("a", repo.path().join("b")).unwrap();
    let err = root.read(Path::new("a"), 100).unwrap_err();
    assert!(matches!(err.reason, Reason::TooManyLinks), "{err}");
}

#[test]
fn only_regular_files_are_read_and_a_fifo_never_blocks() {
    let (repo, _o, root) = setup();
    nix::unistd::mkfifo(&repo.path().join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
    let err = root.read(Path::new("fifo"), 100).unwrap_err();
    assert!(
        matches!(err.reason, Reason::NotRegular { what: "a FIFO" }),
        "{err}"
    );
    let err = root.read(Path::new(""), 100).unwrap_err();
    assert!(
        matches!(
            err.reason,
            Reason::NotRegular {
                what: "a directory"
            }
        ),
        "{err}"
    );
    let err = read_file(Path::new("/dev/zero"), 100).unwrap_err();
    assert!(
        matches!(
            err.reason,
            Reason::NotRegular {
                what: "a character device"
            }
        ),
        "{err}"
    );
    let err = read_file(&repo.path().join("fifo"), 100).unwrap_err();
    assert!(matches!(err.reason, Reason::NotRegular { .. }), "{err}");
}

#[test]
fn the_size_cap_holds_while_reading() {
    let (repo, _o, root) = setup();
    std::fs::write(repo.path().join("big"), vec![b'x'; 101]).unwrap();
    std::fs::write(repo.path().join("fits"), vec![b'x'; 100]).unwrap();
    let err = root.read(Path::new("big"), 100).unwrap_err();
    assert!(
        matches!(err.reason, Reason::TooLarge { limit: 100 }),
        "{err}"
    );
    assert_eq!(root.read(Path::new("fits"), 100).unwrap().len(), 100);
}

#[test]
fn writing_through_an_inside_link_keeps_the_link() {
    let (repo, _o, root) = setup();
    std::fs::create_dir(repo.path().join("conf")).unwrap();
    std::fs::write(repo.path().join("conf/mcp.json"), "{}").unwrap();
    std::fs::set_permissions(
        repo.path().join("conf/mcp.json"),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    symlink("conf/mcp.json", repo.path().join(".mcp.json")).unwrap();
    let real = root
        .write(Path::new(".mcp.json"), b"new", WriteOptions::SHARED)
        .unwrap();
    assert_eq!(real, root.path().join("conf/mcp.json"));
    assert!(
        std::fs::symlink_metadata(repo.path().join(".mcp.json"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        std::fs::read_to_string(repo.path().join("conf/mcp.json")).unwrap(),
        "new"
    );
    assert_eq!(mode(&repo.path().join("conf/mcp.json")), 0o640);
}

#[test]
fn writes_never_reach_outside() {
    let (repo, outside, root) = setup();
    symlink(outside.path().join("secret"), repo.path().join(".mcp.json")).unwrap();
    symlink(outside.path(), repo.path().join(".codex")).unwrap();
    let err = root
        .write(Path::new(".mcp.json"), b"x", WriteOptions::SHARED)
        .unwrap_err();
    assert!(matches!(err.reason, Reason::Escapes { .. }), "{err}");
    let err = root
        .write(Path::new(".codex/config.toml"), b"x", WriteOptions::SHARED)
        .unwrap_err();
    assert!(matches!(err.reason, Reason::Escapes { .. }), "{err}");
    assert_eq!(
        std::fs::read_to_string(outside.path().join("secret")).unwrap(),
        "SECRET"
    );
    assert!(!outside.path().join("config.toml").exists());
}

#[test]
fn own_files_are_never_links_and_never_hard_linked() {
    let (repo, outside, root) = setup();
    std::fs::create_dir(repo.path().join(".npc")).unwrap();
    symlink(
        outside.path().join("secret"),
        repo.path().join(".npc/daemon.lock"),
    )
    .unwrap();
    symlink("daemon.lock", repo.path().join(".npc/p.md")).unwrap();
    let err = root
        .open_private(Path::new(".npc/daemon.lock"))
        .unwrap_err();
    assert!(matches!(err.reason, Reason::Link { .. }), "{err}");
    assert!(err.to_string().contains("secret"), "{err}");
    let err = root
        .write(Path::new(".npc/p.md"), b"x", WriteOptions::PRIVATE)
        .unwrap_err();
    assert!(matches!(err.reason, Reason::Link { .. }), "{err}");
    std::fs::hard_link(
        outside.path().join("secret"),
        repo.path().join(".npc/x.log"),
    )
    .unwrap_or_else(|_| std::fs::write(repo.path().join(".npc/x.log"), "").unwrap());
    if std::fs::metadata(repo.path().join(".npc/x.log"))
        .unwrap()
        .len()
        > 0
    {
        let err = root
            .open_append(Path::new(".npc/x.log"), 1 << 20)
            .unwrap_err();
        assert!(
            matches!(err.reason, Reason::HardLinked { links: 2 }),
            "{err}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(outside.path().join("secret")).unwrap(),
        "SECRET"
    );
}

#[test]
fn own_files_are_private_and_looser_ones_are_tightened() {
    let (repo, _o, root) = setup();
    let lock = repo.path().join(".npc/daemon.lock");
    drop(root.open_private(&lock).unwrap());
    assert_eq!(mode(&lock), 0o600);
    assert_eq!(mode(&repo.path().join(".npc")), 0o700);
    std::fs::set_permissions(&lock, std::fs::Permissions::from_mode(0o644)).unwrap();
    drop(root.open_private(&lock).unwrap());
    assert_eq!(mode(&lock), 0o600);
    root.write(Path::new(".npc/profiles/a.md"), b"x", WriteOptions::PRIVATE)
        .unwrap();
    assert_eq!(mode(&repo.path().join(".npc/profiles/a.md")), 0o600);
    assert_eq!(mode(&repo.path().join(".npc/profiles")), 0o700);
}

#[test]
fn the_state_dir_is_private_ignored_and_swept() {
    let (repo, _o, root) = setup();
    let state = repo.path().join(".npc");
    root.ensure_state_dir(Path::new(".npc")).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    // A temp file of a process that is gone, one of ours, and a user file.
    let dead = ".p.md.npc-999999999-0.tmp";
    let ours = format!(".p.md.npc-{}-0.tmp", std::process::id());
    for name in [dead, ours.as_str(), "keep.npc-1-0.txt"] {
        std::fs::write(state.join(name), "x").unwrap();
    }
    root.ensure_state_dir(Path::new(".npc")).unwrap();
    assert_eq!(mode(&state), 0o700);
    assert_eq!(
        std::fs::read_to_string(state.join(".gitignore")).unwrap(),
        "*\n"
    );
    assert!(!state.join(dead).exists());
    assert!(state.join(&ours).exists());
    assert!(state.join("keep.npc-1-0.txt").exists());
    let err = root.ensure_state_dir(Path::new(".")).unwrap_err();
    assert!(matches!(err.reason, Reason::StateDirIsRoot), "{err}");
}

/// The entries of `dir` holding [`UNTRUSTED_MARK`] in their names.
fn moved_aside(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().contains(UNTRUSTED_MARK))
        .collect()
}

#[test]
fn a_state_dir_npc_did_not_make_is_moved_aside_and_one_made() {
    let (repo, outside, root) = setup();
    let state = repo.path().join(".npc");
    // What a clone brings: a directory with files, even a forged owner file.
    std::fs::create_dir(&state).unwrap();
    std::fs::write(state.join("api.token"), "shipped").unwrap();
    std::fs::write(state.join(OWNER_FILE), "npc state v1 00\n").unwrap();
    let (_, claim) = root.claim_state_dir(Path::new(".npc")).unwrap();
    assert!(matches!(claim, Claim::Replaced { .. }), "{claim:?}");
    let aside = moved_aside(repo.path());
    assert_eq!(aside.len(), 1);
    assert_eq!(
        std::fs::read_to_string(aside[0].join("api.token")).unwrap(),
        "shipped"
    );
    assert!(!state.join("api.token").exists());
    assert!(state.join(OWNER_FILE).exists());
    // Made here, it proves itself from now on.
    let (_, again) = root.claim_state_dir(Path::new(".npc")).unwrap();
    assert_eq!(again, Claim::Proven);
    root.existing_state_dir(Path::new(".npc")).unwrap();
    // A link (even one inside) and a plain file are not npc's either.
    std::fs::remove_dir_all(&state).unwrap();
    symlink(outside.path(), &state).unwrap();
    let (_, claim) = root.claim_state_dir(Path::new(".npc")).unwrap();
    assert!(matches!(claim, Claim::Replaced { .. }), "{claim:?}");
    assert!(std::fs::symlink_metadata(&state).unwrap().is_dir());
    std::fs::remove_dir_all(&state).unwrap();
    std::fs::write(&state, "a file").unwrap();
    let err = root.existing_state_dir(Path::new(".npc")).unwrap_err();
    assert!(err.is_not_found(), "a reader finds none: {err}");
    assert!(!state.exists(), "and no later reader adopts it");
    assert_eq!(moved_aside(repo.path()).len(), 3);
    // Nothing was ever written outside.
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
}

#[test]
fn a_missing_state_dir_is_made_with_its_owner_file_and_read_as_none() {
    let (repo, _o, root) = setup();
    let err = root.existing_state_dir(Path::new(".npc")).unwrap_err();
    assert!(err.is_not_found(), "{err}");
    assert!(!repo.path().join(".npc").exists(), "a reader makes nothing");
    let (real, claim) = root.claim_state_dir(Path::new("state/npc")).unwrap();
    assert_eq!(claim, Claim::Created);
    assert_eq!(mode(&real), 0o700);
    assert_eq!(mode(&real.join(OWNER_FILE)), 0o600);
}

#[test]
fn own_files_are_private_single_linked_files_of_this_user() {
    let (repo, _o, root) = setup();
    let path = repo.path().join("own");
    std::fs::write(&path, "x").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(root.read_own(&path, 10).unwrap_err().is_not_own());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(root.read_own(&path, 10).unwrap(), b"x");
    std::fs::hard_link(&path, repo.path().join("second")).unwrap();
    assert!(root.read_own(&path, 10).unwrap_err().is_not_own());
}

#[test]
fn temp_names_round_trip() {
    let name = temp_name(OsStr::new(".mcp.json"));
    assert_eq!(temp_pid(name.as_bytes()), Some(std::process::id() as i32));
    assert_eq!(temp_pid(b".a.npc-12-x.tmp"), None);
    assert_eq!(temp_pid(b"a.tmp"), None);
}

#[test]
fn a_socket_path_is_prepared_without_following_links() {
    let (repo, outside, root) = setup();
    std::fs::create_dir(repo.path().join(".npc")).unwrap();
    let sock = repo.path().join(".npc/control.sock");
    symlink(outside.path().join("secret"), &sock).unwrap();
    let err = root.prepare_socket(&sock).unwrap_err();
    assert!(matches!(err.reason, Reason::Link { .. }), "{err}");
    std::fs::remove_file(&sock).unwrap();
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    drop(listener);
    root.socket_check(&sock).unwrap();
    let link = repo.path().join(".npc/link.sock");
    symlink(&sock, &link).unwrap();
    assert!(matches!(
        root.socket_check(&link).unwrap_err().reason,
        Reason::NotSocket
    ));
    // A socket a dead daemon left is removed; a file is not a socket.
    assert_eq!(
        root.prepare_socket(&sock).unwrap(),
        root.path().join(".npc/control.sock")
    );
    assert!(!sock.exists());
    std::fs::write(&sock, "x").unwrap();
    assert!(matches!(
        root.prepare_socket(&sock).unwrap_err().reason,
        Reason::NotSocket
    ));
    root.remove_socket(&sock).unwrap();
    assert!(sock.exists(), "remove_socket removes only sockets");
}
