//! The fleet under faults, through `npc worker` processes and a real
//! PostgreSQL: a worker whose connections stall past its lease stops its
//! run before another worker starts it again (never two executions at
//! once); a run that ends while the store is down keeps its result and is
//! recorded once when the store is back; a worker paused past its lease
//! while its run ends has its late end refused, the run carried out again
//! once by the fleet as its retries allow; and an outage is warned of a
//! bounded number of times, whatever its loops retry.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use npcagent::runs::fleet::WARN_EVERY;
use npcagent::store::fleet::FleetQueue;
use npcagent::store::pg::POOL_SIZE;
use npcagent::store::queue::{Enqueued, NewRun, state};

use crate::fleet::{Continued, QueuedFleet, queued_fleet, run, start_worker_leased, worker_logs};

/// The lease of the fault tests' workers, in seconds.
const LEASE_SECS: u64 = 2;
/// The lease of the outage test's worker, in seconds: its run's end (the
/// command, then its conclusion, which may wait on the remote's name not
/// resolving) comes well before the worker would stop it as cut off.
const OUTAGE_LEASE_SECS: u64 = 18;
/// The lease of the outage test's other worker, in seconds: the shortest.
const QUICK_RESCUER_LEASE_SECS: u64 = 1;
/// Bytes one pump of the proxy moves at a time.
const PUMP_BYTES: usize = 16 * 1024;

/// What the proxy's threads share.
#[derive(Default)]
struct Gate {
    /// Nothing is forwarded (connections and bytes wait) while set.
    frozen: bool,
    /// The proxy is dropped: every thread ends.
    closed: bool,
    /// Every socket it opened, shut down when it is dropped.
    sockets: Vec<TcpStream>,
}

/// A loopback TCP proxy in front of PostgreSQL that the test can freeze:
/// a frozen proxy holds every byte (the kernel still acknowledges them,
/// so neither keepalives nor `TCP_USER_TIMEOUT` see a fault), as a
/// stalled network path does.
struct Proxy {
    port: u16,
    gate: Arc<(Mutex<Gate>, Condvar)>,
}

impl Proxy {
    fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let gate: Arc<(Mutex<Gate>, Condvar)> = Arc::default();
        let shared = gate.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if !pass(&shared) {
                    return;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                {
                    let mut held = shared.0.lock().unwrap();
                    for s in [&client, &server] {
                        held.sockets.push(s.try_clone().unwrap());
                    }
                }
                for (from, to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let gate = shared.clone();
                    std::thread::spawn(move || pump(from, to, &gate));
                }
            }
        });
        Self { port, gate }
    }

    fn freeze(&self, frozen: bool) {
        self.gate.0.lock().unwrap().frozen = frozen;
        self.gate.1.notify_all();
    }
}

/// Wait while the gate is frozen; whether to go on (not closed).
fn pass(gate: &(Mutex<Gate>, Condvar)) -> bool {
    let held = gate
        .1
        .wait_while(gate.0.lock().unwrap(), |g| g.frozen && !g.closed)
        .unwrap();
    !held.closed
}

/// Copy `from` to `to` while the gate lets bytes through.
fn pump(mut from: TcpStream, mut to: TcpStream, gate: &(Mutex<Gate>, Condvar)) {
    let mut buf = vec![0u8; PUMP_BYTES];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !pass(gate) || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

impl Drop for Proxy {
    fn drop(&mut self) {
        {
            let mut held = self.gate.0.lock().unwrap();
            held.closed = true;
            for s in held.sockets.drain(..) {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        self.gate.1.notify_all();
        // Wakes the accepting thread, which then sees the gate closed.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// The lines of `marks` in `dir`.
fn marks(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("marks"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// A run that may be retried once.
fn retried_run(id: &str) -> NewRun {
    NewRun {
        attempts: 2,
        max_queued: usize::MAX,
        ..run(id)
    }
}

#[test]
fn a_worker_whose_connections_stall_past_its_lease_stops_its_run_before_another_starts_it() {
    // The first execution marks its start and waits until stopped. The
    // next one marks `overlap` if the first still lives, then ends.
    let script = "if [ -s first.pid ] && kill -0 \"$(cat first.pid)\" 2>/dev/null; \
                  then echo overlap >> marks; fi; \
                  if [ -s first.pid ]; then echo start-again >> marks; echo end >> marks; exit 0; fi; \
                  echo $$ > first.pid; echo start >> marks; \
                  while :; do sleep 0.1; done";
    let Some(fleet) = queued_fleet(script, 0) else {
        return;
    };
    let QueuedFleet {
        cluster,
        repo,
        url,
        rt,
        store,
        logs,
    } = &fleet;
    let proxy = Proxy::start(cluster.port);
    let proxied = url.replace(
        &format!("127.0.0.1:{}/", cluster.port),
        &format!("127.0.0.1:{}/", proxy.port),
    );
    assert_ne!(&proxied, url);
    let lease = LEASE_SECS.to_string();
    let stalled = crate::support::Stopped::new(start_worker_leased(
        repo.path(),
        &proxied,
        &logs.path().join("stalled.log"),
        &lease,
    ));
    let id = "run-stall";
    let queued = rt.block_on(store.enqueue(retried_run(id))).unwrap();
    assert_eq!(queued, Enqueued::Queued);
    crate::support::wait_for("the first execution to start", || {
        (marks(repo.path()) == ["start"]).then_some(())
    });
    let _other = crate::support::Stopped::new(start_worker_leased(
        repo.path(),
        url,
        &logs.path().join("other.log"),
        &lease,
    ));
    proxy.freeze(true);
    let row = crate::support::wait_for_within("the run to end", Duration::from_secs(60), || {
        rt.block_on(store.run(id))
            .unwrap()
            .filter(|r| r.state != state::QUEUED && r.state != state::RUNNING)
    });
    // Thawed before anything can fail, so every worker stops when dropped.
    proxy.freeze(false);
    let seen = marks(repo.path());
    assert_eq!(
        seen,
        ["start", "start-again", "end"],
        "the first execution stopped before the second started\n{}",
        worker_logs(logs.path())
    );
    assert_eq!(row.state, state::SUCCEEDED, "{row:?}");
    assert_eq!(row.attempt, 2, "{row:?}");
    let said = std::fs::read_to_string(logs.path().join("stalled.log")).unwrap();
    assert!(said.contains("lease was lost"), "{said}");
    // Stopped, the stalled worker wrote nothing over the run's end.
    let _ = stalled.terminate();
    let after = rt.block_on(store.run(id)).unwrap().unwrap();
    assert_eq!(after.state, state::SUCCEEDED, "{after:?}");
    assert_eq!(marks(repo.path()).len(), 3);
}

#[test]
fn a_run_that_ends_while_the_store_is_down_is_recorded_once_when_it_is_back() {
    // The run waits for `go`, then ends; it marks each execution.
    let script = "echo start >> marks; while [ ! -e go ]; do sleep 0.1; done; echo end >> marks";
    let Some(mut fleet) = queued_fleet(script, 0) else {
        return;
    };
    let lease = OUTAGE_LEASE_SECS.to_string();
    let log = fleet.logs.path().join("worker.log");
    let _worker = crate::support::Stopped::new(start_worker_leased(
        fleet.repo.path(),
        &fleet.url,
        &log,
        &lease,
    ));
    let id = "run-outage";
    let queued = fleet.rt.block_on(fleet.store.enqueue(retried_run(id)));
    assert_eq!(queued.unwrap(), Enqueued::Queued);
    crate::support::wait_for("the run to start", || {
        (marks(fleet.repo.path()) == ["start"]).then_some(())
    });
    // Another worker, of a short lease (it looks for expired leases every
    // half of it), which would rescue the run (and carry out its next
    // attempt) if it judged its lease on time it could not see the store.
    let _other = crate::support::Stopped::new(start_worker_leased(
        fleet.repo.path(),
        &fleet.url,
        &fleet.logs.path().join("other.log"),
        &QUICK_RESCUER_LEASE_SECS.to_string(),
    ));
    crate::support::wait_for("the other worker to join", || {
        let said = std::fs::read_to_string(fleet.logs.path().join("other.log")).ok()?;
        said.contains("joined fleet").then_some(())
    });
    fleet.cluster.stop();
    let stopped = Instant::now();
    std::fs::write(fleet.repo.path().join("go"), "").unwrap();
    // The run ends while the store is down, and stays down past its lease.
    crate::support::wait_for("the end write to fail", || {
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        (said.contains(&format!("run `{id}`: cannot"))
            && stopped.elapsed() > Duration::from_secs(OUTAGE_LEASE_SECS))
        .then_some(())
    });
    fleet.cluster.start_again();
    let store = fleet
        .rt
        .block_on(npcagent::store::pg::PgStore::connect(
            &fleet.url,
            &crate::fleet::fleet_key(),
        ))
        .unwrap();
    let row = crate::support::wait_for("the run's end to be written", || {
        fleet
            .rt
            .block_on(store.run(id))
            .unwrap()
            .filter(|r| r.state != state::RUNNING && r.state != state::QUEUED)
    });
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(row.state, state::SUCCEEDED, "{row:?}\n{said}");
    assert_eq!(
        row.attempt,
        1,
        "{row:?}\n{said}\n{:?}",
        marks(fleet.repo.path())
    );
    assert_eq!(
        marks(fleet.repo.path()),
        ["start", "end"],
        "executed once\n{}",
        worker_logs(fleet.logs.path())
    );
    let events = fleet.rt.block_on(store.events_after(0, 10_000)).unwrap();
    let finished = events.iter().filter(|e| e.kind == "run.finished").count();
    assert_eq!(finished, 1, "{events:?}");
    // The outage's warnings are few: one, then one per `WARN_EVERY`.
    let outage = stopped.elapsed();
    let warnings = said.matches(&format!("run `{id}`: cannot")).count();
    let bound = 1 + outage.as_millis() / WARN_EVERY.as_millis();
    assert!(
        (1..=bound as usize).contains(&warnings),
        "{warnings} warnings over {outage:?}:\n{said}"
    );
}

/// How long a continued worker may take to find its lease lost (a run's
/// wind-up on a loaded machine, not one reply).
const RUN_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

#[test]
fn a_worker_paused_past_its_lease_while_its_run_ends_has_its_late_end_refused() {
    // Each execution marks its start and, once `go` exists, its end.
    let script = "echo start >> marks; while [ ! -e go ]; do sleep 0.1; done; echo end >> marks";
    let Some(fleet) = queued_fleet(script, 0) else {
        return;
    };
    let QueuedFleet {
        repo,
        url,
        rt,
        store,
        logs,
        ..
    } = &fleet;
    let lease = LEASE_SECS.to_string();
    let paused_log = logs.path().join("paused.log");
    let paused =
        crate::support::Stopped::new(start_worker_leased(repo.path(), url, &paused_log, &lease));
    let id = "run-paused";
    let queued = rt.block_on(store.enqueue(retried_run(id))).unwrap();
    assert_eq!(queued, Enqueued::Queued);
    crate::support::wait_for("the run to start", || {
        (marks(repo.path()) == ["start"]).then_some(())
    });
    let pid = Pid::from_raw(paused.pid() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    let continued = Continued(pid);
    std::fs::write(repo.path().join("go"), "").unwrap();
    // The run ends while its worker is paused, which records nothing.
    crate::support::wait_for("the first execution to end", || {
        (marks(repo.path()) == ["start", "end"]).then_some(())
    });
    // Another worker rescues it once the lease ran out and carries out
    // its next attempt, as its trigger's retries allow.
    let _other = crate::support::Stopped::new(start_worker_leased(
        repo.path(),
        url,
        &logs.path().join("other.log"),
        &lease,
    ));
    let row = crate::support::wait_for("the next attempt to end", || {
        rt.block_on(store.run(id))
            .unwrap()
            .filter(|r| r.attempt == 2 && r.state != state::QUEUED && r.state != state::RUNNING)
    });
    assert_eq!(
        row.state,
        state::SUCCEEDED,
        "{row:?}\n{}",
        worker_logs(logs.path())
    );
    assert_eq!(marks(repo.path()), ["start", "end", "start", "end"]);
    // Continued, the paused worker's writes of its attempt are refused.
    drop(continued);
    // Its relay of the run's end (or the end itself) is refused.
    // Continued on a loaded machine, the worker first catches up on every
    // timer it missed; the limit is a run's, not a reply's.
    let said = crate::support::wait_for_within(
        "the paused worker to hear it was fenced",
        RUN_WAIT,
        || {
            let said = std::fs::read_to_string(&paused_log).unwrap_or_default();
            (said.contains("lease was lost") || said.contains("its end was not written"))
                .then_some(said)
        },
    );
    assert!(!said.contains(crate::pg::PG_PASSWORD), "{said}");
    let after = rt.block_on(store.run(id)).unwrap().unwrap();
    assert_eq!(after, row, "nothing written over the next attempt's end");
    let events = rt.block_on(store.events_after(0, 10_000)).unwrap();
    let count = |kind: &str| {
        events
            .iter()
            .filter(|e| e.kind == kind && e.payload["run_id"] == id)
            .count()
    };
    assert_eq!(
        (count("run.finished"), count("run.retry")),
        (1, 1),
        "{events:?}"
    );
    assert_eq!(marks(repo.path()).len(), 4, "executed once more, no more");
}

/// Warning lines npc itself writes (not its libraries') in `log`.
fn npc_warnings(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("WARN") && l.contains("npcagent::"))
        .collect()
}

/// Each of a worker's loops that meets the store (claims, rescues, the
/// roster, the run it carries) warns of an outage once, then at most once
/// per `WARN_EVERY` with a count, and says once that the store answers
/// again; the run's renewals, retried at every relay tick until the
/// worker stops the run as cut off, and its relays warn as one loop.
#[test]
fn a_worker_warns_of_a_store_outage_once_per_loop_then_once_per_interval() {
    let script = "echo start >> marks; while :; do sleep 0.1; done";
    let Some(mut fleet) = queued_fleet(script, 0) else {
        return;
    };
    let lease = LEASE_SECS.to_string();
    let log = fleet.logs.path().join("worker.log");
    let _worker = crate::support::Stopped::new(start_worker_leased(
        fleet.repo.path(),
        &fleet.url,
        &log,
        &lease,
    ));
    let queued = fleet.rt.block_on(fleet.store.enqueue(run("run-outage")));
    assert_eq!(queued.unwrap(), Enqueued::Queued);
    crate::support::wait_for("the run to start", || {
        (marks(fleet.repo.path()) == ["start"]).then_some(())
    });
    let failing = [
        "the claim loop: cannot",
        "the rescue loop: cannot",
        "the roster: cannot",
        "run `run-outage`: cannot",
    ];
    fleet.cluster.stop();
    let stopped = Instant::now();
    // Down until every loop failed and the run was stopped as cut off.
    crate::support::wait_for("every loop to fail", || {
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        (failing.iter().all(|f| said.contains(f)) && said.contains("lease was lost")).then_some(())
    });
    fleet.cluster.start_again();
    let said = crate::support::wait_for("the loops to hear the store again", || {
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        ["the claim loop", "the rescue loop", "the roster"]
            .iter()
            .all(|about| said.contains(&format!("{about}: the store answers again")))
            .then_some(said)
    });
    let outage = stopped.elapsed();
    // Four loops, each one warning and one more per `WARN_EVERY`, and the
    // run's stop as cut off.
    let loops = failing.len() as u128;
    let bound = loops * (1 + outage.as_millis() / WARN_EVERY.as_millis()) + 1;
    let warnings = npc_warnings(&said);
    assert!(
        warnings.len() as u128 <= bound,
        "{} warnings over {outage:?} (at most {bound}):\n{said}",
        warnings.len()
    );
    // The pool's own lines: each pooled connection's end and its failed
    // recycling, once per outage.
    let library = said
        .lines()
        .filter(|l| l.contains("WARN") && !l.contains("npcagent::"))
        .count();
    assert!(library <= 2 * POOL_SIZE, "{said}");
    for about in failing {
        let lines = said.matches(about).count() as u128;
        assert!(
            (1..=1 + outage.as_millis() / WARN_EVERY.as_millis()).contains(&lines),
            "{lines} lines `{about}` over {outage:?}:\n{said}"
        );
    }
}
