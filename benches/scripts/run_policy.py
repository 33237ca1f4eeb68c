#!/usr/bin/env python3
"""A run's added latency from its per-run policy (issue 43) against a bare
CLI start: the same one-turn headless run of each CLI against the scripted
model (`fixtures/model/scripted.py`, 127.0.0.1), started alternately bare
and with the per-run policy npc adds as `native::run_policy` renders it
(Claude Code `--settings` allow/ask/deny, Gemini CLI `--policy FILE`,
OpenCode `OPENCODE_PERMISSION`), `RUNS` times each. Prints the medians and
their ratio per CLI (the target: at most 1.05). Codex gets no per-run tool
list (its gateway entry's `env` only, a few bytes of `-c`). The npc side
(rendering the policy) is microseconds; this measures what the CLI pays.

Usage: ``benches/scripts/run_policy.py [RUNS] [CLI…]`` (the CLIs installed).
"""

import json
import resource
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


GEMINI_POLICY = """[[rule]]
toolName = "run_shell_command"
decision = "allow"
priority = 900
commandPrefix = "ls"

[[rule]]
toolName = "web_fetch"
decision = "deny"
priority = 900
denyMessage = "npc policy denies `WebFetch` (profile `p` `denied_tools`)"
"""
OPENCODE_PERMISSION = json.dumps({"bash": {"ls": "allow", "git push *": "deny"}, "webfetch": "deny"})


def clis(home, url, work):
    """(name, bare argv, env, argv and env with the run policy) per installed CLI."""
    def write(rel, text):
        path = os.path.join(home, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)

    base_env = {"PATH": os.environ["PATH"], "HOME": home}
    claude_env = dict(base_env, ANTHROPIC_BASE_URL=url, ANTHROPIC_API_KEY="sk-scripted",
                      CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1")
    claude = ["claude", "-p", "say hi", "--output-format", "stream-json", "--verbose"]
    yield "claude", claude, claude_env, ["claude", "--settings", POLICY] + claude[1:], claude_env
    write(".gemini/settings.json", json.dumps({"security": {"auth": {"selectedType": "gemini-api-key"}}}))
    write(".gemini/trustedFolders.json", json.dumps({work: "TRUST_FOLDER"}))
    policy = os.path.join(work, "gemini-policy.toml")
    write(policy, GEMINI_POLICY)
    gemini_env = dict(base_env, GOOGLE_GEMINI_BASE_URL=url, GEMINI_API_KEY="scripted")
    gemini = ["gemini", "-p", "say hi", "-o", "stream-json"]
    yield "gemini", gemini, gemini_env, ["gemini", "--policy", policy] + gemini[1:], gemini_env
    write(".config/opencode/opencode.json", json.dumps({
        "provider": {"scripted": {
            "npm": "@ai-sdk/openai-compatible", "name": "scripted",
            "options": {"baseURL": url + "/v1", "apiKey": "sk-scripted"},
            "models": {"scripted-model": {"name": "scripted-model"}}}},
        "model": "scripted/scripted-model"}))
    opencode = ["opencode", "run", "--format", "json", "say hi"]
    yield "opencode", opencode, base_env, opencode, dict(base_env, OPENCODE_PERMISSION=OPENCODE_PERMISSION)


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    only = sys.argv[2:]
    with tempfile.TemporaryDirectory() as home:
        work = os.path.join(home, "work")
        os.makedirs(work)
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
            url = "http://127.0.0.1:" + open(port_file).read().strip()
            for name, bare, bare_env, with_policy, policy_env in clis(home, url, work):
                if only and name not in only:
                    continue
                timings = {"bare": [], "policy": []}
                cpu = {"bare": [], "policy": []}
                for i in range(runs * 2 + 2):
                    which = "bare" if i % 2 == 0 else "policy"
                    argv, env = (bare, bare_env) if which == "bare" else (with_policy, policy_env)
                    before = resource.getrusage(resource.RUSAGE_CHILDREN)
                    start = time.perf_counter()
                    subprocess.run(argv, env=env, cwd=work, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
                    after = resource.getrusage(resource.RUSAGE_CHILDREN)
                    if i >= 2:  # the first pair warms caches
                        timings[which].append(time.perf_counter() - start)
                        cpu[which].append(after.ru_utime + after.ru_stime
                                          - before.ru_utime - before.ru_stime)
                b = statistics.median(timings["bare"])
                p = statistics.median(timings["policy"])
                cb = statistics.median(cpu["bare"])
                cp = statistics.median(cpu["policy"])
                # CPU time (user + system of the CLI and its children) is
                # what a loaded machine disturbs least.
                print(f"{name}: wall median bare {b * 1000:.0f} ms, with the run policy {p * 1000:.0f} ms, "
                      f"ratio {p / b:.3f}; CPU median bare {cb * 1000:.0f} ms, with the run policy "
                      f"{cp * 1000:.0f} ms, ratio {cp / cb:.3f} ({runs} runs each, alternating; "
                      f"target <= 1.05)")
        finally:
            model.kill()


if __name__ == "__main__":
    main()
