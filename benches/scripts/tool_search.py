"""Tool search (`[mcp] tools = "search"`) against the full listing, in the same run: the bytes of
the gateway's `tools/list` answer on the wire with N upstreams of `server-everything` (all vs
search, and their ratio), and the time of a `tools/call` of `S1__echo` made directly against the
same call made through `call_tool`, and made directly under `--prefix on_conflict` (every name
clashes, so every name is still `SERVER__TOOL`, but resolving one goes over every listed tool) (p50 of interleaved calls over one stdio session each; the
added latency is the difference). Speaks JSON-RPC lines to `npc mcp serve` itself, so the bytes
are exactly what a client reads.

Usage:

    NPC=target/release/npc [SERVERS=20] [CALLS=300] python3 benches/scripts/tool_search.py
"""
import json, os, shutil, statistics, subprocess, tempfile, time

NPC = os.environ.get("NPC", "target/release/npc")
SERVERS = int(os.environ.get("SERVERS", "20"))
CALLS = int(os.environ.get("CALLS", "300"))
EVERYTHING = shutil.which("mcp-server-everything")


class Session:
    def __init__(self, root, *flags):
        self.p = subprocess.Popen(
            [NPC, "mcp", "serve", *flags],
            cwd=root,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.next = 0
        self.request("initialize", {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "tool_search.py", "version": "1"},
        })
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, msg):
        self.p.stdin.write(json.dumps(msg).encode() + b"\n")
        self.p.stdin.flush()

    def request(self, method, params):
        """The answer's line, as read."""
        self.next += 1
        self.send({"jsonrpc": "2.0", "id": self.next, "method": method, "params": params})
        while True:
            line = self.p.stdout.readline()
            if not line:
                raise SystemExit(f"the gateway closed its output during `{method}`")
            if json.loads(line).get("id") == self.next:
                return line

    def call(self, name, arguments):
        return self.request("tools/call", {"name": name, "arguments": arguments})

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=30)


def main():
    if not EVERYTHING:
        raise SystemExit("needs `mcp-server-everything` (npm install -g @modelcontextprotocol/server-everything)")
    root = tempfile.mkdtemp()
    servers = "".join(
        f'[mcp.servers.s{i}]\ncommand = "{EVERYTHING}"\n' for i in range(1, SERVERS + 1)
    )
    with open(os.path.join(root, "npcagent.toml"), "w") as f:
        f.write("version = 1\n" + servers)
    everything = Session(root)
    search = Session(root, "--tools", "search")
    conflict = Session(root, "--prefix", "on_conflict")
    sizes = {}
    for mode, s in (("all", everything), ("search", search)):
        line = s.request("tools/list", {})
        tools = json.loads(line)["result"]["tools"]
        sizes[mode] = (len(line), len(tools))
    found = json.loads(search.call("search_tools", {"query": "echo", "limit": 8}))
    found_bytes = len(json.dumps(found))
    direct, through, renamed = [], [], []
    for _ in range(CALLS):
        started = time.perf_counter()
        conflict.call("s1__echo", {"message": "x"})
        renamed.append(time.perf_counter() - started)
        started = time.perf_counter()
        search.call("s1__echo", {"message": "x"})
        direct.append(time.perf_counter() - started)
        started = time.perf_counter()
        search.call("call_tool", {"name": "s1__echo", "arguments": {"message": "x"}})
        through.append(time.perf_counter() - started)
    everything.close()
    search.close()
    conflict.close()
    shutil.rmtree(root, ignore_errors=True)
    (all_bytes, all_tools), (search_bytes, search_tools) = sizes["all"], sizes["search"]
    print(f"upstreams: {SERVERS} x server-everything")
    print(f"tools/list, all:    {all_bytes} bytes, {all_tools} tools")
    print(f"tools/list, search: {search_bytes} bytes, {search_tools} tools")
    print(f"ratio all/search:   {all_bytes / search_bytes:.1f}")
    print(f"one search_tools answer (query `echo`, limit 8): {found_bytes} bytes")
    d, t = statistics.median(direct) * 1000, statistics.median(through) * 1000
    print(f"tools/call p50, direct: {d:.3f} ms; through call_tool: {t:.3f} ms; added {t - d:.3f} ms ({CALLS} calls each)")
    r = statistics.median(renamed) * 1000
    print(f"tools/call p50 with `--prefix on_conflict` (names resolved over every listed tool): {r:.3f} ms; added {r - d:.3f} ms")


if __name__ == "__main__":
    main()
