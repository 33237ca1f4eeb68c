//! Panes through the real `npc daemon`:
//! - PTY output throughput to a plugin (MB/s): a pane writes 64 MiB; the
//!   clock stops when the plugin has received every `pane_output` and the
//!   `pane_exited` that follows them. Same-run baseline: the same command in
//!   a PTY opened by this bench and read bare to its end.
//! - Latency from pane output to `pane_output` delivery (p50/p99): the pane
//!   prints wall-clock stamps; the plugin subtracts them on arrival.
//!   Baseline: the same stamps read bare from a PTY.

use std::io::Read as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Bytes the throughput pane writes.
const BYTES: usize = 64 * 1024 * 1024;
/// Stamps the latency pane prints.
const STAMPS: usize = 500;
/// Longest wait for anything.
const LIMIT: Duration = Duration::from_secs(300);

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/panes")
        .join(name)
        .display()
        .to_string()
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn daemon(dir: &Path, manifest: &str) -> Child {
    std::fs::write(dir.join("npcagent.toml"), manifest).expect("manifest");
    Command::new(env!("CARGO_BIN_EXE_npc"))
        .arg("daemon")
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("npc daemon starts")
}

fn stop(mut d: Child) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = d.wait();
}

/// The throughput pane's command: wait for `go`, then write [`BYTES`].
fn writer_script() -> String {
    format!(
        "while [ ! -e go ]; do sleep 0.001; done; head -c {BYTES} /dev/zero | tr '\\\\0' a | fold -w 100"
    )
}

fn through_plugin() -> Duration {
    let dir = tempfile::tempdir().expect("tempdir");
    let manifest = format!(
        r#"version = 1
[pane_plugins.sink]
command = "sh"
args = ["-c", "cat > sink"]
enabled = true

[panes.writer]
command = "sh"
args = ["-c", "{}"]
plugin = "sink"
"#,
        writer_script()
    );
    let d = daemon(dir.path(), &manifest);
    let sink = dir.path().join("sink");
    wait_until("the plugin to hear of the pane", || {
        std::fs::read_to_string(&sink).is_ok_and(|s| s.contains("pane_opened"))
    });
    let t = Instant::now();
    std::fs::write(dir.path().join("go"), "").expect("go");
    let mut seen = 0u64;
    wait_until("pane_exited at the plugin", || {
        // Read only what was appended since the last look.
        let Ok(mut f) = std::fs::File::open(&sink) else {
            return false;
        };
        use std::io::Seek as _;
        let _ = f.seek(std::io::SeekFrom::Start(seen.saturating_sub(64)));
        let mut tail = String::new();
        let _ = f.read_to_string(&mut tail);
        seen += tail.len() as u64 - seen.min(64).min(tail.len() as u64);
        tail.contains("\"pane_exited\"")
    });
    let elapsed = t.elapsed();
    let text: usize = std::fs::read_to_string(&sink)
        .expect("sink")
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["event"] == "pane_output")
        .map(|m| {
            m["text"]
                .as_str()
                .map_or(0, |t| t.chars().filter(|c| *c == 'a').count())
        })
        .sum();
    assert_eq!(text, BYTES, "the plugin received every byte");
    stop(d);
    elapsed
}

/// The same command in a PTY of our own, read bare to the end.
fn bare() -> Duration {
    use portable_pty::{CommandBuilder, PtySize, native_pty_system};
    let dir = tempfile::tempdir().expect("tempdir");
    let pair = native_pty_system()
        .openpty(PtySize {
            rows: 24,
            cols: 80,
            pixel_width: 0,
            pixel_height: 0,
        })
        .expect("pty");
    let mut cmd = CommandBuilder::new("sh");
    cmd.args(["-c", &writer_script().replace("\\\\", "\\")]);
    cmd.cwd(dir.path());
    let mut child = pair.slave.spawn_command(cmd).expect("spawn");
    drop(pair.slave);
    let mut reader = pair.master.try_clone_reader().expect("reader");
    let t = Instant::now();
    std::fs::write(dir.path().join("go"), "").expect("go");
    let mut buf = vec![0u8; 16 * 1024];
    let mut total = 0usize;
    while let Ok(n) = reader.read(&mut buf) {
        if n == 0 {
            break;
        }
        total += buf[..n].iter().filter(|b| **b == b'a').count();
    }
    let elapsed = t.elapsed();
    let _ = child.wait();
    assert_eq!(total, BYTES);
    elapsed
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn latency_through_plugin() -> Vec<f64> {
    let dir = tempfile::tempdir().expect("tempdir");
    let manifest = format!(
        r#"version = 1
[pane_plugins.lat]
command = "python3"
args = ["{plugin}"]
enabled = true
env = {{ LATENCY_OUT = "lat.out" }}

[panes.stamps]
command = "python3"
args = ["{pane}"]
plugin = "lat"
env = {{ COUNT = "{STAMPS}" }}
"#,
        plugin = fixture("latency_plugin.py"),
        pane = fixture("latency_pane.py"),
    );
    let d = daemon(dir.path(), &manifest);
    let out = dir.path().join("lat.out");
    wait_until("the plugin to start", || {
        Command::new(env!("CARGO_BIN_EXE_npc"))
            .args(["pane", "list", "--format", "json"])
            .current_dir(dir.path())
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("\"watcher\":\"lat\""))
    });
    std::fs::write(dir.path().join("go"), "").expect("go");
    wait_until("every stamp", || {
        std::fs::read_to_string(&out).is_ok_and(|s| s.contains("done"))
    });
    let mut ms: Vec<f64> = std::fs::read_to_string(&out)
        .expect("out")
        .lines()
        .filter_map(|l| l.parse::<f64>().ok())
        .map(|ns| ns / 1e6)
        .collect();
    stop(d);
    ms.sort_by(|a, b| a.total_cmp(b));
    ms
}

fn latency_bare() -> Vec<f64> {
    use portable_pty::{CommandBuilder, PtySize, native_pty_system};
    let dir = tempfile::tempdir().expect("tempdir");
    let pair = native_pty_system()
        .openpty(PtySize {
            rows: 24,
            cols: 80,
            pixel_width: 0,
            pixel_height: 0,
        })
        .expect("pty");
    let mut cmd = CommandBuilder::new("python3");
    cmd.arg(fixture("latency_pane.py"));
    cmd.env("COUNT", STAMPS.to_string());
    cmd.cwd(dir.path());
    let mut child = pair.slave.spawn_command(cmd).expect("spawn");
    drop(pair.slave);
    let mut reader = pair.master.try_clone_reader().expect("reader");
    std::fs::write(dir.path().join("go"), "").expect("go");
    let mut buf = vec![0u8; 4096];
    let mut ms = Vec::new();
    let mut pending = String::new();
    while let Ok(n) = reader.read(&mut buf) {
        if n == 0 {
            break;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_nanos() as f64;
        pending.push_str(&String::from_utf8_lossy(&buf[..n]));
        while let Some(i) = pending.find('\n') {
            let line: String = pending.drain(..=i).collect();
            if let Some(t) = line
                .trim()
                .strip_prefix('T')
                .and_then(|t| t.parse::<f64>().ok())
            {
                ms.push((now - t) / 1e6);
            }
        }
    }
    let _ = child.wait();
    ms.sort_by(|a, b| a.total_cmp(b));
    ms
}

fn main() {
    let mib = BYTES as f64 / (1024.0 * 1024.0);
    let base = bare();
    let plugin = through_plugin();
    let (b, p) = (mib / base.as_secs_f64(), mib / plugin.as_secs_f64());
    println!("PTY throughput, {mib:.0} MiB:");
    println!(
        "  bare PTY read        {:>8.1} MiB/s ({:.2} s)",
        b,
        base.as_secs_f64()
    );
    println!(
        "  to a plugin via npc  {:>8.1} MiB/s ({:.2} s)",
        p,
        plugin.as_secs_f64()
    );
    println!("  ratio                {:>8.2}x of bare", p / b);
    let lb = latency_bare();
    let lp = latency_through_plugin();
    println!("pane output -> delivery latency, {} stamps:", STAMPS);
    println!(
        "  bare PTY read        p50 {:.3} ms  p99 {:.3} ms",
        percentile(&lb, 0.5),
        percentile(&lb, 0.99)
    );
    println!(
        "  pane_output (plugin) p50 {:.3} ms  p99 {:.3} ms  ({} received)",
        percentile(&lp, 0.5),
        percentile(&lp, 0.99),
        lp.len()
    );
    println!(
        "  ratio                p50 {:.1}x  p99 {:.1}x",
        percentile(&lp, 0.5) / percentile(&lb, 0.5),
        percentile(&lp, 0.99) / percentile(&lb, 0.99)
    );
}
