#!/usr/bin/env python3
"""Every bench of two builds, run alternately, each measure old / new / ratio.

The same-run comparison the issues ask for ("no benchmark gets slower by more
than 5% against the commit before"): two release builds of npc, each in its
own worktree with its own `target/`, and each bench's binary of the one run
right after (or before) the other's, round after round, so both see the same
load. Every number a bench prints is parsed; the median over the rounds of
each build is compared.

Usage:

    # once per worktree (release, the bench profile):
    (cd OLD_WORKTREE && cargo build --release && cargo bench --no-run)
    (cd NEW_WORKTREE && cargo build --release && cargo bench --no-run)
    benches/scripts/compare_commits.py OLD_WORKTREE NEW_WORKTREE \
        [--bench NAME ...] [--skip NAME ...] [--rounds 3] [--all-numbers] \
        [--env KEY=VALUE ...] [--log-dir DIR] [--json FILE] [--markdown]

OLD and NEW are worktrees (a directory with `Cargo.toml`: the bench
executables are asked of `cargo bench --no-run --message-format=json`, which
only checks that they are up to date) or directories of bench binaries
(`NAME` or `NAME-HASH`, the newest of a name taken): `WORKTREE/target/release/deps`
works without asking cargo, and then only the names of `WORKTREE/benches/*.rs`
count. By default every bench present in both is run; `--bench` narrows,
`--skip` drops. A bench spawns the `npc` its build compiled in
(`CARGO_BIN_EXE_npc`), so each build measures its own `npc`; each runs in
its own worktree.

Order: round r runs OLD then NEW when r is even and NEW then OLD when odd
(A B B A ...), so a load that drifts during a round favours neither build.
The load average (1 min) is read before every run and printed per bench.

Measures: by default npc's side of each bench, picked from its output by
`NPC_SIDE` below (a regular expression per line, named groups per figure):
the times, rates and sizes of npc's own path, not the same-run baselines,
counts or ratios. A bench not listed there, or `--all-numbers`, gets every
number it prints, each named by its line with the numbers replaced by `#`
and the number's position (`[i]`); then a number is "higher is better" when
the text around it names a rate (`/s`, `deliveries`), and baselines, counts
and ratios are included: judge those yourself. `slower` is new/old for a
lower-is-better measure and old/new for a rate: above 1 means the new build
is slower. The median over the rounds is compared; each round's value is in
`--json`. Measures slower than `--threshold` (default 1.05) are flagged `!`.

`--from-logs DIR` compares the logs an earlier run left in `--log-dir`
(NAME.old.R.log / NAME.new.R.log) without running anything, e.g. after
changing `NPC_SIDE`.

To re-run one suspect bench alone: `--bench NAME --rounds 5`. Benches that
take a baseline binary themselves (`NPC_BASELINE_BIN` for `validate` and
`mcp_gateway`) interleave call by call, finer than whole runs: run the new
build's bench directly for them, e.g. `NPC_BASELINE_BIN=OLD/target/release/npc
NEW/target/release/deps/mcp_gateway-HASH --bench`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

# Longest one bench run may take before it is killed (the daemon bench idles
# for a minute, fleet takes a few).
RUN_TIMEOUT_SECS = 1800

# A number as benches print them: 1,234.5 / -0.3 / 1e-3 / 42.
NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?")
# Text right after a number that makes it a rate (higher is better).
RATE = re.compile(r"^\s*(?:\w*/s\b|req/s|MB/s|MiB/s|events/s|calls/s|deliveries)")
# Text just before a number that makes it a rate (e.g. "calls/s 1 caller direct 4000").
RATE_BEFORE = re.compile(r"(?:calls/s|req/s|events/s)[^|]*$")

# npc's side of each bench: (regular expression on a line, {group: (measure,
# higher_is_better)}). A `key` group names the row (a document, a case, a
# transport); the last line starting with `-- ` or `== ` is the context.
# Baselines, counts and ratios are left out: the old:new ratio of npc's own
# figures is what the comparison is for. A bench not listed here (or
# `--all-numbers`) gets every number of its output, named by its line.
LOWER, HIGHER = False, True
NPC_SIDE: dict[str, list[tuple[str, dict[str, tuple[str, bool]]]]] = {
    "validate": [
        (r"npc validate \(toml\)\s+(?P<a>[\d.]+) ms", {"a": ("npc validate (toml), ms", LOWER)}),
        (r"npc validate \(json\)\s+(?P<a>[\d.]+) ms", {"a": ("npc validate (json), ms", LOWER)}),
        (r"^\s*(?P<key>\d+) components\s+(?P<a>[\d.]+) ms",
         {"a": ("components, load + validate in process, ms", LOWER)}),
    ],
    "validate_memory": [
        (r"examples/minimal.toml peaks at (?P<a>[\d.]+) MiB", {"a": ("minimal.toml peak RSS, MiB", LOWER)}),
        (r"^\| (?P<key>[^|]+?) \| [\d.]+ MiB \| -?\d+ \| (?P<a>[\d.]+) MiB", {"a": ("peak RSS, MiB", LOWER)}),
    ],
    "plan": [
        (r"(?P<key>\d+) components\s+plan\s+(?P<a>[\d.]+) ms", {"a": ("components, plan, ms", LOWER)}),
    ],
    "daemon": [
        (r"latency minus debounce\s+(?P<a>\d+) ms median", {"a": ("edit → applied minus debounce, p50 ms", LOWER)}),
        (r"in-process load\+plan\s+(?P<a>[\d.]+) ms", {"a": ("in-process load + plan, ms", LOWER)}),
        (r"CPU time\s+(?P<a>[\d.]+) s", {"a": ("idle CPU time, s", LOWER)}),
        (r"resident memory\s+(?P<a>[\d.]+) MiB", {"a": ("idle resident memory, MiB", LOWER)}),
    ],
    "bus": [
        (r"^(?P<key>bus[^:]*?)\s*:\s+(?P<a>\d+) events/s", {"a": ("events/s", HIGHER)}),
    ],
    "supervisor": [
        (r"^(?P<key>[^:]+): baseline [\d.]+ \S+, supervisor (?P<a>[\d.]+) \S+,", {"a": ("supervisor, µs", LOWER)}),
    ],
    "parsers": [
        (r"^(?P<key>\w+)\s+(?P<a>[\d.]+)\s+[\d.]+\s+[\d.]+\s+\d+$", {"a": ("parser MB/s", HIGHER)}),
    ],
    "render": [
        (r"npc render::profile\s+(?P<a>[\d.]+) us", {"a": ("render::profile, µs/profile", LOWER)}),
        (r"RenderContext::new\s+(?P<a>[\d.]+) us", {"a": ("RenderContext::new, µs/run", LOWER)}),
    ],
    "native": [
        (r"^(?P<key>.+?)\s+\d+ KiB .*plan_text\s+(?P<a>[\d.]+(?:ns|µs|us|ms|s))",
         {"a": ("plan_text, ms", LOWER)}),
    ],
    "shutdown": [
        (r"1 child (?P<a>[\d.]+) s, \d+ children (?P<b>[\d.]+) s",
         {"a": ("SIGTERM → exit, 1 stubborn child, s", LOWER),
          "b": ("SIGTERM → exit, 10 stubborn children, s", LOWER)}),
    ],
    "mcp_gateway": [
        (r"^(?P<key>\w+): direct p50 [\d.]+ ms p99 [\d.]+ ms \| gateway p50 (?P<a>[\d.]+) ms "
         r"p99 (?P<b>[\d.]+) ms \| added p50 (?P<c>-?[\d.]+) ms p99 (?P<d>-?[\d.]+) ms",
         {"a": ("gateway p50, ms", LOWER), "b": ("gateway p99, ms", LOWER),
          "c": ("added p50, ms", LOWER), "d": ("added p99, ms", LOWER)}),
        (r"^(?P<key>\w+): calls/s 1 caller direct \d+ gateway (?P<a>\d+) .*callers direct \d+ gateway (?P<b>\d+)",
         {"a": ("gateway calls/s, 1 caller", HIGHER), "b": ("gateway calls/s, 16 callers", HIGHER)}),
        (r"to initialize\) (?P<a>\d+) ms \| with \d+ servers (?P<b>\d+) ms",
         {"a": ("start-up, 1 server, ms", LOWER), "b": ("start-up, 20 servers, ms", LOWER)}),
    ],
    "panes": [
        (r"to a plugin via npc\s+(?P<a>[\d.]+) MiB/s", {"a": ("PTY → plugin, MiB/s", HIGHER)}),
        (r"pane_output \(plugin\) p50 (?P<a>[\d.]+) ms\s+p99 (?P<b>[\d.]+) ms",
         {"a": ("output → plugin p50, ms", LOWER), "b": ("output → plugin p99, ms", LOWER)}),
    ],
    "triggers": [
        (r"signed, accepted[^:]*:\s+(?P<a>\d+) req/s", {"a": ("webhook signed, 202 committed, req/s", HIGHER)}),
        (r"bad signature \(401\):\s+(?P<a>\d+) req/s", {"a": ("webhook bad signature 401, req/s", HIGHER)}),
        (r"next-fire for all: (?P<a>[\d.]+) ms per tick", {"a": ("cron next-fire, 10,000 triggers, ms/tick", LOWER)}),
        (r"run\.queued committed, minus the debounce: p50 (?P<a>\d+) ms, max (?P<b>\d+) ms",
         {"a": ("file_watch → run.queued p50, ms", LOWER), "b": ("file_watch → run.queued max, ms", LOWER)}),
    ],
    "hooks": [
        (r"^(?P<key>[^:]+): bare .*with npc p50 (?P<a>[\d.]+) ms p99 (?P<b>[\d.]+) ms; added p50 (?P<c>-?[\d.]+) ms",
         {"a": ("with npc p50, ms", LOWER), "b": ("with npc p99, ms", LOWER), "c": ("added p50, ms", LOWER)}),
    ],
    "acp": [
        (r"run (?P<key>.+?) \(\d+ prompts.*first session/update p50 (?P<a>[\d.]+) ms p99 (?P<b>[\d.]+) ms; "
         r"npc adds p50 (?P<c>-?[\d.]+) ms",
         {"a": ("first update p50, ms", LOWER), "b": ("first update p99, ms", LOWER),
          "c": ("npc adds p50, ms", LOWER)}),
    ],
    "api": [
        (r"GET /api/v1/status (?P<a>\d+) req/s", {"a": ("daemon GET /api/v1/status, req/s", HIGHER)}),
        (r"^sse: .*?: (?P<a>\d+) deliveries/s", {"a": ("SSE deliveries/s, 100 streams", HIGHER)}),
    ],
    "fleet": [
        (r"^\| (?P<key>\d+) \| (?P<a>\d+) \| \d+ \| .*? \| (?P<b>\d+) \| .*?\| (?P<c>\d+) \+ (?P<d>\d+) \| "
         r"\d+ \+ \d+ \| (?P<e>[\d.]+) ms \| (?P<f>[\d.]+) ms \|",
         {"a": ("workers, npc claims/s", HIGHER), "b": ("workers, npc claims/s, claim after the end", HIGHER),
          "c": ("workers, CPU µs/claim, claimers", LOWER), "d": ("workers, CPU µs/claim, server", LOWER),
          "e": ("workers, enqueue → start p50, ms", LOWER), "f": ("workers, enqueue → start p99, ms", LOWER)}),
        (r"^\| (?P<key>PostgreSQL[^|]*?|SQLite[^|]*?) \| (?P<a>[\d.]+) ms \| (?P<b>[\d.]+) ms \|",
         {"a": ("ingress 202 p50, ms", LOWER), "b": ("ingress 202 p99, ms", LOWER)}),
    ],
}

# Units a Duration's `{:?}` prints, in ms.
UNITS_MS = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1e3}


def value_of(text: str) -> float:
    m = re.fullmatch(r"(-?[\d.,]+)(ns|µs|us|ms|s)?", text)
    if m is None:
        raise ValueError(text)
    return float(m.group(1).replace(",", "")) * (UNITS_MS[m.group(2)] if m.group(2) else 1.0)


def npc_measures(name: str, output: str) -> dict[str, tuple[float, bool]]:
    """npc's side of one bench's output: measure -> (value, higher_is_better)."""
    specs = [(re.compile(rx), groups) for rx, groups in NPC_SIDE[name]]
    out: dict[str, tuple[float, bool]] = {}
    context = ""
    for line in output.splitlines():
        if line.startswith("-- ") or line.startswith("== "):
            context = re.sub(r"\s*\(.*?\)", "", line[3:].strip(" ="))
            continue
        for rx, groups in specs:
            m = rx.search(line)
            if not m:
                continue
            key = (m.groupdict().get("key") or "").strip()
            for group, (label, higher) in groups.items():
                measure = " ".join(x for x in (context if name == "validate" else "", key, label) if x)
                n, base = 2, measure
                while measure in out:
                    measure, n = f"{base} ({n})", n + 1
                out[measure] = (value_of(m.group(group)), higher)
    return out


def load1() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def bench_binaries(where: Path) -> dict[str, Path]:
    """The bench executables of a worktree or of a directory of binaries."""
    if (where / "Cargo.toml").is_file():
        out = subprocess.run(
            ["cargo", "bench", "--no-run", "--message-format=json"],
            cwd=where, capture_output=True, text=True, check=True,
        ).stdout
        found: dict[str, Path] = {}
        for line in out.splitlines():
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                continue
            target = msg.get("target") or {}
            if msg.get("executable") and "bench" in target.get("kind", []):
                found[target["name"]] = Path(msg["executable"])
        return found
    newest: dict[str, tuple[float, Path]] = {}
    benches = worktree_of(where) / "benches"
    names = {f.stem for f in benches.glob("*.rs")} if benches.is_dir() else None
    for f in where.iterdir():
        if not f.is_file() or not os.access(f, os.X_OK) or f.suffix:
            continue
        name = re.sub(r"-[0-9a-f]{16}$", "", f.name)
        if names is not None and name not in names:
            continue
        t = f.stat().st_mtime
        if name not in newest or t > newest[name][0]:
            newest[name] = (t, f)
    return {n: p for n, (_, p) in newest.items()}


def measures(output: str) -> dict[str, tuple[float, bool]]:
    """Each number of the output: name -> (value, higher_is_better)."""
    out: dict[str, tuple[float, bool]] = {}
    seen: dict[str, int] = {}
    for line in output.splitlines():
        nums = list(NUMBER.finditer(line))
        if not nums:
            continue
        masked = NUMBER.sub("#", line).rstrip()
        seen[masked] = seen.get(masked, 0) + 1
        tag = masked if seen[masked] == 1 else f"{masked} (#{seen[masked]})"
        for i, m in enumerate(nums):
            value = float(m.group().replace(",", ""))
            after = line[m.end():]
            before = line[: m.start()]
            rate = bool(RATE.match(after)) or bool(RATE_BEFORE.search(before))
            if "ratio" in before[-12:]:
                rate = False
            out[f"{tag}[{i}]"] = (value, rate)
    return out


def run_one(exe: Path, cwd: Path, env: dict[str, str], log: Path | None) -> str:
    t = time.monotonic()
    proc = subprocess.run(
        [str(exe), "--bench"], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=RUN_TIMEOUT_SECS,
    )
    text = proc.stdout
    if log is not None:
        log.write_text(text + "\n--- stderr\n" + proc.stderr)
    if proc.returncode != 0:
        print(f"  {exe.name} exited {proc.returncode}; stderr tail:\n"
              + "\n".join(proc.stderr.splitlines()[-10:]), file=sys.stderr)
    print(f"  {exe.name}: {time.monotonic() - t:.1f} s", file=sys.stderr)
    return text


def worktree_of(where: Path) -> Path:
    """The worktree of `where`: itself, or the one whose `target/*/deps` it is."""
    where = where.resolve()
    if (where / "Cargo.toml").is_file():
        return where
    if where.name == "deps" and (where.parents[2] / "Cargo.toml").is_file():
        return where.parents[2]
    return Path.cwd()


def root_of(where: Path) -> Path:
    return worktree_of(where)


def compare(name: str, runs: dict[str, list[str]], npc_side: bool, threshold: float):
    parse = (lambda o: npc_measures(name, o)) if npc_side and name in NPC_SIDE else measures
    parsed = {side: [parse(o) for o in outs] for side, outs in runs.items()}
    keys = [k for k in parsed["old"][0] if all(k in p for s in parsed.values() for p in s)]
    rows = []
    for k in keys:
        old = statistics.median(p[k][0] for p in parsed["old"])
        new = statistics.median(p[k][0] for p in parsed["new"])
        rate = parsed["old"][0][k][1]
        if old == 0 or new == 0:
            slower = float("nan")
        else:
            slower = old / new if rate else new / old
        rows.append({
            "measure": k, "old": old, "new": new, "slower": slower,
            "higher_is_better": rate,
            "old_all": [p[k][0] for p in parsed["old"]],
            "new_all": [p[k][0] for p in parsed["new"]],
            "flag": slower == slower and slower > threshold,
        })
    return rows


def print_rows(name: str, rounds: int, loads: list[float], rows: list[dict], markdown: bool):
    load = f"load average (1 min) {min(loads):.1f}–{max(loads):.1f}" if loads else "load not recorded"
    if markdown:
        print(f"\n### {name} ({rounds} rounds, {load})\n")
        print("| measure | old | new | slower (>1: new slower) |")
        print("|---|---:|---:|---:|")
        for row in rows:
            flag = " !" if row["flag"] else ""
            print(f"| {row['measure'].strip()} | {row['old']:g} | {row['new']:g} "
                  f"| {row['slower']:.3f}{flag} |")
    else:
        print(f"\n== {name} ({rounds} rounds, {load})")
        for row in rows:
            flag = "!" if row["flag"] else " "
            print(f"{flag} {row['slower']:7.3f}  old {row['old']:>12g}  new {row['new']:>12g}"
                  f"  {row['measure'].strip()}")
    sys.stdout.flush()


def from_logs(args) -> int:
    by_bench: dict[str, dict[str, list[str]]] = {}
    for log in sorted(args.from_logs.glob("*.log")):
        m = re.fullmatch(r"(.+)\.(old|new)\.(\d+)\.log", log.name)
        if m is None:
            continue
        text = log.read_text().split("\n--- stderr\n")[0]
        by_bench.setdefault(m.group(1), {"old": [], "new": []})[m.group(2)].append(text)
    for name, runs in sorted(by_bench.items()):
        if (args.bench and name not in args.bench) or name in args.skip:
            continue
        if not runs["old"] or not runs["new"]:
            continue
        rows = compare(name, runs, not args.all_numbers, args.threshold)
        print_rows(name, min(len(runs["old"]), len(runs["new"])), [], rows, args.markdown)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", type=Path, nargs="?")
    ap.add_argument("new", type=Path, nargs="?")
    ap.add_argument("--bench", action="append", default=[])
    ap.add_argument("--skip", action="append", default=[])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threshold", type=float, default=1.05)
    ap.add_argument("--all-numbers", action="store_true")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for every run")
    ap.add_argument("--log-dir", type=Path)
    ap.add_argument("--json", type=Path, help="append every bench's rows to this file")
    ap.add_argument("--markdown", action="store_true", help="print markdown tables")
    ap.add_argument("--from-logs", type=Path, help="compare the logs of an earlier --log-dir")
    args = ap.parse_args()
    if args.from_logs:
        return from_logs(args)

    old_bins, new_bins = bench_binaries(args.old), bench_binaries(args.new)
    names = sorted(set(old_bins) & set(new_bins))
    if args.bench:
        names = [n for n in args.bench if n in names]
    names = [n for n in names if n not in args.skip]
    only = sorted((set(old_bins) ^ set(new_bins)) - set(args.skip))
    if only and not args.bench:
        print(f"in one build only (not compared): {', '.join(only)}", file=sys.stderr)
    env = dict(os.environ)
    for kv in args.env:
        k, _, v = kv.partition("=")
        env[k] = v
    if args.log_dir:
        args.log_dir.mkdir(parents=True, exist_ok=True)

    for name in names:
        runs: dict[str, list[str]] = {"old": [], "new": []}
        loads = []
        print(f"== {name}", file=sys.stderr)
        for r in range(args.rounds):
            order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
            for side in order:
                loads.append(load1())
                exe = old_bins[name] if side == "old" else new_bins[name]
                where = args.old if side == "old" else args.new
                log = args.log_dir / f"{name}.{side}.{r}.log" if args.log_dir else None
                runs[side].append(run_one(exe, root_of(where), env, log))
        rows = compare(name, runs, not args.all_numbers, args.threshold)
        print_rows(name, args.rounds, loads, rows, args.markdown)
        if args.json:
            with args.json.open("a") as f:
                f.write(json.dumps({"bench": name, "loads": loads, "rows": rows}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
