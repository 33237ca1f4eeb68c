"""Webhook and API throughput of two npc builds in the same run (RESULTS.md, "The network
guards against the commit before them").

Starts one release `npc daemon` per build, each on its own temporary repository (their store
schemas may differ), and alternates `wrk -t2 -c64 -d8s` runs between them, ROUNDS times:

- webhook: POST to a signed route (overlap `skip`: every 202 is a committed run row, nothing
  runs). Every request is a distinct delivery, its body numbered and its HMAC precomputed here,
  so a build that keys replays on the signature accepts each one (a repeated body would be a
  409 replay, a different path).
- webhook rejected: the same route, a wrong signature (401): the listener's own cost.
- api: GET /api/v1/status with `Authorization: Bearer <the repository's token>` (a build
  without the token guard ignores the header).

Usage (ROUNDS and KINDS, e.g. `KINDS=api`, are optional):

    BEFORE=/path/to/old/npc AFTER=target/release/npc python3 benches/scripts/guards_before_after.py

Prints each run, then per build the median and the best run, and the ratios after/before.
Needs `wrk`.
"""
import hashlib, hmac, os, socket, statistics, subprocess, sys, tempfile, time

ROUNDS = int(os.environ.get("ROUNDS", "5"))
# Which measurements to make (comma-separated subset of webhook,rejected,api).
KINDS = tuple(os.environ.get("KINDS", "webhook,rejected,api").split(","))
SECONDS = 8
THREADS = 2
CONNECTIONS = 64
# Deliveries prepared per thread and run: more than one thread sends in SECONDS.
DELIVERIES_PER_THREAD = 200_000
SECRET = "bench-secret"
LIMIT = 60

MANIFEST = """version = 1
[daemon]
listen = "127.0.0.1:{api}"
webhook_listen = "127.0.0.1:{hook}"
[triggers.bench]
kind = "webhook"
route = "bench"
secret_env = "BENCH_SECRET"
overlap = "skip"
rate_limit_per_minute = 100000000
action = {{ command = "sleep", args = ["3600"] }}
"""

BODY = '{{"ref":"refs/heads/main","n":{n},"repository":{{"full_name":"acme/widget"}}}}'

LUA = r"""
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end
function init(args)
  sigs = {}
  bodies = {}
  for line in io.lines(args[1] .. "." .. tid) do
    local tab = line:find("\t", 1, true)
    sigs[#sigs + 1] = line:sub(1, tab - 1)
    bodies[#bodies + 1] = line:sub(tab + 1)
  end
  i = 0
end
function request()
  i = i % #sigs + 1
  local headers = {}
  headers["Content-Type"] = "application/json"
  headers["X-GitHub-Event"] = "push"
  headers["X-GitHub-Delivery"] = sigs[i]:sub(8, 39)
  headers["X-Hub-Signature-256"] = sigs[i]
  return wrk.format("POST", nil, headers, bodies[i])
end
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port):
    end = time.monotonic() + LIMIT
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"nothing listens on 127.0.0.1:{port}")


class Daemon:
    def __init__(self, npc):
        self.dir = tempfile.TemporaryDirectory()
        self.api, self.hook = free_port(), free_port()
        root = self.dir.name
        with open(os.path.join(root, "npcagent.toml"), "w") as f:
            f.write(MANIFEST.format(api=self.api, hook=self.hook))
        env = dict(os.environ, BENCH_SECRET=SECRET)
        self.log = open(os.path.join(root, "daemon.log"), "w")
        self.child = subprocess.Popen([npc, "daemon"], cwd=root, env=env,
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=self.log)
        wait_port(self.api)
        wait_port(self.hook)
        token = os.path.join(root, ".npc", "api.token")
        self.token = open(token).read().strip() if os.path.exists(token) else "none"

    def stop(self):
        self.child.terminate()
        self.child.wait()


def cpu_seconds(pid):
    """User + system CPU of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk(args, pid):
    """(requests/s, non-2xx answers, daemon CPU µs per request) of one `wrk` run."""
    cpu = cpu_seconds(pid)
    out = subprocess.run(["wrk", "-t", str(THREADS), "-c", str(CONNECTIONS), "-d",
                          f"{SECONDS}s", *args], capture_output=True, text=True, check=True).stdout
    rate = next(float(l.split()[1]) for l in out.splitlines() if l.startswith("Requests/sec:"))
    bad = next((int(l.split()[-1]) for l in out.splitlines()
                if "Non-2xx" in l), 0)
    total = next(int(l.split()[0]) for l in out.splitlines() if "requests in" in l)
    return rate, bad, (cpu_seconds(pid) - cpu) * 1e6 / max(total, 1)


def deliveries(work, run):
    """Files `work/d.<tid>` of distinct signed deliveries for one run (numbers never reused)."""
    base = work + "/d"
    for tid in range(1, THREADS + 1):
        with open(f"{base}.{tid}", "w") as f:
            for k in range(DELIVERIES_PER_THREAD):
                n = (run * THREADS + tid) * DELIVERIES_PER_THREAD + k
                body = BODY.format(n=n)
                sig = hmac.new(SECRET.encode(), body.encode(), hashlib.sha256).hexdigest()
                f.write(f"sha256={sig}\t{body}\n")
    return base


def main():
    builds = {"before": os.path.abspath(os.environ["BEFORE"]),
              "after": os.path.abspath(os.environ["AFTER"])}
    daemons = {name: Daemon(npc) for name, npc in builds.items()}
    work = tempfile.mkdtemp()
    script = os.path.join(work, "signed.lua")
    with open(script, "w") as f:
        f.write(LUA)
    kinds = KINDS
    results = {(name, what): [] for name in builds for what in kinds}
    unsigned = os.path.join(work, "u")
    for tid in range(1, THREADS + 1):
        with open(f"{unsigned}.{tid}", "w") as f:
            f.write("".join(f"sha256={'0' * 64}\t{BODY.format(n=k)}\n" for k in range(1000)))
    run = 0
    try:
        for r in range(ROUNDS):
            # Alternate which build goes first, so neither always runs on a warmer machine.
            order = list(builds) if r % 2 == 0 else list(reversed(builds))
            for name in order if "webhook" in kinds else ():
                d = daemons[name]
                run += 1
                data = deliveries(work, run)
                rate, bad, cpu = wrk(["-s", script, f"http://127.0.0.1:{d.hook}/webhooks/bench",
                                      "--", data], d.child.pid)
                print(f"round {r + 1} {name:6} webhook accepted {rate:>9.0f} req/s, {cpu:5.1f} µs CPU each ({bad} non-2xx)")
                results[(name, "webhook")].append((rate, cpu))
            for name in order if "rejected" in kinds else ():
                d = daemons[name]
                rate, bad, cpu = wrk(["-s", script, f"http://127.0.0.1:{d.hook}/webhooks/bench",
                                      "--", unsigned], d.child.pid)
                print(f"round {r + 1} {name:6} webhook rejected {rate:>9.0f} req/s, {cpu:5.1f} µs CPU each ({bad} 401)")
                results[(name, "rejected")].append((rate, cpu))
            for name in order if "api" in kinds else ():
                d = daemons[name]
                rate, bad, cpu = wrk(["-H", f"Authorization: Bearer {d.token}",
                                      f"http://127.0.0.1:{d.api}/api/v1/status"], d.child.pid)
                print(f"round {r + 1} {name:6} GET /api/v1/status {rate:>9.0f} req/s, {cpu:5.1f} µs CPU each ({bad} non-2xx)")
                results[(name, "api")].append((rate, cpu))
    finally:
        for d in daemons.values():
            d.stop()
    # This machine's neighbours slow whole runs now and then: the best run of
    # each build is the one least disturbed, the median the typical one.
    for what in kinds:
        rate = {b: [r for r, _ in results[(b, what)]] for b in builds}
        cpu = {b: statistics.median(c for _, c in results[(b, what)]) for b in builds}
        med = {b: statistics.median(rate[b]) for b in builds}
        best = {b: max(rate[b]) for b in builds}
        print(f"{what}: median {med['before']:.0f} -> {med['after']:.0f} req/s "
              f"(ratio {med['after'] / med['before']:.3f}); best {best['before']:.0f} -> "
              f"{best['after']:.0f} (ratio {best['after'] / best['before']:.3f}); daemon CPU "
              f"{cpu['before']:.1f} -> {cpu['after']:.1f} µs per request "
              f"(ratio {cpu['after'] / cpu['before']:.3f})")


if __name__ == "__main__":
    main()
