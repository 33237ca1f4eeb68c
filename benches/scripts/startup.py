"""Whole-process costs of the commands agents and CI call most, against `npc --version` (the
process start alone) in the same run: `npc validate examples/full.toml` and `npc hook run
before_tool -m examples/full.toml` (a tool call through the native hook bridges). Runs are
interleaved; prints each p50 and its ratio to `--version`. With OTHER=<another npc>, the same
for that build and the ratio between the two (e.g. a build with other release settings).

Usage:

    NPC=target/release/npc [OTHER=…] [RUNS=80] python3 benches/scripts/startup.py
"""
import os, statistics, subprocess, time

RUNS = int(os.environ.get("RUNS", "80"))
BUILDS = {"npc": os.environ.get("NPC", "target/release/npc")}
if os.environ.get("OTHER"):
    BUILDS["other"] = os.environ["OTHER"]
CALL = b'{"tool_call":{"id":"c","name":"shell__run","arguments":{"cmd":"git status"}}}'
CASES = {
    "--version": ["--version"],
    "validate examples/full.toml": ["validate", "examples/full.toml"],
    "hook run before_tool": ["hook", "run", "before_tool", "-m", "examples/full.toml"],
}


def once(args):
    started = time.perf_counter()
    subprocess.run(args, input=CALL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main():
    times = {(b, c): [] for b in BUILDS for c in CASES}
    for _ in range(RUNS):
        for b, path in BUILDS.items():
            for c, args in CASES.items():
                times[(b, c)].append(once([path, *args]))
    p50 = {k: statistics.median(v) * 1000 for k, v in times.items()}
    for b in BUILDS:
        base = p50[(b, "--version")]
        for c in CASES:
            print(f"{b}: {c:30} p50 {p50[(b, c)]:6.2f} ms  ({p50[(b, c)] / base:.2f}x --version)")
    if "other" in BUILDS:
        for c in CASES:
            print(f"other / npc, {c}: {p50[('other', c)] / p50[('npc', c)]:.2f}")


if __name__ == "__main__":
    main()
