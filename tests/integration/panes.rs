//! Panes and pane plugins through the real daemon: PTY panes opened,
//! listed, typed into, attached to and closed with `npc pane …`; a scripted
//! plugin (`fixtures/panes/scripted_plugin.py`) speaking protocol v3; every
//! guard refusal; malformed and oversize lines; reloads of each field kind;
//! relaunch with generation + 1 and the hold's TTL; the `npc-recovery`
//! plugin with a fake Codex and OpenCode in real PTYs; and the mechanical
//! check that nothing but a guard-approved command reaches a PTY.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::support::{Daemon, alive, npc, npc_path, repo_root, wait_for};

fn fixture(name: &str) -> String {
    repo_root()
        .join("fixtures/panes")
        .join(name)
        .display()
        .to_string()
}

/// A `[pane_plugins.NAME]` entry running the scripted plugin with its log
/// and command files under the repository (`NAME.log`, `NAME.cmds`).
pub(crate) fn scripted_plugin(name: &str, extra: &str) -> String {
    format!(
        r#"
[pane_plugins.{name}]
command = "python3"
args = ["{script}"]
enabled = true
env = {{ PLUGIN_LOG = "{name}.log", PLUGIN_CMDS = "{name}.cmds" }}
{extra}
"#,
        script = fixture("scripted_plugin.py"),
    )
}

/// The messages plugin `name` received so far.
fn received(d: &Daemon, name: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(d.root().join(format!("{name}.log")))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Wait until plugin `name` received an event of `kind` (and `also` holds).
pub(crate) fn wait_received(
    d: &Daemon,
    name: &str,
    kind: &str,
    also: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    wait_for(&format!("`{kind}` at plugin `{name}`"), || {
        received(d, name)
            .into_iter()
            .find(|m| m["event"] == kind && also(m))
    })
}

/// Make plugin `name` send `line` (placeholders `{token:PANE}`, `{gen:PANE}`).
pub(crate) fn plugin_sends(d: &Daemon, name: &str, line: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(d.root().join(format!("{name}.cmds")))
        .unwrap();
    f.write_all(line.as_bytes()).unwrap();
    f.write_all(b"\n").unwrap();
}

fn pane_list(d: &Daemon) -> Vec<serde_json::Value> {
    let a = d.npc(&["pane", "list", "--format", "json"]).success();
    let v: serde_json::Value = serde_json::from_slice(&a.get_output().stdout).unwrap();
    v["panes"].as_array().unwrap().clone()
}

fn pane(d: &Daemon, name: &str) -> serde_json::Value {
    pane_list(d)
        .into_iter()
        .find(|p| p["name"] == name)
        .unwrap_or_default()
}

/// The refusal reason of the next `pane_plugin.refused` event after `after`.
fn refusal_after(d: &Daemon, after: i64, cmd: &str) -> String {
    let e = wait_for(&format!("a refused `{cmd}`"), || {
        d.events_after(after)
            .into_iter()
            .find(|e| e["kind"] == "pane_plugin.refused" && e["payload"]["cmd"] == cmd)
    });
    e["payload"]["reason"].as_str().unwrap().to_string()
}

/// A pane that records every line typed into it in `NAME.typed` and its
/// token in `NAME.token`, then reads until EOF.
pub(crate) fn recording_pane(name: &str, extra: &str) -> String {
    format!(
        r#"
[panes.{name}]
command = "sh"
args = ["-c", "printf %s \"$NPC_PANE_TOKEN\" > {name}.token; printf '\\033[1;31mready\\033[0m\\n'; while read l; do echo \"$l\" >> {name}.typed; done"]
{extra}
"#
    )
}

fn read(d: &Daemon, file: &str) -> String {
    std::fs::read_to_string(d.root().join(file)).unwrap_or_default()
}

#[test]
fn panes_open_list_send_and_close_through_the_daemon() {
    let d = Daemon::start(&format!("version = 1\n{}", recording_pane("one", "")));
    let first = wait_for("pane `one` running", || {
        let p = pane(&d, "one");
        p["pid"].as_u64().map(|pid| (pid as u32, p))
    });
    assert_eq!(first.1["generation"], 1);
    assert!(alive(first.0));
    d.npc(&["pane", "send", "one", "hello pane"]).success();
    wait_for("the typed line", || {
        read(&d, "one.typed").contains("hello pane").then_some(())
    });
    // The token is in the pane's own environment, and never in an event.
    let token = wait_for("the token file", || {
        let t = read(&d, "one.token");
        (t.len() == 32).then_some(t)
    });
    let events = serde_json::to_string(&d.events()).unwrap();
    assert!(!events.contains(&token), "a pane token leaked into events");
    d.npc(&["pane", "close", "one"]).success();
    wait_for("the pane's process gone", || {
        (!alive(first.0)).then_some(())
    });
    assert_eq!(pane(&d, "one")["state"], "closed");
    let err = d.npc(&["pane", "send", "one", "x"]).failure();
    assert!(crate::support::stderr_of(&err).contains("npc pane open one"));
    d.npc(&["pane", "open", "one"]).success();
    let second = wait_for("pane `one` again", || pane(&d, "one")["pid"].as_u64());
    assert_ne!(second as u32, first.0);
    let err = d.npc(&["pane", "open", "nope"]).failure();
    assert!(crate::support::stderr_of(&err).contains("[panes.nope]"));
}

#[test]
fn the_plugin_sees_the_whole_message_sequence() {
    let manifest = format!(
        "version = 1\n{}{}",
        scripted_plugin("rec", ""),
        recording_pane("one", "plugin = \"rec\"\nidle_ms = 200")
    );
    let mut d = Daemon::start(&manifest);
    let opened = wait_received(&d, "rec", "pane_opened", |_| true);
    assert_eq!(opened["v"], 3);
    assert_eq!(opened["generation"], 1);
    assert_eq!(opened["title"], "one");
    let token = wait_for("the token file", || {
        let t = read(&d, "one.token");
        (t.len() == 32).then_some(t)
    });
    assert_eq!(opened["token"], token.as_str());
    // Output arrives with its escape sequences stripped.
    let out = wait_received(&d, "rec", "pane_output", |m| {
        m["text"].as_str().unwrap_or("").contains("ready")
    });
    assert!(!out["text"].as_str().unwrap().contains('\u{1b}'));
    wait_received(&d, "rec", "pane_idle", |m| {
        m["idle_ms"].as_u64() >= Some(200)
    });
    d.npc(&["pane", "send", "one", "by a person"]).success();
    wait_received(&d, "rec", "user_input", |_| true);
    // A guard-approved send_input reaches the pane once it is idle again.
    let idle_count = |d: &Daemon| {
        received(d, "rec")
            .iter()
            .filter(|m| m["event"] == "pane_idle")
            .count()
    };
    let before = idle_count(&d);
    wait_for("idle after the person typed", || {
        (idle_count(&d) > before).then_some(())
    });
    plugin_sends(
        &d,
        "rec",
        r#"{"v":3,"cmd":"send_input","token":"{token:one}","generation":{gen:one},"data":"by the plugin\r"}"#,
    );
    wait_for("the plugin's line typed", || {
        read(&d, "one.typed")
            .contains("by the plugin")
            .then_some(())
    });
    // status and attention are broadcast, cached and listed.
    let after = d.last_event_id();
    plugin_sends(
        &d,
        "rec",
        r#"{"v":3,"cmd":"status","token":"{token:one}","generation":{gen:one},"state":"needs_attention","detail":"limit","deadline_epoch":1900000000,"attempt":1}"#,
    );
    let status = d.wait_event(after, "pane.status");
    assert_eq!(status["payload"]["deadline_epoch"], 1_900_000_000i64);
    d.wait_event(after, "pane.notice");
    assert_eq!(pane(&d, "one")["status"]["state"], "needs_attention");
    // A client that attaches later is told the last report.
    let mut late = attach(&d, "one");
    let told = pipe_reader(late.stderr.take().unwrap());
    wait_output(&told, &mut Vec::new(), "reports needs_attention: limit");
    // ... and, in band as its terminal's title, every report after that.
    let shown = reader(&mut late);
    let mut seen = Vec::new();
    wait_output(
        &shown,
        &mut seen,
        "\x1b]2;npc: one [needs_attention: limit]\x07",
    );
    plugin_sends(
        &d,
        "rec",
        r#"{"v":3,"cmd":"status","token":"{token:one}","generation":{gen:one},"state":"waiting","detail":"retry\u001b[2J soon"}"#,
    );
    wait_output(
        &shown,
        &mut seen,
        "\x1b]2;npc: one [waiting: retry[2J soon]\x07",
    );
    plugin_sends(
        &d,
        "rec",
        r#"{"v":3,"cmd":"status","token":"{token:one}","generation":{gen:one},"state":"needs_attention","detail":"limit","deadline_epoch":1900000000,"attempt":1}"#,
    );
    let title = "\x1b]2;npc: one [needs_attention: limit]\x07";
    wait_for("the second report on the attached terminal", || {
        while let Ok(chunk) = shown.try_recv() {
            seen.extend(chunk);
        }
        (String::from_utf8_lossy(&seen).matches(title).count() == 2).then_some(())
    });
    late.stdin.as_mut().unwrap().write_all(&[0x1d]).unwrap();
    wait_for("the late client detached", || late.try_wait().unwrap());
    let human = crate::support::stdout_of(&d.npc(&["pane", "list"]).success());
    assert!(human.contains("needs_attention: limit"), "{human}");
    plugin_sends(
        &d,
        "rec",
        r#"{"v":3,"cmd":"attention","token":"{token:one}","generation":{gen:one}}"#,
    );
    d.wait_event(after, "pane.attention");
    // Closing the pane tells the plugin and clears the cached report.
    let after = d.last_event_id();
    d.npc(&["pane", "close", "one"]).success();
    wait_received(&d, "rec", "pane_closed", |m| m["token"] == token.as_str());
    let cancelled = d.wait_event(after, "pane.recovery");
    assert_eq!(cancelled["payload"]["state"], "cancelled");
    assert!(pane(&d, "one")["status"].is_null());
    // The daemon's stop sends `shutdown`.
    d.terminate();
    assert!(received(&d, "rec").iter().any(|m| m["event"] == "shutdown"));
}

#[test]
fn needs_attention_reaches_the_clients_of_another_repository() {
    let data = tempfile::tempdir().unwrap();
    let shared = crate::support::DaemonSetup {
        data_home: Some(data.path()),
        ..Default::default()
    };
    let manifest = format!(
        "version = 1\n{}{}",
        scripted_plugin("rec", ""),
        recording_pane("one", "plugin = \"rec\"")
    );
    let a = Daemon::start_with(&manifest, shared);
    let b = Daemon::start_with("version = 1\n", shared);
    wait_received(&a, "rec", "pane_opened", |_| true);
    let (a_after, b_after) = (a.last_event_id(), b.last_event_id());
    plugin_sends(
        &a,
        "rec",
        r#"{"v":3,"cmd":"status","token":"{token:one}","generation":{gen:one},"state":"needs_attention","detail":"limit"}"#,
    );
    a.wait_event(a_after, "pane.notice");
    let notice = b.wait_event(b_after, "notice");
    let payload = &notice["payload"];
    assert_eq!(payload["repository"], a.root().display().to_string());
    assert_eq!(payload["pane"], "one");
    assert_eq!(payload["plugin"], "rec");
    assert_eq!(payload["reason"], "needs_attention");
    // Names and the label only: the plugin's detail text stays home.
    assert!(!notice.to_string().contains("limit"), "{notice}");
    // B's own clients see it (`npc events`), and A's notice is not echoed
    // back to A once B has it.
    let listed = crate::support::stdout_of(&b.npc(&["events", "--format", "json"]).success());
    assert!(listed.contains("needs_attention"), "{listed}");
    let c = Daemon::start_with("version = 1\n", shared);
    let c_after = c.last_event_id();
    plugin_sends(
        &a,
        "rec",
        r#"{"v":3,"cmd":"attention","token":"{token:one}","generation":{gen:one}}"#,
    );
    let second = c.wait_event(c_after, "notice");
    assert_eq!(second["payload"]["reason"], "attention");
    assert!(
        a.events_after(a_after)
            .iter()
            .all(|e| e["kind"] != "notice"),
        "a repository hears its own notice back"
    );
}

#[test]
fn every_guard_refusal_is_refused_and_recorded() {
    let manifest = format!(
        r#"version = 1
{a}{b}{one}{two}{busy}
[panes.shell]
command = "sh"
args = ["-c", "exit 0"]
plugin = "a"

[panes.cli]
command = "python3"
args = ["{fake}"]
plugin = "a"
env = {{ FAKE_MODE = "exit", FAKE_DELAY = "0.1" }}
"#,
        a = scripted_plugin("a", r#"allowed_resume_flags = ["resume", "--session"]"#),
        b = scripted_plugin("b", "watch_on_signal = true"),
        one = recording_pane("one", "plugin = \"a\"\nidle_ms = 100"),
        two = recording_pane("two", "idle_ms = 100"),
        busy = r#"
[panes.busy]
command = "sh"
args = ["-c", "while :; do echo tick; sleep 0.02; done"]
plugin = "a"
"#,
        fake = fixture("fake_cli.py"),
    );
    let d = Daemon::start(&manifest);
    for pane in ["one", "busy", "cli"] {
        wait_received(&d, "a", "pane_opened", |m| m["title"] == pane);
    }
    wait_received(&d, "a", "pane_idle", |_| true);
    let two_token = wait_for("pane two's token", || {
        let t = read(&d, "two.token");
        (t.len() == 32).then_some(t)
    });
    let send = |plugin: &str, line: &str| {
        let after = d.last_event_id();
        plugin_sends(&d, plugin, line);
        after
    };
    // Stale generation.
    let after = send(
        "a",
        r#"{"v":3,"cmd":"send_input","token":"{token:one}","generation":7,"data":"x"}"#,
    );
    assert!(refusal_after(&d, after, "send_input").contains("stale"));
    // Busy pane.
    let after = send(
        "a",
        r#"{"v":3,"cmd":"send_input","token":"{token:busy}","generation":{gen:busy},"data":"x"}"#,
    );
    assert!(refusal_after(&d, after, "send_input").contains("busy"));
    // A pane the plugin does not watch (not opted in).
    let after = send(
        "a",
        &format!(r#"{{"v":3,"cmd":"send_input","token":"{two_token}","generation":1,"data":"x"}}"#),
    );
    assert!(refusal_after(&d, after, "send_input").contains("does not watch"));
    // watch_pane without watch_on_signal.
    let after = send(
        "a",
        &format!(r#"{{"v":3,"cmd":"watch_pane","token":"{two_token}"}}"#),
    );
    assert!(refusal_after(&d, after, "watch_pane").contains("watch_on_signal"));
    // A second watcher.
    let after = send(
        "b",
        &format!(
            r#"{{"v":3,"cmd":"watch_pane","token":"{}"}}"#,
            read(&d, "one.token")
        ),
    );
    assert!(refusal_after(&d, after, "watch_pane").contains("another plugin"));
    // A bare shell is never relaunched.
    wait_received(&d, "a", "pane_exited", |m| {
        received(&d, "a").iter().any(|o| {
            o["event"] == "pane_opened" && o["title"] == "shell" && o["token"] == m["token"]
        })
    });
    let after = send(
        "a",
        r#"{"v":3,"cmd":"relaunch","token":"{token:shell}","generation":{gen:shell},"resume_args":["resume","x"]}"#,
    );
    assert!(refusal_after(&d, after, "relaunch").contains("shell"));
    // Unknown flag and shell metacharacters (the fake CLI has exited and is held).
    wait_for("the fake CLI held", || {
        (pane(&d, "cli")["state"] == "held").then_some(())
    });
    let after = send(
        "a",
        r#"{"v":3,"cmd":"relaunch","token":"{token:cli}","generation":{gen:cli},"resume_args":["--dangerously-bypass"]}"#,
    );
    assert!(refusal_after(&d, after, "relaunch").contains("allowed_resume_flags"));
    let after = send(
        "a",
        r#"{"v":3,"cmd":"relaunch","token":"{token:cli}","generation":{gen:cli},"resume_args":["resume","$(touch pwned)"]}"#,
    );
    assert!(refusal_after(&d, after, "relaunch").contains("metacharacter"));
    assert!(!d.root().join("pwned").exists());
    // The budget: approvals per token and window run out.
    let mut refused = None;
    for _ in 0..12 {
        let typed = read(&d, "one.typed").lines().count();
        wait_for("pane one idle", || {
            (pane(&d, "one")["state"] == "idle").then_some(())
        });
        let after = send(
            "a",
            r#"{"v":3,"cmd":"send_input","token":"{token:one}","generation":{gen:one},"data":"again\r"}"#,
        );
        let outcome = wait_for("the input's outcome", || {
            if read(&d, "one.typed").lines().count() > typed {
                return Some(None);
            }
            d.events_after(after)
                .into_iter()
                .find(|e| e["kind"] == "pane_plugin.refused")
                .map(|e| Some(e["payload"]["reason"].as_str().unwrap().to_string()))
        });
        if let Some(reason) = outcome {
            refused = Some(reason);
            break;
        }
    }
    let reason = refused.expect("the budget ran out");
    assert!(reason.contains("budget"), "{reason}");
}

#[test]
fn oversize_and_malformed_lines_are_rejected_and_logged() {
    let manifest = format!("version = 1\n{}", scripted_plugin("rec", ""));
    let d = Daemon::start(&manifest);
    let pid = wait_for("the plugin's pid", || d.pid_of("pane_plugin.rec"));
    let cases = [
        ("x".repeat(70 * 1024), "longer than"),
        ("{not json".to_string(), "malformed"),
        (
            r#"{"v":2,"cmd":"log","level":"info","message":"old"}"#.to_string(),
            "version",
        ),
        (
            r#"{"v":3,"cmd":"exec","argv":["rm"]}"#.to_string(),
            "unknown command",
        ),
        (
            r#"{"v":3,"cmd":"relaunch","token":"t","generation":1,"resume_args":["a\nb"]}"#
                .to_string(),
            "line break",
        ),
        (
            format!(
                r#"{{"v":3,"cmd":"send_input","token":"t","generation":1,"data":"{}"}}"#,
                "y".repeat(9000)
            ),
            "over 8192",
        ),
    ];
    for (line, expected) in cases {
        let after = d.last_event_id();
        plugin_sends(&d, "rec", &line);
        let e = d.wait_event(after, "pane_plugin.rejected");
        let error = e["payload"]["error"].as_str().unwrap();
        assert!(error.contains(expected), "{error} lacks {expected}");
    }
    // The plugin still runs and is still heard.
    let after = d.last_event_id();
    plugin_sends(
        &d,
        "rec",
        r#"{"v":3,"cmd":"log","level":"warn","message":"still here"}"#,
    );
    let e = d.wait_event(after, "pane_plugin.log");
    assert_eq!(e["payload"]["message"], "still here");
    assert_eq!(d.pid_of("pane_plugin.rec"), Some(pid));
}

#[test]
fn reloads_apply_each_field_kind_by_its_rule() {
    let watched = recording_pane("one", "plugin = \"rec\"\nidle_ms = 100");
    let other = recording_pane("two", "idle_ms = 100");
    let manifest = |extra: &str, env: &str| {
        format!(
            r#"version = 1
[pane_plugins.rec]
command = "python3"
args = ["{script}"]
enabled = true
env = {{ PLUGIN_LOG = "rec.log", PLUGIN_CMDS = "rec.cmds"{env} }}
{extra}
{watched}{other}"#,
            script = fixture("scripted_plugin.py"),
        )
    };
    let d = Daemon::start(&manifest("", ""));
    wait_received(&d, "rec", "pane_opened", |_| true);
    let pid = wait_for("plugin pid", || d.pid_of("pane_plugin.rec"));
    let two = wait_for("pane two's token", || {
        let t = read(&d, "two.token");
        (t.len() == 32).then_some(t)
    });
    let watch = format!(r#"{{"v":3,"cmd":"watch_pane","token":"{two}"}}"#);
    let after = d.last_event_id();
    plugin_sends(&d, "rec", &watch);
    assert!(refusal_after(&d, after, "watch_pane").contains("watch_on_signal"));
    // watch_on_signal applies at the next decision, without a new child.
    let after = d.last_event_id();
    d.write_manifest(&manifest("watch_on_signal = true", ""));
    d.wait_event(after, "reconcile.applied");
    assert_eq!(d.pid_of("pane_plugin.rec"), Some(pid));
    let after = d.last_event_id();
    plugin_sends(&d, "rec", &watch);
    d.wait_event(after, "pane.watched");
    assert_eq!(pane(&d, "two")["watcher"], "rec");
    // A new env replaces the child; it keeps watching its panes.
    let after = d.last_event_id();
    d.write_manifest(&manifest("watch_on_signal = true", r#", EXTRA = "1""#));
    d.wait_event(after, "reconcile.applied");
    let new_pid = wait_for("a new plugin pid", || {
        d.pid_of("pane_plugin.rec").filter(|p| *p != pid)
    });
    assert!(!alive(pid) || new_pid != pid);
    assert_eq!(pane(&d, "one")["watcher"], "rec");
    assert_eq!(pane(&d, "two")["watcher"], "rec");
    // `enabled = false` releases every pane it watched.
    let after = d.last_event_id();
    d.write_manifest(&manifest("enabled = false", "").replace("enabled = true\n", ""));
    d.wait_event(after, "reconcile.applied");
    wait_for("no watcher", || {
        (pane(&d, "one")["watcher"].is_null() && pane(&d, "two")["watcher"].is_null()).then_some(())
    });
    // Panes keep running without a plugin.
    assert!(pane(&d, "one")["pid"].as_u64().is_some());
}

#[test]
fn relaunch_makes_generation_plus_one_and_a_hold_expires_after_its_ttl() {
    let manifest = format!(
        r#"version = 1
{plugin}
[panes.cli]
command = "python3"
args = ["{fake}"]
plugin = "rec"
env = {{ FAKE_MODE = "exit", FAKE_DELAY = "0.1" }}

[panes.short]
command = "python3"
args = ["{fake}", "short"]
plugin = "rec"
relaunch_ttl_ms = 300
env = {{ FAKE_MODE = "exit", FAKE_DELAY = "0.1" }}
"#,
        plugin = scripted_plugin("rec", r#"allowed_resume_flags = ["--session"]"#),
        fake = fixture("fake_cli.py"),
    );
    let d = Daemon::start(&manifest);
    let first = wait_received(&d, "rec", "pane_opened", |m| m["title"] == "cli");
    wait_for("cli held", || {
        (pane(&d, "cli")["state"] == "held").then_some(())
    });
    let old_id = pane(&d, "cli")["id"].clone();
    let after = d.last_event_id();
    plugin_sends(
        &d,
        "rec",
        r#"{"v":3,"cmd":"relaunch","token":"{token:cli}","generation":{gen:cli},"resume_args":["--session","abc"]}"#,
    );
    let relaunched = d.wait_event(after, "pane.relaunched");
    assert_eq!(relaunched["payload"]["generation"], 2);
    assert_ne!(relaunched["payload"]["id"], old_id);
    // The plugin hears of the new generation under the same token.
    let second = wait_received(&d, "rec", "pane_opened", |m| m["generation"] == 2);
    assert_eq!(second["token"], first["token"]);
    assert!(
        second["command"]
            .as_str()
            .unwrap()
            .ends_with("--session abc")
    );
    wait_for("the relaunched argv", || {
        read(&d, "argv.log")
            .contains(r#"["--session", "abc"]"#)
            .then_some(())
    });
    // A command for the old generation is stale now.
    let after = d.last_event_id();
    plugin_sends(
        &d,
        "rec",
        &format!(
            r#"{{"v":3,"cmd":"status","token":"{}","generation":1,"state":"x"}}"#,
            first["token"].as_str().unwrap()
        ),
    );
    assert!(refusal_after(&d, after, "status").contains("stale"));
    // The short hold expires: the slot is discarded and a relaunch is refused.
    let short = wait_received(&d, "rec", "pane_opened", |m| m["title"] == "short");
    wait_received(&d, "rec", "pane_closed", |m| m["token"] == short["token"]);
    d.wait_event(0, "pane.hold_expired");
    assert_eq!(pane(&d, "short")["state"], "closed");
    let after = d.last_event_id();
    plugin_sends(
        &d,
        "rec",
        &format!(
            r#"{{"v":3,"cmd":"relaunch","token":"{}","generation":1,"resume_args":["--session","x"]}}"#,
            short["token"].as_str().unwrap()
        ),
    );
    assert!(refusal_after(&d, after, "relaunch").contains("no pane"));
}

/// `npc pane attach` with pipes: keys go in, output comes out, Ctrl-] detaches.
fn attach(d: &Daemon, name: &str) -> std::process::Child {
    attach_with(d, name, &[])
}

/// [`attach`] with `flags` after the pane's name.
fn attach_with(d: &Daemon, name: &str, flags: &[&str]) -> std::process::Child {
    std::process::Command::new(npc_path())
        .args(["pane", "attach", name])
        .args(flags)
        .current_dir(d.root())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

fn reader(child: &mut std::process::Child) -> std::sync::mpsc::Receiver<Vec<u8>> {
    pipe_reader(child.stdout.take().unwrap())
}

/// Chunks read from `out` by a thread, for [`wait_output`].
fn pipe_reader(mut out: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                return;
            }
        }
    });
    rx
}

fn wait_output(rx: &std::sync::mpsc::Receiver<Vec<u8>>, seen: &mut Vec<u8>, needle: &str) {
    wait_for(&format!("`{needle}` on an attached terminal"), || {
        while let Ok(chunk) = rx.try_recv() {
            seen.extend(chunk);
        }
        String::from_utf8_lossy(seen).contains(needle).then_some(())
    });
}

#[test]
fn several_clients_attach_type_and_detach() {
    let d = Daemon::start(
        r#"version = 1
[panes.echo]
command = "cat"
"#,
    );
    wait_for("pane echo", || pane(&d, "echo")["pid"].as_u64());
    d.npc(&["pane", "send", "echo", "before attach"]).success();
    let mut a = attach(&d, "echo");
    let mut b = attach(&d, "echo");
    let (ra, rb) = (reader(&mut a), reader(&mut b));
    let (mut sa, mut sb) = (Vec::new(), Vec::new());
    // The scrollback is replayed to a client that attaches later.
    wait_output(&ra, &mut sa, "before attach");
    wait_output(&rb, &mut sb, "before attach");
    a.stdin
        .as_mut()
        .unwrap()
        .write_all(b"typed in a\r")
        .unwrap();
    wait_output(&ra, &mut sa, "typed in a");
    wait_output(&rb, &mut sb, "typed in a");
    // Ctrl-] detaches one client; the pane and the other client go on.
    a.stdin.as_mut().unwrap().write_all(&[0x1d]).unwrap();
    let status = wait_for("client a detached", || a.try_wait().unwrap());
    assert!(status.success());
    assert!(pane(&d, "echo")["pid"].as_u64().is_some());
    d.npc(&["pane", "send", "echo", "after detach"]).success();
    wait_output(&rb, &mut sb, "after detach");
    // Closing the pane ends the remaining session.
    d.npc(&["pane", "close", "echo"]).success();
    let status = wait_for("client b ended", || b.try_wait().unwrap());
    assert!(status.success());
    let err = npc()
        .current_dir(d.root())
        .args(["pane", "attach", "echo"])
        .assert()
        .failure();
    assert!(crate::support::stderr_of(&err).contains("not open"));
}

#[test]
fn untrusted_text_reaches_the_terminal_escaped_and_osc_52_only_when_asked() {
    // The pane's program writes the clipboard (OSC 52) at start and after
    // every line typed into it.
    let manifest = format!(
        r#"version = 1
{}
[panes.clip]
command = "sh"
args = ["-c", "printf 'before\\033]52;c;ZXZpbA==\\007after\\n'; while read l; do printf '\\033]52;c;%s\\007line %s\\n' \"$l\" \"$l\"; done"]
plugin = "rec"
"#,
        scripted_plugin("rec", "")
    );
    let d = Daemon::start(&manifest);
    wait_received(&d, "rec", "pane_opened", |_| true);
    // A status detail with ESC, BEL, backspace and the C1 CSI (U+009B).
    let after = d.last_event_id();
    plugin_sends(
        &d,
        "rec",
        r#"{"v":3,"cmd":"status","token":"{token:clip}","generation":{gen:clip},"state":"needs_attention","detail":"limit\u001b]52;c;ZXZpbA==\u0007\u009b2J\bok"}"#,
    );
    d.wait_event(after, "pane.status");
    let raw = |text: &str| text.contains(['\u{1b}', '\u{9b}', '\u{8}']);
    let listed = crate::support::stdout_of(&d.npc(&["pane", "list"]).success());
    assert!(
        listed.contains("[needs_attention: limit\\x1b]52;c;ZXZpbA==\\x07\\x9b2J\\x08ok]"),
        "{listed}"
    );
    assert!(!raw(&listed), "{listed:?}");
    // The event's fields: every control character escaped.
    let events = crate::support::stdout_of(&d.npc(&["events"]).success());
    assert!(
        events.contains(r#"limit\u{1b}]52;c;ZXZpbA==\u{7}\u{9b}2J\u{8}ok"#),
        "{events}"
    );
    assert!(!raw(&events), "{events:?}");
    // JSON output stays exact.
    let exact = pane(&d, "clip");
    assert_eq!(
        exact["status"]["detail"],
        "limit\u{1b}]52;c;ZXZpbA==\u{7}\u{9b}2J\u{8}ok"
    );
    // Attached terminals: OSC 52 is dropped unless `--clipboard` lets it in.
    let mut plain = attach(&d, "clip");
    let mut clipboard = attach_with(&d, "clip", &["--clipboard"]);
    let told = pipe_reader(plain.stderr.take().unwrap());
    let (rp, rc) = (reader(&mut plain), reader(&mut clipboard));
    let (mut sp, mut sc) = (Vec::new(), Vec::new());
    wait_output(&rp, &mut sp, "after");
    wait_output(&rc, &mut sc, "before\x1b]52;c;ZXZpbA==\x07after");
    d.npc(&["pane", "send", "clip", "live"]).success();
    wait_output(&rp, &mut sp, "line live");
    wait_output(&rc, &mut sc, "\x1b]52;c;live\x07line live");
    let shown = String::from_utf8_lossy(&sp);
    // What was OSC 52 is an empty OSC (`ESC ] ESC \`) for the terminal.
    assert!(shown.contains("before\x1b]\x1b\\after"), "{shown:?}");
    assert!(shown.contains("\x1b]\x1b\\line live"), "{shown:?}");
    assert!(
        !shown.contains("\x1b]52"),
        "OSC 52 reached the terminal: {shown:?}"
    );
    // The cached status the client is told on attaching is escaped too.
    wait_output(
        &told,
        &mut Vec::new(),
        "reports needs_attention: limit\\x1b]52;",
    );
    for child in [&mut plain, &mut clipboard] {
        child.stdin.as_mut().unwrap().write_all(&[0x1d]).unwrap();
        let status = wait_for("the client detached", || child.try_wait().unwrap());
        assert!(status.success());
    }
}

/// Lines of `dir`'s Rust sources (comments dropped) that contain `needle`.
fn calls(dir: &Path, needle: &str) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let p = entry.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                let body = text.split("#[cfg(test)]").next().unwrap_or("");
                for line in body.lines() {
                    let code = line.split("//").next().unwrap_or("");
                    if code.contains(needle) {
                        out.push((p.clone(), code.trim().to_string()));
                    }
                }
            }
        }
    }
    out
}

#[test]
fn nothing_but_a_guard_approval_reaches_a_pty_from_a_plugin() {
    let src = repo_root().join("src");
    let file = |p: &PathBuf| p.strip_prefix(&src).unwrap().display().to_string();
    // Only the guard makes an approval.
    for (p, line) in calls(&src, "Seal(") {
        assert_eq!(
            file(&p),
            "panes/guard.rs",
            "an approval made outside the guard: {line}"
        );
    }
    // Bytes reach a PTY through `write_pty`, called by the host's two input
    // paths only: a person's input and an approved plugin input.
    let writes: Vec<_> = calls(&src, "write_pty(")
        .into_iter()
        .filter(|(_, l)| !l.contains("fn write_pty"))
        .collect();
    assert_eq!(writes.len(), 2, "{writes:?}");
    assert!(
        writes.iter().all(|(p, _)| file(p) == "panes/host.rs"),
        "{writes:?}"
    );
    let host = std::fs::read_to_string(src.join("panes/host.rs")).unwrap();
    let mut callers: Vec<&str> = host
        .match_indices("write_pty(")
        .map(|(i, _)| {
            // The function each call sits in: the nearest `fn NAME(` above it.
            let above = &host[..i];
            let f = above.rfind("fn ").unwrap();
            above[f + 3..].split('(').next().unwrap()
        })
        .collect();
    callers.sort();
    assert_eq!(callers, ["execute", "user_input"]);
    let execute = &host[host.find("fn execute(").unwrap()..];
    let arm = execute.find("Approved::Input {").unwrap();
    let call = execute.find("write_pty(").unwrap();
    assert!(
        arm < call && !execute[arm + 1..call].contains("Approved::"),
        "only the input arm types"
    );
    // The plugin side never touches a pane, a PTY or the supervisor's PTY calls.
    for module in ["panes/plugin.rs", "panes/protocol.rs", "panes/outbox.rs"] {
        let text = std::fs::read_to_string(src.join(module)).unwrap();
        for needle in ["write_pty", "spawn_pty", "PtyControl", "Pane::", "Approved"] {
            assert!(!text.contains(needle), "{module} mentions `{needle}`");
        }
    }
    // Only the host starts pane processes (through the supervisor).
    for (p, line) in calls(&src, "spawn_pty(") {
        let f = file(&p);
        assert!(
            f == "panes/host.rs" || f.starts_with("supervisor/"),
            "{f} starts a PTY: {line}"
        );
    }
}

/// A repository with the fake CLI installed as `bin/PROGRAM` (executable).
fn repo_with_fake(program: &str, manifest: &str) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(fixture("fake_cli.py"), bin.join(program)).unwrap();
    std::fs::set_permissions(bin.join(program), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(dir.path().join("npcagent.toml"), manifest).unwrap();
    dir
}

fn recovery_plugin(env: &str) -> String {
    format!(
        r#"
[pane_plugins.recovery]
command = "{}"
enabled = true
allowed_resume_flags = ["resume", "--session"]
env = {{ {env} }}
"#,
        assert_cmd::cargo::cargo_bin("npc-recovery").display()
    )
}

#[test]
fn npc_recovery_resumes_codex_after_its_usage_limit_resets() {
    let manifest = format!(
        r#"version = 1
{}
[panes.agent]
command = "./bin/codex"
plugin = "recovery"
env = {{ FAKE_MODE = "codex", CODEX_HOME = "codex-home", FAKE_RESET_IN = "1", FAKE_DELAY = "0.3" }}
"#,
        recovery_plugin(r#"CODEX_HOME = "codex-home""#)
    );
    let repo = repo_with_fake("codex", &manifest);
    let d = Daemon::start_in(repo.path());
    let limited = wait_for("a rate_limited status", || {
        d.events()
            .into_iter()
            .find(|e| e["kind"] == "pane.status" && e["payload"]["state"] == "rate_limited")
    });
    let deadline = limited["payload"]["deadline_epoch"]
        .as_i64()
        .expect("a deadline");
    let relaunched = d.wait_event(0, "pane.relaunched");
    assert_eq!(relaunched["payload"]["generation"], 2);
    let args = relaunched["payload"]["resume_args"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(args[0], "resume");
    let session = args[1].as_str().unwrap().to_string();
    // The session is the one the fake CLI recorded in its rollout.
    let rollout = wait_for("the rollout", || {
        walk(&repo.path().join("codex-home"))
            .into_iter()
            .find(|p| p.to_string_lossy().ends_with(".jsonl"))
    });
    assert!(rollout.to_string_lossy().contains(&session));
    wait_for("codex resumed in the pane", || {
        read(&d, "argv.log")
            .contains(&format!(r#"["resume", "{session}"]"#))
            .then_some(())
    });
    // Relaunched only once the reset time had passed.
    let relaunched_at = relaunched["ts_ms"].as_i64().unwrap() / 1000;
    assert!(
        relaunched_at >= deadline,
        "relaunched at {relaunched_at}, before {deadline}"
    );
    // The hold's end clears the stale deadline; no transcript ever left the plugin.
    d.wait_event(0, "pane.recovery");
    let events = serde_json::to_string(&d.events()).unwrap();
    assert!(!events.contains("SECRET TRANSCRIPT"));
}

#[test]
fn npc_recovery_follows_opencode_status_and_resumes_its_session_after_exit() {
    opencode_recovery("", r#"NPC_RECOVERY_OPENCODE_STATUS = "oc-status.json""#, "");
}

#[test]
fn npc_recovery_asks_opencodes_own_server_for_its_status() {
    // A free loopback port for the fake OpenCode's server.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    opencode_recovery(
        &format!(r#"args = ["--port", "{port}"]"#),
        r#"OPENCODE_SERVER_PASSWORD = "pw-1""#,
        r#", OPENCODE_SERVER_PASSWORD = "pw-1""#,
    );
}

/// The fake OpenCode in a pane (`pane_extra` in its entry, `pane_env` added
/// to its env) watched by `npc-recovery` (with `plugin_env`): retrying is
/// reported with its deadline and left alone, idle after it needs a
/// person, and only the exited process is relaunched with its session.
fn opencode_recovery(pane_extra: &str, plugin_env: &str, pane_env: &str) {
    let manifest = format!(
        r#"version = 1
{}
[panes.agent]
command = "./bin/opencode"
plugin = "recovery"
idle_ms = 200
env = {{ FAKE_MODE = "opencode"{pane_env} }}
{pane_extra}
"#,
        recovery_plugin(plugin_env)
    );
    let repo = repo_with_fake("opencode", &manifest);
    let d = Daemon::start_in(repo.path());
    wait_for("pane agent", || pane(&d, "agent")["pid"].as_u64());
    let next_ms = 1_900_000_000_000i64;
    std::fs::write(
        repo.path().join("oc-status.json"),
        format!(r#"{{"ses_fake1":{{"type":"retry","attempt":3,"message":"rate limited","next":{next_ms}}}}}"#),
    )
    .unwrap();
    let retrying = wait_for("a retrying status", || {
        d.events()
            .into_iter()
            .find(|e| e["kind"] == "pane.status" && e["payload"]["state"] == "retrying")
    });
    assert_eq!(retrying["payload"]["deadline_epoch"], next_ms / 1000);
    assert_eq!(retrying["payload"]["attempt"], 3);
    // While OpenCode retries by itself the plugin does not intervene.
    assert!(!d.events().iter().any(|e| e["kind"] == "pane.relaunched"));
    // Idle after the retries: a person is needed, and every client hears it.
    std::fs::write(
        repo.path().join("oc-status.json"),
        r#"{"ses_fake1":{"type":"idle"}}"#,
    )
    .unwrap();
    wait_for("needs_attention", || {
        d.events()
            .into_iter()
            .find(|e| e["kind"] == "pane.status" && e["payload"]["state"] == "needs_attention")
    });
    d.wait_event(0, "pane.notice");
    // Only after the process exits is it relaunched with its session.
    d.npc(&["pane", "send", "agent", "quit"]).success();
    let relaunched = d.wait_event(0, "pane.relaunched");
    assert_eq!(
        relaunched["payload"]["resume_args"],
        serde_json::json!(["--session", "ses_fake1"])
    );
    wait_for("opencode resumed", || {
        read(&d, "argv.log")
            .contains(r#""--session", "ses_fake1"]"#)
            .then_some(())
    });
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out
}

#[test]
fn resume_flags_apply_at_the_next_decision_and_a_failed_successor_discards_the_hold() {
    let manifest = |flags: &str, command: &str| {
        format!(
            r#"version = 1
[pane_plugins.rec]
command = "{command}"
args = ["{script}"]
enabled = true
allowed_resume_flags = [{flags}]
env = {{ PLUGIN_LOG = "rec.log", PLUGIN_CMDS = "rec.cmds" }}

[panes.cli]
command = "python3"
args = ["{fake}"]
plugin = "rec"
env = {{ FAKE_MODE = "exit", FAKE_DELAY = "0.1" }}
"#,
            script = fixture("scripted_plugin.py"),
            fake = fixture("fake_cli.py"),
        )
    };
    let d = Daemon::start(&manifest("", "python3"));
    wait_received(&d, "rec", "pane_opened", |_| true);
    let pid = wait_for("plugin pid", || d.pid_of("pane_plugin.rec"));
    wait_for("cli held", || {
        (pane(&d, "cli")["state"] == "held").then_some(())
    });
    let relaunch = r#"{"v":3,"cmd":"relaunch","token":"{token:cli}","generation":{gen:cli},"resume_args":["--session","s1"]}"#;
    let after = d.last_event_id();
    plugin_sends(&d, "rec", relaunch);
    assert!(refusal_after(&d, after, "relaunch").contains("allowed_resume_flags"));
    // The new flags apply at the next decision; the child is not replaced.
    let after = d.last_event_id();
    d.write_manifest(&manifest(r#""--session""#, "python3"));
    d.wait_event(after, "reconcile.applied");
    assert_eq!(d.pid_of("pane_plugin.rec"), Some(pid));
    let after = d.last_event_id();
    plugin_sends(&d, "rec", relaunch);
    let e = d.wait_event(after, "pane.relaunched");
    assert_eq!(e["payload"]["generation"], 2);
    wait_for("cli held again", || {
        (pane(&d, "cli")["state"] == "held").then_some(())
    });
    // A successor that cannot start leaves no hold without an owner.
    let after = d.last_event_id();
    d.write_manifest(&manifest(r#""--session""#, "/nonexistent/npc-plugin"));
    d.wait_event(after, "reconcile.applied");
    wait_for("the hold discarded", || {
        (pane(&d, "cli")["state"] == "closed").then_some(())
    });
    let cancelled = d.wait_event(after, "pane.recovery");
    assert_eq!(cancelled["payload"]["state"], "cancelled");
}

#[test]
fn a_crashed_plugin_is_restarted_and_hears_of_its_panes_again() {
    let manifest = format!(
        "version = 1\n{}{}",
        scripted_plugin("rec", r#"restart = "always""#),
        recording_pane("one", "plugin = \"rec\"")
    );
    let d = Daemon::start(&manifest);
    let first = wait_received(&d, "rec", "pane_opened", |_| true);
    let pid = wait_for("plugin pid", || d.pid_of("pane_plugin.rec"));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let new_pid = wait_for("a restarted plugin", || {
        d.pid_of("pane_plugin.rec").filter(|p| *p != pid)
    });
    assert!(alive(new_pid));
    wait_for("pane_opened again", || {
        let opened = received(&d, "rec")
            .into_iter()
            .filter(|m| m["event"] == "pane_opened" && m["token"] == first["token"])
            .count();
        (opened >= 2).then_some(())
    });
    // The pane never stopped.
    assert!(pane(&d, "one")["pid"].as_u64().is_some());
}
