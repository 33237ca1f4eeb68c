//! The one policy for a peer a test needs from the machine
//! ([`crate::support::require`]): under `CI=true` a missing one fails the
//! test, elsewhere it is skipped with a line saying what to install.

use crate::support::{Peer, require};

/// Set for the child process of
/// [`a_missing_peer_fails_under_ci_and_is_skipped_elsewhere`].
const CHILD_ENV: &str = "NPC_TEST_REQUIRE_CHILD";
/// What the child prints when `require` let it return.
const RETURNED: &str = "require returned false";

/// Not a test: the child of
/// [`a_missing_peer_fails_under_ci_and_is_skipped_elsewhere`].
#[test]
#[ignore = "helper process for a_missing_peer_fails_under_ci_and_is_skipped_elsewhere"]
fn helper_require_a_missing_peer() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    if !require(Peer::program(
        "npc-no-such-peer",
        "apt-get install npc-no-such-peer",
    )) {
        println!("{RETURNED}");
        return;
    }
    panic!("a missing program was found on PATH");
}

#[test]
fn a_missing_peer_fails_under_ci_and_is_skipped_elsewhere() {
    assert!(require(Peer::program("sh", "apt-get install dash")));
    for ci in ["true", "false"] {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "peers::helper_require_a_missing_peer",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, "1")
            .env("CI", ci)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("`npc-no-such-peer`"), "CI={ci}: {text}");
        assert!(
            text.contains("apt-get install npc-no-such-peer"),
            "CI={ci}: {text}"
        );
        if ci == "true" {
            assert!(!out.status.success(), "CI=true: {text}");
            assert!(!text.contains(RETURNED), "CI=true: {text}");
        } else {
            assert!(out.status.success(), "CI={ci}: {text}");
            assert!(text.contains("skipped:"), "CI={ci}: {text}");
            assert!(text.contains(RETURNED), "CI={ci}: {text}");
        }
    }
}
