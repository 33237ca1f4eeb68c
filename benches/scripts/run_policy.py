#!/usr/bin/env python3
"""A run's added latency from its per-run policy (issue 43) against a bare
CLI start: the same one-turn `claude -p` run against the scripted model
(`fixtures/model/scripted.py`, 127.0.0.1), started alternately bare and with
the per-run policy npc adds (`--settings` with allow/ask/deny lists, as
`native::run_policy` renders it), `RUNS` times each. Prints the medians and
their ratio (the target: at most 1.05). The npc side of it (rendering the
policy, one small string) is microseconds; this measures what the CLI pays
to read it.

Usage: ``benches/scripts/run_policy.py [RUNS]`` (Claude Code installed).
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
POLICY = json.dumps(
    {
        "permissions": {
            "allow": ["Bash(ls)", "mcp__npc__everything__echo"],
            "ask": ["Bash(git push:*)"],
            "deny": ["WebFetch"],
        }
    }
)


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    with tempfile.TemporaryDirectory() as home:
        port_file = os.path.join(home, "port")
        model = subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "fixtures/model/scripted.py"),
             "--port-file", port_file, "--record", os.path.join(home, "rec.jsonl"),
             "--tool", "", "--args", "{}"],
            stdout=subprocess.DEVNULL,
        )
        try:
            deadline = time.time() + 30
            while not (os.path.exists(port_file) and open(port_file).read().strip()):
                if time.time() > deadline:
                    raise SystemExit("the scripted model did not start")
                time.sleep(0.05)
            port = open(port_file).read().strip()
            env = {
                "PATH": os.environ["PATH"],
                "HOME": home,
                "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}",
                "ANTHROPIC_API_KEY": "sk-scripted",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            }
            base = ["claude", "-p", "say hi", "--output-format", "stream-json", "--verbose"]
            timings = {"bare": [], "policy": []}
            for i in range(runs * 2 + 2):
                which = "bare" if i % 2 == 0 else "policy"
                args = base if which == "bare" else ["claude", "--settings", POLICY] + base[1:]
                start = time.perf_counter()
                subprocess.run(args, env=env, cwd=home, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, check=True)
                if i >= 2:  # the first pair warms caches
                    timings[which].append(time.perf_counter() - start)
        finally:
            model.kill()
    bare = statistics.median(timings["bare"])
    policy = statistics.median(timings["policy"])
    print(f"claude -p, bare:               median {bare * 1000:.0f} ms over {len(timings['bare'])} runs")
    print(f"claude -p, with the run policy: median {policy * 1000:.0f} ms over {len(timings['policy'])} runs")
    print(f"ratio policy/bare: {policy / bare:.3f} (target <= 1.05)")


if __name__ == "__main__":
    main()
