"""Memory of `npc mcp serve` under a flood of upstream progress (issue 26, part 4).

An upstream (`fixtures/mcp/passthrough_server.py`, its `storm` tool) sends FLOOD
`notifications/progress` for one call as fast as it can while the client reads slowly
(a pause every READ_PAUSE_EVERY frames). The gateway's per-session queue is bounded
(`mcp::passthrough::MAX_QUEUED_NOTIFICATIONS`): what does not fit is dropped and counted.
Prints the gateway's peak resident set (VmHWM) before and after the flood, how many
progress frames reached the client, and the call's answer. Usage:

    NPC=target/release/npc python3 benches/scripts/progress_flood.py [FLOOD]
"""
import json, os, subprocess, sys, tempfile, time

FLOOD = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
READ_PAUSE_EVERY = 1000
READ_PAUSE_S = 0.01
FIXTURE = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "mcp", "passthrough_server.py")

repo = tempfile.mkdtemp()
with open(os.path.join(repo, "npcagent.toml"), "w") as f:
    f.write('version = 1\n[mcp]\nprefix = "on_conflict"\n[mcp.servers.hostile]\n'
            f'command = "python3"\nargs = [{json.dumps(os.path.abspath(FIXTURE))}]\n')
p = subprocess.Popen([os.environ["NPC"], "mcp", "serve"], cwd=repo, stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)


def send(m):
    p.stdin.write((json.dumps(m) + "\n").encode())


def hwm_kib():
    with open(f"/proc/{p.pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])


send({"jsonrpc": "2.0", "id": 0, "method": "initialize",
      "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "b", "version": "1"}}})
p.stdout.readline()
send({"jsonrpc": "2.0", "method": "notifications/initialized"})
send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "lists"}})
p.stdout.readline()
before = hwm_kib()
started = time.monotonic()
send({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
      "params": {"name": "storm", "arguments": {"n": FLOOD}, "_meta": {"progressToken": "t"}}})
progress = 0
while True:
    m = json.loads(p.stdout.readline())
    if m.get("id") == 2:
        break
    progress += m.get("method") == "notifications/progress"
    if progress % READ_PAUSE_EVERY == 0:
        time.sleep(READ_PAUSE_S)  # a slow client
after = hwm_kib()
print(json.dumps({"flood": FLOOD, "delivered": progress, "seconds": round(time.monotonic() - started, 2),
                  "vm_hwm_kib_before": before, "vm_hwm_kib_after": after,
                  "answer": m["result"]["content"][0]["text"]}))
p.stdin.close()
p.wait()
