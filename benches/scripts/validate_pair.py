#!/usr/bin/env python3
"""`npc validate` of two builds on the same documents, interleaved run by run.

For when `cargo bench --bench validate` with `NPC_BASELINE_BIN` cannot compare two commits: the
bench validates its own commit's `examples/full.toml`, which the other build may refuse (9edb9e3
does not know `[notify]`; main refuses 9edb9e3's `/review` prompt). Give it a directory holding
documents both builds accept (e.g. main's `examples/` with the `[notify.*]` tables removed, and a
generated `gen5000.toml` of 5,000 `[mcp.servers.sN]`), then OLD and NEW `npc` binaries:

    benches/scripts/validate_pair.py DIR OLD_NPC NEW_NPC [RUNS] [DOC ...]

Per document: 3 warm-up runs of each, then RUNS (default 60) pairs, the order swapped every pair;
prints the median wall time, CPU time (user + system, from `wait4`) and minor page faults of each
build and new/old. CPU time and faults move far less with the machine's load than wall time.
"""
import os, statistics, subprocess, sys, time

DOCS = ["full.toml", "full.json", "minimal.toml", "gen5000.toml"]


def one(npc, doc):
    start = time.perf_counter()
    p = subprocess.Popen([npc, "validate", doc], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        sys.exit(f"{npc} validate {doc} failed: both builds must accept every document")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_minflt


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    os.chdir(sys.argv[1])
    builds = {"old": sys.argv[2], "new": sys.argv[3]}
    runs = int(sys.argv[4]) if len(sys.argv) > 4 else 60
    docs = sys.argv[5:] or DOCS
    print("load average", open("/proc/loadavg").read().split()[0])
    for doc in docs:
        for _ in range(3):
            for npc in builds.values():
                one(npc, doc)
        got = {"old": [], "new": []}
        for i in range(runs):
            for side in (("old", "new") if i % 2 == 0 else ("new", "old")):
                got[side].append(one(builds[side], doc))
        med = lambda side, j: statistics.median(x[j] for x in got[side])
        w0, w1 = med("old", 0) * 1e3, med("new", 0) * 1e3
        c0, c1 = med("old", 1) * 1e3, med("new", 1) * 1e3
        print(f"{doc:14} wall old {w0:7.2f} new {w1:7.2f} ms ratio {w1 / w0:.3f} | "
              f"cpu old {c0:6.2f} new {c1:6.2f} ms ratio {c1 / c0:.3f} | "
              f"faults {med('old', 2):.0f} {med('new', 2):.0f}")
    print("load average", open("/proc/loadavg").read().split()[0])


if __name__ == "__main__":
    main()
