"""The HTTP gateway's cost per `tools/call`, interleaved (RESULTS.md, MCP gateway).

Same-run p50 of server-everything's `echo` over streamable HTTP: directly, and through
`npc mcp serve --http` (one or several builds, NPC=A:B), calls interleaved one by one
(the gateways' order rotating), each call on a new connection as rmcp's client makes
them. Then each gateway's CPU per call (`/proc/PID/stat`, by thread) and voluntary
context switches per call, over the measured calls alone (start-up and warm-up excluded),
and how each path answered (JSON body or event stream). Usage:

    NPC=target/release/npc python3 benches/scripts/http_floor.py

(KEEP=1 keeps one connection per path instead.) Every session is of protocol 2025-11-25
(VERSION=... for another): the version npc's own session with its upstream has, so the
direct path and the gateway's upstream leg are served alike (server-everything answers
a 2025-11-25 session's call about 1 ms slower than a 2025-06-18 one's on this machine).
Needs `mcp-server-everything` and `fixtures/mcp/loopback.cjs` (binds it to 127.0.0.1).
"""
import http.client, json, os, socket, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CALLS, WARMUP = int(os.environ.get("CALLS", 2000)), int(os.environ.get("WARMUP", 300))
KEEP = bool(os.environ.get("KEEP"))
VERSION = os.environ.get("VERSION", "2025-11-25")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_listening(port, what):
    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"{what} did not listen")


class Path:
    def __init__(self, port, path, token=None):
        self.port, self.path, self.token, self.session, self.conn = port, path, token, None, None
        self.kinds = {}

    def post(self, message):
        headers = {"Content-Type": "application/json",
                   "Accept": "application/json, text/event-stream"}
        if self.token:
            headers["Authorization"] = "Bearer " + self.token
        if self.session:
            headers["Mcp-Session-Id"] = self.session
            headers["Mcp-Protocol-Version"] = VERSION
        if self.conn is None or not KEEP:
            if self.conn is not None:
                self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port)
        self.conn.request("POST", self.path, json.dumps(message), headers)
        r = self.conn.getresponse()
        body = r.read()
        self.session = self.session or r.getheader("mcp-session-id")
        if r.status == 202 or not body:
            return None
        kind = r.getheader("content-type", "").split(";")[0]
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        if kind == "text/event-stream":
            for event in body.split(b"\n\n"):
                data = b"\n".join(l[5:].strip() for l in event.split(b"\n") if l.startswith(b"data:"))
                if data:
                    m = json.loads(data)
                    if "id" in m and m.get("method") is None:
                        return m
            return None
        return json.loads(body)

    def start(self):
        self.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": VERSION, "capabilities": {},
            "clientInfo": {"name": "b", "version": "1"}}})
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return self


def cpu_ms(pid, tid=None):
    stat = open(f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat").read()
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def threads(pid):
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        stat = open(f"/proc/{pid}/task/{tid}/stat").read()
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        out[name] = out.get(name, 0) + cpu_ms(pid, tid)
    return out


def switches(pid):
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        for line in open(f"/proc/{pid}/task/{tid}/status"):
            if line.startswith("voluntary_ctxt_switches"):
                total += int(line.split()[1])
    return total


port = free_port()
env = dict(os.environ, PORT=str(port),
           NODE_OPTIONS="--require " + os.path.join(ROOT, "fixtures/mcp/loopback.cjs"))
server = subprocess.Popen(["mcp-server-everything", "streamableHttp"], env=env,
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
procs = [server]
try:
    wait_listening(port, "server-everything")
    paths = {"direct": (Path(port, "/mcp").start(), "echo", None)}
    gateways = os.environ["NPC"].split(":")
    for n, npc in enumerate(gateways):
        repo = tempfile.mkdtemp()
        with open(os.path.join(repo, "npcagent.toml"), "w") as f:
            f.write(f'version = 1\n[mcp.servers.everything]\nurl = "http://127.0.0.1:{port}/mcp"\n')
        gport = free_port()
        g = subprocess.Popen([npc, "mcp", "serve", "--http", f"127.0.0.1:{gport}"], cwd=repo,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        procs.append(g)
        wait_listening(gport, "the gateway")
        token = open(os.path.join(repo, ".npc/api.token")).read().strip()
        key = "gateway" if len(gateways) == 1 else f"gateway{n + 1}"
        paths[key] = (Path(gport, "/mcp", token).start(), "everything__echo", g)
    names = list(paths)
    lat = {k: [] for k in names}
    others = names[1:]
    before = {}
    for i in range(1, WARMUP + CALLS + 1):
        if i == WARMUP + 1:
            before = {k: (threads(paths[k][2].pid), switches(paths[k][2].pid)) for k in others}
        order = ["direct"] + [others[(k + i) % len(others)] for k in range(len(others))]
        for k in order:
            path, tool, _ = paths[k]
            t = time.perf_counter()
            r = path.post({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                           "params": {"name": tool, "arguments": {"message": "hello"}}})
            d = time.perf_counter() - t
            assert r and "result" in r, r
            if i > WARMUP:
                lat[k].append(d * 1000)
    med = {k: statistics.median(v) for k, v in lat.items()}
    print({k: round(v, 3) for k, v in med.items()}, "(p50 ms)")
    print(", ".join(f"{k} adds {med[k] - med['direct']:.3f} ms" for k in others))
    for k in others:
        pid = paths[k][2].pid
        cpu = {n: v - before[k][0].get(n, 0) for n, v in threads(pid).items()}
        print(f"  {k}: CPU ms per call {sum(cpu.values()) / CALLS:.4f} "
              f"{ {n: round(v / CALLS, 4) for n, v in sorted(cpu.items()) if v} }, "
              f"voluntary context switches per call {(switches(pid) - before[k][1]) / CALLS:.2f}")
    print("answers:", {k: paths[k][0].kinds for k in names})
finally:
    for p in procs:
        p.terminate()
        p.wait()
