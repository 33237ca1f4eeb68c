#!/usr/bin/env python3
"""Time to the first agent message and to the end of a whole scripted turn,
`driver = "acp"` against `driver = "headless"`, per agent CLI, in the same
run: one repository and home per CLI (set up as `fixtures/acp/record.py`
does, against the scripted model on 127.0.0.1), one manifest with both
providers, and `npc run` of each profile alternated RUNS times. The turn
is the one the real-CLI tests use: the model calls the gateway's `echo`,
then answers. Prints the medians and the ratio acp / headless.

With `--pair sandbox` the pair is a headless run without a sandbox and in a
`workspace` sandbox (issue 45's "a real CLI in a sandbox" cost).

Usage: benches/scripts/acp_turn.py [--npc PATH] [--runs N] [--pair driver|sandbox] [claude|codex|gemini|opencode]...
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "fixtures/acp"))
import record  # noqa: E402  (the recorder's setup of each agent's home)

KIND = {"claude": "claude_code", "codex": "codex", "gemini": "gemini_cli", "opencode": "opencode"}
# What the headless CLI needs on its command line to run the gateway's echo.
HEADLESS_ARGS = {"claude": ["--allowedTools", "mcp__npc__everything__echo"], "gemini": ["--yolo"]}
PROMPT = "call the echo tool"


def toml_str(s):
    return json.dumps(s)


def sandbox_manifest(agent, env):
    """One headless provider; profile `off` without a sandbox, `workspace` in one."""
    env_line = ", ".join("%s = %s" % (k, toml_str(v)) for k, v in env.items())
    args = ", ".join(toml_str(a) for a in HEADLESS_ARGS.get(agent, []))
    profile = ("[profiles.%s]\nprovider = \"p\"\ndescription = \"bench\"\nmcp_servers = [\"everything\"]\n"
               "sandbox = \"%s\"\n\n")
    return (
        "version = 1\n[mcp]\ngateway = true\n\n[mcp.servers.everything]\ncommand = \"node\"\n"
        "args = [%s]\n\n[providers.p]\nkind = \"%s\"\nenv = { %s }\nargs = [%s]\n\n"
    ) % (toml_str(record.everything()), KIND[agent], env_line, args) + profile % ("off", "off") + profile % ("workspace", "workspace")


def manifest(agent, env):
    env_line = ", ".join("%s = %s" % (k, toml_str(v)) for k, v in env.items())
    args = ", ".join(toml_str(a) for a in HEADLESS_ARGS.get(agent, []))
    return (
        "version = 1\n[mcp]\ngateway = true\n\n[mcp.servers.everything]\ncommand = \"node\"\n"
        "args = [%s]\n\n"
        "[providers.headless]\nkind = \"%s\"\nenv = { %s }\nargs = [%s]\n\n"
        "[providers.acp]\nkind = \"%s\"\ndriver = \"acp\"\nenv = { %s }\n\n"
        "[profiles.headless]\nprovider = \"headless\"\ndescription = \"bench\"\nmcp_servers = [\"everything\"]\n\n"
        "[profiles.acp]\nprovider = \"acp\"\ndescription = \"bench\"\nmcp_servers = [\"everything\"]\n"
    ) % (toml_str(record.everything()), KIND[agent], env_line, args, KIND[agent], env_line)


def one_run(npc, repo, env, profile):
    """(ms to the first agent.message, ms to the end) of one `npc run`."""
    started = time.monotonic()
    proc = subprocess.Popen([npc, "run", profile, "--prompt", PROMPT, "--format", "json"],
                            cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, text=True)
    first = idle = None
    for line in proc.stdout:
        if first is None and '"agent.message"' in line:
            first = (time.monotonic() - started) * 1000
        if '"agent.idle"' in line:
            idle = (time.monotonic() - started) * 1000
    code = proc.wait()
    total = (time.monotonic() - started) * 1000
    if code != 0:
        raise RuntimeError("npc run %s exited %d" % (profile, code))
    return first if first is not None else total, total, idle if idle is not None else total


def bench(agent, npc, runs, pair):
    work = tempfile.mkdtemp(prefix="acp-turn-")
    try:
        repo, home = os.path.join(work, "repo"), os.path.join(work, "home")
        os.makedirs(repo)
        os.makedirs(home)
        subprocess.run(["git", "init", "-q", "."], cwd=repo, check=True)
        model, port = record.start_model(work, "echo", {"message": "bench-echo"})
        try:
            url = "http://127.0.0.1:%d" % port
            env = record.setup(agent, "turn", repo, home, url)
            with open(os.path.join(repo, "npcagent.toml"), "w", encoding="utf-8") as f:
                f.write((manifest if pair == "driver" else sandbox_manifest)(agent, env))
            # A CLI's state directories exist after its first use (the
            # sandbox lets it write only those).
            for d in (".local/share/opencode", ".local/state/opencode", ".cache/opencode"):
                os.makedirs(os.path.join(home, d), exist_ok=True)
            run_env = {"PATH": os.path.dirname(npc) + os.pathsep + os.environ.get("PATH", ""),
                       "HOME": home, "LANG": "C.UTF-8",
                       "XDG_DATA_HOME": os.path.join(home, ".local/share")}
            subprocess.run([npc, "apply", "--auto-approve"], cwd=repo, env=run_env, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            # One of each first: the CLIs' first start fills their caches.
            names = ("headless", "acp") if pair == "driver" else ("off", "workspace")
            for profile in names:
                one_run(npc, repo, run_env, profile)
            times = {p: [] for p in names}
            for _ in range(runs):
                for profile in names:
                    times[profile].append(one_run(npc, repo, run_env, profile))
        finally:
            model.kill()
        med = {p: [statistics.median(t[i] for t in v) for i in range(3)] for p, v in times.items()}
        if pair == "sandbox":
            print("%-8s whole turn: sandbox off %6.0f ms, workspace %6.0f ms (%.2fx)"
                  % (agent, med["off"][1], med["workspace"][1], med["workspace"][1] / med["off"][1]))
            return
        print("%-8s first message: headless %6.0f ms, acp %6.0f ms (%.2fx)   whole turn: headless %6.0f ms, acp %6.0f ms (%.2fx)   turn end to exit: headless %4.0f ms, acp %4.0f ms"
              % (agent, med["headless"][0], med["acp"][0], med["acp"][0] / med["headless"][0],
                 med["headless"][1], med["acp"][1], med["acp"][1] / med["headless"][1],
                 med["headless"][1] - med["headless"][2], med["acp"][1] - med["acp"][2]))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--npc", default=os.path.join(ROOT, "target/release/npc"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--pair", choices=["driver", "sandbox"], default="driver",
                    help="driver: headless against acp; sandbox: a headless run without and in a workspace sandbox")
    ap.add_argument("agents", nargs="*", default=["claude", "codex", "gemini", "opencode"])
    opts = ap.parse_args()
    for agent in opts.agents:
        bench(agent, os.path.abspath(opts.npc), opts.runs, opts.pair)


if __name__ == "__main__":
    main()
