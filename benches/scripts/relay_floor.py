"""The floor of "a process in the middle" for the MCP gateway (RESULTS.md, MCP gateway).

Same-run p50 of server-everything's `echo` over stdio, three ways, calls interleaved:
directly; through `relay_floor` (benches/scripts/relay_floor.rs: two blocking threads
copying lines, no parsing); and through `npc mcp serve`. Usage:

    rustc -O benches/scripts/relay_floor.rs -o /tmp/relay_floor
    RELAY=/tmp/relay_floor NPC=target/release/npc python3 benches/scripts/relay_floor.py REPO

(NPC=A:B compares several builds, interleaved in the same run, REPO=R1:R2 giving each its own
repository when their store schemas differ; PROGRESS=1 puts a progress token in every
call's `_meta`, as rmcp's client (the one `cargo bench --bench mcp_gateway` drives) does;
TIGHT=1 runs each path's
calls back to back instead, and prints the mean per call. The interleaved run also prints
each process's CPU per call, start-up included.)

where REPO holds an npcagent.toml declaring `[mcp.servers.everything]` with
`command = "mcp-server-everything"`.
"""
import json, subprocess, sys, time, os, statistics
def start(cmd, cwd=None):
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=cwd, bufsize=0)
    def call(i, method, params):
        p.stdin.write((json.dumps({"jsonrpc":"2.0","id":i,"method":method,"params":params})+"\n").encode())
        while True:
            line = p.stdout.readline()
            m = json.loads(line)
            if m.get("id") == i: return m
    call(0, "initialize", {"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"b","version":"1"}})
    p.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
    return p, call
repos = sys.argv[1].split(":")
# NPC may name several npc binaries, `:`-separated, to compare builds in one run.
gateways = os.environ["NPC"].split(":")
paths = {
  "direct": start(["mcp-server-everything"]),
  "relay": start([os.environ["RELAY"], "mcp-server-everything"]),
}
names = {"direct":"echo","relay":"echo"}
def params(k, i):
    p = {"name": names[k], "arguments": {"message": "hello"}}
    if os.environ.get("PROGRESS"):
        p["_meta"] = {"progressToken": i}
    return p
for n, npc in enumerate(gateways):
    key = "gateway" if len(gateways) == 1 else "gateway%d" % (n + 1)
    paths[key] = start([npc, "mcp", "serve"], cwd=repos[min(n, len(repos) - 1)])
    names[key] = "everything__echo"
if os.environ.get("TIGHT"):
    # Each path on its own, calls back to back (no interleaving): mean ms per call.
    per_call = {}
    for k, (p, call) in paths.items():
        for i in range(1, 501):
            call(i, "tools/call", params(k, i))
        t = time.perf_counter()
        for i in range(501, 3501):
            r = call(i, "tools/call", params(k, i))
            assert "result" in r, r
        per_call[k] = (time.perf_counter() - t) / 3000 * 1000
    print("tight loop, ms per call:", {k: round(v, 3) for k, v in per_call.items()})
    print("".join("%s adds %.3f ms; " % (k, v - per_call["direct"]) for k, v in per_call.items() if k != "direct"))
    for p, _ in paths.values(): p.stdin.close()
    sys.exit(0)
lat = {k: [] for k in paths}
for i in range(1, 2301):
    for k,(p,call) in paths.items():
        t = time.perf_counter()
        r = call(i, "tools/call", params(k, i))
        d = time.perf_counter()-t
        assert "result" in r, r
        if i > 300: lat[k].append(d*1000)
med = {k: statistics.median(v) for k,v in lat.items()}
print({k: round(v,3) for k,v in med.items()})
print("relay adds %.3f ms" % (med["relay"]-med["direct"]) + "".join(
    ", %s adds %.3f ms" % (k, med[k]-med["direct"]) for k in med if k.startswith("gateway")))
def cpu_ms(pid):
    # utime + stime of the whole process (every thread), from /proc.
    fields = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")
print("CPU ms per call, the process in the path (direct: the server itself):",
      {k: round(cpu_ms(p.pid) / len(lat[k]), 4) for k, (p, _) in paths.items()})
def threads_ms(pid):
    # Each thread's utime + stime, by its name, summed over threads of one name.
    out = {}
    for tid in os.listdir("/proc/%d/task" % pid):
        stat = open("/proc/%d/task/%s/stat" % (pid, tid)).read()
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        ms = (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")
        out[name] = out.get(name, 0) + ms
    return out
def switches(pid):
    # Voluntary context switches of every thread of the process.
    total = 0
    for tid in os.listdir("/proc/%d/task" % pid):
        for line in open("/proc/%d/task/%s/status" % (pid, tid)):
            if line.startswith("voluntary_ctxt_switches"):
                total += int(line.split()[1])
    return total
print("voluntary context switches per call:",
      {k: round(switches(p.pid) / len(lat[k]), 2) for k, (p, _) in paths.items()})
for k, (p, _) in paths.items():
    if k.startswith("gateway"):
        print("  %s CPU ms per call by thread:" % k,
              {n: round(v / len(lat[k]), 4) for n, v in sorted(threads_ms(p.pid).items()) if v})
for p,_ in paths.values(): p.stdin.close()
