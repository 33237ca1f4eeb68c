"""A worktree run's cost against the raw git operations it is made of, in the same run
(RESULTS.md, "Worktree runs").

A repository of FILES files (committed) gets a release `npc daemon` with a command trigger
whose runs work in worktrees (`workspace = "worktree"`, one `setup` command, the action writes
one file). Each round fires one run and reads its row: `finished_at_ms - started_at_ms` covers
the worktree, setup, action, result commit and diff stat, and the worktree's removal. The
baseline does the same by hand, each a process as npc spawns them: `git worktree add -b`, the
setup command, the action, `git add --all`, `git commit`, `git worktree remove --force`. Rounds
alternate baseline and npc; prints the medians and their ratio.

Usage:

    NPC=target/release/npc python3 benches/scripts/worktree_runs.py   # ROUNDS=15 FILES=10000

Needs git.
"""
import json, os, shutil, statistics, subprocess, sys, tempfile, time

ROUNDS = int(os.environ.get("ROUNDS", "15"))
FILES = int(os.environ.get("FILES", "10000"))
NPC = os.path.abspath(os.environ.get("NPC", "target/release/npc"))
LIMIT = 120

MANIFEST = """version = 1
[daemon]
listen = "127.0.0.1:0"
webhook_listen = "127.0.0.1:0"

[triggers.edit]
kind = "cron"
schedule = "@yearly"
workspace = "worktree"
setup = ["true"]
action = { command = "sh", args = ["-c", "echo edited > edited.txt"] }
"""

GIT = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.com"]


def git(cwd, *args):
    subprocess.run([*GIT, *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL)


def repository():
    root = tempfile.mkdtemp()
    git(root, "init", "--quiet", "--initial-branch=main")
    # No background `gc --auto` in the middle of a round; packed once below.
    git(root, "config", "gc.auto", "0")
    for i in range(FILES):
        d = os.path.join(root, "src", f"d{i % 100:02}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i}.txt"), "w") as f:
            f.write(f"file {i}\n" * 4)
    with open(os.path.join(root, "npcagent.toml"), "w") as f:
        f.write(MANIFEST)
    git(root, "add", "--all")
    git(root, "commit", "--quiet", "-m", "start")
    git(root, "gc", "--quiet")
    return root


def baseline(root, n):
    """One worktree made, set up, edited, committed and removed by hand; seconds."""
    dir = os.path.join(root, ".npc-bench", f"b{n}")
    started = time.perf_counter()
    git(root, "worktree", "add", "--quiet", "-b", f"bench/{n}", dir, "HEAD")
    subprocess.run(["sh", "-c", "true"], cwd=dir, check=True)
    subprocess.run(["sh", "-c", "echo edited > edited.txt"], cwd=dir, check=True)
    git(dir, "add", "--all")
    git(dir, "commit", "--quiet", "--no-verify", "-m", f"bench {n}")
    git(root, "worktree", "remove", "--force", "--force", dir)
    return time.perf_counter() - started


def npc(root, *args):
    out = subprocess.run([NPC, *args], cwd=root, check=True, capture_output=True, text=True)
    return out.stdout


def npc_run(root):
    """One run fired and waited for; its row's start-to-finish seconds."""
    fired = json.loads(npc(root, "trigger", "fire", "edit", "--format", "json"))
    run_id = fired["run_id"]
    deadline = time.monotonic() + LIMIT
    while time.monotonic() < deadline:
        row = json.loads(npc(root, "runs", "show", run_id, "--format", "json"))["run"]
        if row["state"] not in ("queued", "running"):
            assert row["state"] == "succeeded", row
            assert row["result"]["files"] == 1, row
            return (row["finished_at_ms"] - row["started_at_ms"]) / 1000
        time.sleep(0.02)
    sys.exit(f"run {run_id} did not end within {LIMIT}s")


def main():
    root = repository()
    with open(os.path.join(root, ".git", "info", "exclude"), "a") as f:
        f.write(".npc-bench/\n")
    log = open(os.path.join(root, "daemon.log"), "w")
    daemon = subprocess.Popen([NPC, "daemon"], cwd=root, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + LIMIT
        while "npc daemon: startup" not in open(os.path.join(root, "daemon.log")).read():
            if time.monotonic() > deadline:
                sys.exit("the daemon did not start")
            time.sleep(0.05)
        raw, runs = [], []
        for n in range(ROUNDS):
            raw.append(baseline(root, n))
            runs.append(npc_run(root))
            print(f"round {n + 1}: raw git {raw[-1] * 1000:7.1f} ms, npc worktree run {runs[-1] * 1000:7.1f} ms")
    finally:
        daemon.terminate()
        daemon.wait()
        shutil.rmtree(root, ignore_errors=True)
    r, w = statistics.median(raw), statistics.median(runs)
    print(f"{FILES} files: raw git median {r * 1000:.1f} ms, npc worktree run median {w * 1000:.1f} ms "
          f"(ratio {w / r:.2f})")


if __name__ == "__main__":
    main()
