#!/usr/bin/env python3
"""The CPU time idle daemons of several `npc` builds take, side by side.

Each `npc` given runs `npc daemon` on its own copy of one manifest's
directory, all at once, so every build sees the same machine load. Once
each answers `npc status`, the CPU time (user + system, from
`/proc/PID/stat`) each takes over the same window is read, and every build
is compared with the first (the baseline): the ratio above 1 means more CPU
while idle. The daemon bench (`cargo bench --bench daemon`) measures one
build alone; this is its same-run comparison between commits.

Usage:

    benches/scripts/idle_pair.py --npc OLD/target/release/npc \\
        --npc target/release/npc [--manifest benches/fixtures/idle.toml] \\
        [--seconds 60] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")
# How long a daemon may take to answer `npc status`.
START_LIMIT_S = 60
# The pause between two `npc status` attempts while a daemon starts.
START_POLL_S = 0.1

IDLE_MANIFEST = """version = 1
[daemon]
listen = "127.0.0.1:0"
webhook_listen = "127.0.0.1:0"
[providers.claude]
kind = "claude_code"
[profiles.dev]
provider = "claude"
description = "idle"
[triggers.yearly]
kind = "cron"
schedule = "0 0 1 1 *"
action = { command = "true" }
[triggers.hook]
kind = "webhook"
route = "hook"
secret_env = "NPC_IDLE_HOOK_SECRET"
action = { command = "true" }
"""


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15 of stat; after the `)` they are
    # the 12th and 13th.
    return int(fields[11]) + int(fields[12])


def start(npc: str, source: Path | None, work: Path) -> subprocess.Popen:
    work.mkdir(parents=True)
    if source is None:
        (work / "npcagent.toml").write_text(IDLE_MANIFEST)
    else:
        shutil.copytree(source.parent, work, dirs_exist_ok=True)
        shutil.rmtree(work / ".npc", ignore_errors=True)
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    env = dict(os.environ, RUST_LOG="warn", NPC_IDLE_HOOK_SECRET="idle")
    return subprocess.Popen(
        [npc, "daemon"], cwd=work, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def wait_up(npc: str, work: Path, daemon: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_LIMIT_S
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            sys.exit(f"{npc}: the daemon exited ({daemon.returncode}) in {work}")
        done = subprocess.run([npc, "status"], cwd=work,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if done.returncode == 0 and (work / ".npc" / "daemon.sock").exists():
            return
        time.sleep(START_POLL_S)
    sys.exit(f"{npc}: no daemon answered within {START_LIMIT_S} s")


def one_round(npcs: list[str], manifest: Path | None, seconds: float) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="npc-idle-") as tmp:
        daemons = []
        try:
            for i, npc in enumerate(npcs):
                work = Path(tmp) / f"build{i}"
                daemons.append((npc, work, start(npc, manifest, work)))
            for npc, work, daemon in daemons:
                wait_up(npc, work, daemon)
            before = [cpu_ticks(d.pid) for _, _, d in daemons]
            time.sleep(seconds)
            after = [cpu_ticks(d.pid) for _, _, d in daemons]
        finally:
            for _, _, daemon in daemons:
                daemon.send_signal(signal.SIGTERM)
            for _, _, daemon in daemons:
                daemon.wait()
    return [(a - b) / HZ for a, b in zip(after, before)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--npc", action="append", required=True,
                    help="an npc binary; the first is the baseline")
    ap.add_argument("--manifest", type=Path,
                    help="a manifest whose directory each daemon gets a copy of "
                         "(default: a small one with a yearly cron and a webhook, valid for old builds too)")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    npcs = [str(Path(n).resolve()) for n in args.npc]
    results = [[] for _ in npcs]
    for r in range(args.rounds):
        # Each round starts the builds in another order.
        order = list(range(len(npcs)))
        if r % 2:
            order.reverse()
        cpu = one_round([npcs[i] for i in order], args.manifest, args.seconds)
        for slot, i in enumerate(order):
            results[i].append(cpu[slot])
        print(f"round {r + 1}: " + ", ".join(
            f"{npcs[i]} {results[i][-1]:.2f} s" for i in range(len(npcs))), flush=True)
    print(f"== idle daemons over {args.seconds:.0f} s, median of {args.rounds} rounds ==")
    medians = [sorted(r)[len(r) // 2] for r in results]
    for npc, median in zip(npcs, medians):
        ratio = median / medians[0] if medians[0] else float("inf")
        print(f"  {npc}: CPU {median:.2f} s  ratio {ratio:.2f}")


if __name__ == "__main__":
    main()
