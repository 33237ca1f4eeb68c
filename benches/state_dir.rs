//! What proving a state directory npc's own costs each time a command
//! opens it (`npc hook run` does, on every agent tool call): the fast path
//! of `Root::ensure_state_dir` (open the directory, `statx`, a SHA-256 of
//! its identity, read `npc.owner`, the `.gitignore` check, the temp sweep)
//! against what it did before the claim, `Root::create_dir_all` of the
//! same directory (owner-only) and the same `.gitignore` read, in the same
//! run, interleaved. Prints µs per call and the ratio, and the added time
//! against a whole `npc hook run` (about 7 ms, benches/RESULTS.md).

use std::path::Path;
use std::time::{Duration, Instant};

use npcagent::repofs::{Links, Perms, Root};

/// Calls per round.
const CALLS: u32 = 2_000;
/// Rounds, alternating the two sides.
const ROUNDS: u32 = 5;

fn main() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let root = Root::new(dir.path()).expect("the root");
    let state = Path::new(".npc");
    root.ensure_state_dir(state).expect("the state directory");
    let ignore = dir.path().join(".npc/.gitignore");
    let (mut before, mut after) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        for _ in 0..CALLS {
            root.create_dir_all(state, Perms::Private).expect("made");
            let text = root.read_existing(&ignore, 3, Links::Refuse).expect("read");
            assert_eq!(text.as_deref(), Some("*\n"));
            root.sweep_temp(&dir.path().join(".npc")).expect("swept");
        }
        before += t.elapsed();
        let t = Instant::now();
        for _ in 0..CALLS {
            root.ensure_state_dir(state).expect("proven");
        }
        after += t.elapsed();
    }
    let n = f64::from(CALLS * ROUNDS);
    let (b, a) = (
        before.as_secs_f64() * 1e6 / n,
        after.as_secs_f64() * 1e6 / n,
    );
    println!(
        "state directory: before the claim {b:.1} µs/call, with the claim {a:.1} µs/call, ratio {:.2}, added {:.1} µs ({:.2}% of a 7 ms `npc hook run`)",
        a / b,
        a - b,
        (a - b) / 70.0
    );
}
