"""System calls `npc mcp serve` makes per `tools/call` (RESULTS.md, MCP gateway).

Runs the gateway under `strace -f -c` (its threads, and the upstream it starts), makes
1,000 `echo` calls of server-everything through it, and prints the gateway's own calls
per tool call: `read`, `write`, `epoll_wait`, `futex`. Usage:

    NPC=target/release/npc python3 benches/scripts/gateway_syscalls.py REPO

with REPO as for relay_floor.py. Needs `strace`.
"""
import json, os, subprocess, sys, tempfile

CALLS = 1000
out = tempfile.NamedTemporaryFile(suffix=".strace", delete=False).name
p = subprocess.Popen(["strace", "-f", "-c", "-o", out, os.environ["NPC"], "mcp", "serve"],
                     cwd=sys.argv[1], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                     stderr=subprocess.DEVNULL, bufsize=0)
def call(i, method, params):
    p.stdin.write((json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}) + "\n").encode())
    while True:
        m = json.loads(p.stdout.readline())
        if m.get("id") == i:
            return m
call(0, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "b", "version": "1"}})
p.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
for i in range(1, CALLS + 1):
    assert "result" in call(i, "tools/call", {"name": "everything__echo", "arguments": {"message": "hello"}})
p.stdin.close()
p.wait()
# node (the upstream) makes `epoll_pwait`, not `epoll_wait`; `read`/`write`/`futex`
# include the upstream's too, so only `epoll_wait` is the gateway's alone.
counts = {}
for line in open(out):
    parts = line.split()
    if len(parts) >= 5 and parts[-1] in ("read", "write", "epoll_wait", "futex"):
        counts[parts[-1]] = int(parts[3])
os.unlink(out)
print("per tool call (epoll_wait: the gateway's alone):",
      {k: round(v / CALLS, 2) for k, v in sorted(counts.items())})
