//! `npc-recovery`, the pane plugin npc ships (a second binary of this
//! crate): it recognises Codex and OpenCode from a watched pane's launch
//! command, finds the session id and the usage-limit reset time — Codex's
//! rollout JSONL under `$CODEX_HOME/sessions`, OpenCode's session status
//! (`GET /session/status` on the server OpenCode runs when its launch
//! command names `--port N`, loopback only, with basic auth from
//! `OPENCODE_SERVER_USERNAME` / `OPENCODE_SERVER_PASSWORD` when the
//! plugin's environment sets them; else the same JSON read from the file
//! named by [`OPENCODE_STATUS_ENV`]) — reports `status` with that deadline, and asks
//! for a relaunch with the provider's resume arguments (`codex resume ID`,
//! `opencode --session ID`) only after the process exited, and for Codex
//! only once the reset time has passed. It never sends transcripts or raw
//! payloads: status details are short fixed texts.
//!
//! Provider knowledge lives here, never in the host.

use std::collections::BTreeMap;
use std::io::{BufRead as _, Read as _, Seek as _, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::protocol::{self, HostEvent, LogLevel, PROTOCOL_VERSION, PluginCommand};

/// Where OpenCode's session status is read from (a file holding the JSON
/// its server answers on `GET /session/status`).
pub const OPENCODE_STATUS_ENV: &str = "NPC_RECOVERY_OPENCODE_STATUS";
/// How often provider state is looked at while a pane is watched.
pub const POLL: Duration = Duration::from_millis(250);
/// Rollout files looked at per probe (the newest).
pub const MAX_ROLLOUTS: usize = 64;
/// Bytes read from the end of a rollout for its latest rate limits.
pub const MAX_ROLLOUT_TAIL: u64 = 1024 * 1024;
/// Longest first line (`session_meta`) of a rollout that is read.
pub const MAX_META_LINE: usize = 64 * 1024;
/// Largest OpenCode status document read.
pub const MAX_STATUS_BYTES: u64 = 256 * 1024;
/// How long one look at OpenCode's server may take (connect, then each read).
pub const HTTP_TIMEOUT: Duration = Duration::from_millis(500);
/// Longest response head from OpenCode's server.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// OpenCode's basic-auth variables (as its own CLI reads them).
pub const OPENCODE_USERNAME_ENV: &str = "OPENCODE_SERVER_USERNAME";
pub const OPENCODE_PASSWORD_ENV: &str = "OPENCODE_SERVER_PASSWORD";
/// A rollout counts for a pane when it was written at most this long
/// before the pane opened.
pub const ROLLOUT_SLACK: Duration = Duration::from_secs(5);

/// The providers this plugin knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    Codex,
    OpenCode,
}

impl Provider {
    /// The provider a launch command runs, and a session id it already names.
    pub fn detect(command: &str) -> Option<(Self, Option<String>)> {
        let words: Vec<&str> = command.split_whitespace().collect();
        let program = words.first()?.rsplit('/').next()?;
        let after = |flag: &str| {
            words
                .windows(2)
                .find(|w| w[0] == flag)
                .map(|w| w[1].to_string())
        };
        match program {
            "codex" => Some((Self::Codex, after("resume"))),
            "opencode" => Some((Self::OpenCode, after("--session").or_else(|| after("-s")))),
            _ => None,
        }
    }

    /// The arguments that resume `session`.
    pub fn resume_args(self, session: &str) -> Vec<String> {
        match self {
            Self::Codex => vec!["resume".into(), session.into()],
            Self::OpenCode => vec!["--session".into(), session.into()],
        }
    }
}

/// The loopback address of the server OpenCode runs for its TUI, when its
/// launch command names one: `--port N` (N > 0) and a `--hostname` that is
/// a loopback address or absent. Any other host is never contacted.
pub fn opencode_server(command: &str) -> Option<std::net::SocketAddr> {
    let words: Vec<&str> = command.split_whitespace().collect();
    let value = |flag: &str| {
        let joined = format!("{flag}=");
        words.iter().enumerate().find_map(|(i, w)| {
            if *w == flag {
                words.get(i + 1).copied()
            } else {
                w.strip_prefix(joined.as_str())
            }
        })
    };
    let port: u16 = value("--port")?.parse().ok().filter(|p| *p > 0)?;
    let ip = match value("--hostname") {
        None | Some("localhost") => std::net::IpAddr::from([127, 0, 0, 1]),
        Some(host) => host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .ok()?,
    };
    ip.is_loopback()
        .then_some(std::net::SocketAddr::new(ip, port))
}

/// `GET path` on the loopback server at `addr` (HTTP/1.1, bounded in time
/// and size, `Content-Length` or chunked); the body of a 200 answer.
pub fn http_get(
    addr: std::net::SocketAddr,
    path: &str,
    authorization: Option<&str>,
) -> Option<Vec<u8>> {
    use std::net::TcpStream;
    if !addr.ip().is_loopback() {
        return None;
    }
    let mut stream = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT).ok()?;
    stream.set_read_timeout(Some(HTTP_TIMEOUT)).ok()?;
    stream.set_write_timeout(Some(HTTP_TIMEOUT)).ok()?;
    let auth = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: application/json\r\n{auth}Connection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).ok()?;
    let limit = MAX_HEAD_BYTES + MAX_STATUS_BYTES as usize;
    let mut data = Vec::new();
    let mut chunk = [0u8; 8192];
    let body_at = loop {
        let n = stream.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        data.extend_from_slice(&chunk[..n]);
        if let Some(i) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if data.len() > MAX_HEAD_BYTES {
            return None;
        }
    };
    let head = std::str::from_utf8(&data[..body_at])
        .ok()?
        .to_ascii_lowercase();
    let mut lines = head.split("\r\n");
    let status = lines.next()?;
    if status.split_whitespace().nth(1) != Some("200") {
        return None;
    }
    let header = |name: &str| {
        head.split("\r\n")
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim() == name)
            .map(|(_, v)| v.trim().to_string())
    };
    let complete = |data: &[u8]| -> Option<Option<Vec<u8>>> {
        let body = &data[body_at..];
        if header("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
            return dechunk(body);
        }
        let length: usize = header("content-length")?.parse().ok()?;
        if length > MAX_STATUS_BYTES as usize {
            return Some(None);
        }
        Some((body.len() >= length).then(|| body[..length].to_vec()))
    };
    loop {
        match complete(&data) {
            Some(Some(body)) => return Some(body),
            None => return None,
            Some(None) if data.len() > limit => return None,
            Some(None) => {}
        }
        let n = stream.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        data.extend_from_slice(&chunk[..n]);
    }
}

/// A chunked body: `Some(Some(body))` when complete, `Some(None)` when more
/// is needed, `None` when malformed.
fn dechunk(mut rest: &[u8]) -> Option<Option<Vec<u8>>> {
    let mut body = Vec::new();
    loop {
        let Some(end) = rest.windows(2).position(|w| w == b"\r\n") else {
            return Some(None);
        };
        let size_text = std::str::from_utf8(&rest[..end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        if size > MAX_STATUS_BYTES as usize {
            return None;
        }
        rest = &rest[end + 2..];
        if size == 0 {
            return Some(Some(body));
        }
        if rest.len() < size + 2 {
            return Some(None);
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

/// What a probe of the provider found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Finding {
    pub session: Option<String>,
    /// A usage limit (or a retry) is in force.
    pub limited: bool,
    /// When it ends (Unix seconds), if the provider says.
    pub deadline_epoch: Option<i64>,
    /// OpenCode is retrying by itself (do not intervene).
    pub retrying: bool,
    pub attempt: u32,
}

/// The rollout files of `codex_home`, newest first (bounded).
fn rollouts(codex_home: &Path) -> Vec<PathBuf> {
    let mut days = Vec::new();
    let sessions = codex_home.join("sessions");
    // sessions/YYYY/MM/DD: the newest days only.
    let mut years = sorted_dirs(&sessions);
    years.reverse();
    'outer: for y in years.iter().take(2) {
        let mut months = sorted_dirs(y);
        months.reverse();
        for m in months.iter().take(2) {
            let mut ds = sorted_dirs(m);
            ds.reverse();
            for d in ds.into_iter().take(2) {
                days.push(d);
                if days.len() >= 3 {
                    break 'outer;
                }
            }
        }
    }
    let mut files: Vec<PathBuf> = days
        .iter()
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("rollout-") && n.ends_with(".jsonl"))
        })
        .collect();
    files.sort();
    files.reverse();
    files.truncate(MAX_ROLLOUTS);
    files
}

fn sorted_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

/// The session id and cwd of a rollout (its `session_meta` line).
fn rollout_meta(path: &Path) -> Option<(String, String)> {
    use crate::stdx::lines::{BlockingLineReader, Line, Overlong, Splitter};
    let file = std::fs::File::open(path).ok()?;
    let mut lines = BlockingLineReader::new(file, Splitter::new(MAX_META_LINE, Overlong::Stop));
    let Ok(Some(Line::Line(line))) = lines.next_line() else {
        return None;
    };
    let v: serde_json::Value = serde_json::from_slice(&line).ok()?;
    if v["type"] != "session_meta" {
        return None;
    }
    Some((
        v["payload"]["id"].as_str()?.to_string(),
        v["payload"]["cwd"].as_str()?.to_string(),
    ))
}

/// The latest usage-limit state in a rollout's tail.
pub fn rollout_limits(path: &Path) -> (bool, Option<i64>) {
    let Ok(mut file) = std::fs::File::open(path) else {
        return (false, None);
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(MAX_ROLLOUT_TAIL);
    if file.seek(std::io::SeekFrom::Start(start)).is_err() {
        return (false, None);
    }
    let mut tail = String::new();
    let _ = file.take(MAX_ROLLOUT_TAIL).read_to_string(&mut tail);
    rollout_limits_in(&tail)
}

/// [`rollout_limits`] over rollout text.
pub fn rollout_limits_in(text: &str) -> (bool, Option<i64>) {
    let mut limited = false;
    let mut deadline = None;
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["type"] != "event_msg" {
            continue;
        }
        let payload = &v["payload"];
        match payload["type"].as_str() {
            Some("token_count") => {
                let Some(limits) = payload["rate_limits"].as_object() else {
                    continue;
                };
                let stamp = v["timestamp"]
                    .as_str()
                    .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                    .map(|t| t.timestamp());
                limited = false;
                deadline = None;
                for window in limits.values() {
                    if window["used_percent"].as_f64().unwrap_or(0.0) < 100.0 {
                        continue;
                    }
                    limited = true;
                    let reset = window["resets_at"]
                        .as_i64()
                        .or_else(|| Some(stamp? + window["resets_in_seconds"].as_i64()?));
                    // The latest of the exhausted windows' resets.
                    deadline = deadline.max(reset);
                }
            }
            Some("error") => {
                let message = payload["message"].as_str().unwrap_or("").to_lowercase();
                if message.contains("usage limit") {
                    limited = true;
                }
            }
            _ => {}
        }
    }
    (limited, deadline)
}

/// Codex: the one rollout of this pane (same cwd, written since it opened).
fn probe_codex(codex_home: &Path, cwd: &str, since: SystemTime, known: Option<&str>) -> Finding {
    let since = since.checked_sub(ROLLOUT_SLACK).unwrap_or(UNIX_EPOCH);
    let mut matches = Vec::new();
    for path in rollouts(codex_home) {
        let fresh = std::fs::metadata(&path)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t >= since);
        let Some((id, dir)) = rollout_meta(&path) else {
            continue;
        };
        if known == Some(id.as_str()) || (known.is_none() && fresh && dir == cwd) {
            matches.push((id, path));
        }
    }
    // An ambiguous session is never guessed.
    let [(id, path)] = matches.as_slice() else {
        return Finding::default();
    };
    let (limited, deadline_epoch) = rollout_limits(path);
    Finding {
        session: Some(id.clone()),
        limited,
        deadline_epoch,
        ..Finding::default()
    }
}

/// OpenCode: the session status document.
pub fn opencode_finding(status: &serde_json::Value, known: Option<&str>) -> Finding {
    let Some(map) = status.as_object() else {
        return Finding::default();
    };
    let session = match known {
        Some(k) => Some(k.to_string()),
        None if map.len() == 1 => map.keys().next().cloned(),
        None => None,
    };
    let Some(session) = session else {
        return Finding::default();
    };
    let entry = &map.get(&session).cloned().unwrap_or_default();
    let retrying = entry["type"] == "retry";
    Finding {
        session: Some(session),
        limited: retrying,
        retrying,
        deadline_epoch: retrying
            .then(|| entry["next"].as_i64().map(|ms| ms / 1000))
            .flatten(),
        attempt: entry["attempt"].as_u64().unwrap_or(0) as u32,
    }
}

fn probe_opencode(
    server: Option<std::net::SocketAddr>,
    authorization: Option<&str>,
    status_file: Option<&Path>,
    known: Option<&str>,
) -> Finding {
    if let Some(addr) = server {
        return http_get(addr, "/session/status", authorization)
            .and_then(|body| serde_json::from_slice(&body).ok())
            .map_or_else(Finding::default, |status| opencode_finding(&status, known));
    }
    let Some(path) = status_file else {
        return Finding::default();
    };
    let mut text = String::new();
    let read =
        std::fs::File::open(path).and_then(|f| f.take(MAX_STATUS_BYTES).read_to_string(&mut text));
    if read.is_err() {
        return Finding::default();
    }
    opencode_finding(&serde_json::from_str(&text).unwrap_or_default(), known)
}

/// One watched pane.
#[derive(Debug)]
struct Watched {
    generation: u64,
    provider: Provider,
    /// OpenCode's server, when the launch command names one.
    server: Option<std::net::SocketAddr>,
    cwd: String,
    opened: SystemTime,
    live: bool,
    idle: bool,
    finding: Finding,
    /// Was limited or retrying at some point in this generation.
    was_limited: bool,
    /// What was last reported: (state, deadline).
    reported: Option<(String, Option<i64>)>,
    relaunch_sent: bool,
}

/// The plugin's state and where it writes.
pub struct Plugin<W: Write> {
    out: W,
    codex_home: PathBuf,
    opencode_status: Option<PathBuf>,
    /// `Basic …` for OpenCode's server, from the plugin's environment.
    opencode_auth: Option<String>,
    panes: BTreeMap<String, Watched>,
}

impl<W: Write> std::fmt::Debug for Plugin<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("panes", &self.panes.len())
            .finish_non_exhaustive()
    }
}

fn now_epoch() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

impl<W: Write> Plugin<W> {
    pub fn new(out: W, codex_home: PathBuf, opencode_status: Option<PathBuf>) -> Self {
        Self {
            out,
            codex_home,
            opencode_status,
            opencode_auth: None,
            panes: BTreeMap::new(),
        }
    }

    /// Authenticate to OpenCode's server as `username` with `password`.
    pub fn with_opencode_auth(mut self, username: &str, password: &str) -> Self {
        use base64::Engine as _;
        let pair = format!("{username}:{password}");
        self.opencode_auth = Some(format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        ));
        self
    }

    /// The plugin as `npc-recovery` runs it: `$CODEX_HOME` (or `~/.codex`)
    /// and [`OPENCODE_STATUS_ENV`].
    pub fn from_env(out: W) -> Self {
        let codex_home = std::env::var_os("CODEX_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".codex")))
            .unwrap_or_else(|| PathBuf::from(".codex"));
        let status = std::env::var_os(OPENCODE_STATUS_ENV).map(PathBuf::from);
        let plugin = Self::new(out, codex_home, status);
        match std::env::var(OPENCODE_PASSWORD_ENV) {
            Ok(password) if !password.is_empty() => {
                let username = std::env::var(OPENCODE_USERNAME_ENV)
                    .ok()
                    .filter(|u| !u.is_empty())
                    .unwrap_or_else(|| "opencode".to_string());
                plugin.with_opencode_auth(&username, &password)
            }
            _ => plugin,
        }
    }

    fn send(&mut self, command: &PluginCommand) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(command).map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.out.write_all(&line)?;
        self.out.flush()
    }

    fn log(&mut self, level: LogLevel, message: &str) -> std::io::Result<()> {
        self.send(&PluginCommand::Log {
            v: PROTOCOL_VERSION,
            level,
            message: message.to_string(),
        })
    }

    /// Handle one host line. `Ok(false)` on `shutdown`.
    pub fn handle_line(&mut self, line: &str) -> std::io::Result<bool> {
        if line.trim().is_empty() || line.len() > protocol::MAX_LINE_BYTES {
            return Ok(true);
        }
        let event: HostEvent = match serde_json::from_str(line) {
            Ok(e) => e,
            Err(_) => {
                // Another version or a newer event: say so, act on nothing.
                self.log(
                    LogLevel::Warn,
                    "npc-recovery ignored a host line it does not understand",
                )?;
                return Ok(true);
            }
        };
        match event {
            HostEvent::Shutdown { .. } => return Ok(false),
            HostEvent::PaneOpened {
                v,
                token,
                generation,
                command,
                cwd,
                ..
            } if v == PROTOCOL_VERSION => {
                let Some((provider, session)) = command.as_deref().and_then(Provider::detect)
                else {
                    self.panes.remove(&token);
                    return Ok(true);
                };
                let server = (provider == Provider::OpenCode)
                    .then(|| command.as_deref().and_then(opencode_server))
                    .flatten();
                self.panes.insert(
                    token,
                    Watched {
                        generation,
                        provider,
                        server,
                        cwd,
                        opened: SystemTime::now(),
                        live: true,
                        idle: false,
                        finding: Finding {
                            session,
                            ..Finding::default()
                        },
                        was_limited: false,
                        reported: None,
                        relaunch_sent: false,
                    },
                );
            }
            HostEvent::PaneOutput { token, .. } | HostEvent::UserInput { token, .. } => {
                if let Some(p) = self.panes.get_mut(&token) {
                    p.idle = false;
                }
            }
            HostEvent::PaneIdle { token, .. } => {
                if let Some(p) = self.panes.get_mut(&token) {
                    p.idle = true;
                }
            }
            HostEvent::PaneExited { token, .. } => {
                if let Some(p) = self.panes.get_mut(&token) {
                    p.live = false;
                }
            }
            HostEvent::PaneClosed { token, .. } => {
                self.panes.remove(&token);
            }
            _ => {}
        }
        self.tick()?;
        Ok(true)
    }

    /// Look at every watched pane's provider and act.
    pub fn tick(&mut self) -> std::io::Result<()> {
        let tokens: Vec<String> = self.panes.keys().cloned().collect();
        for token in tokens {
            self.check(&token)?;
        }
        Ok(())
    }

    fn check(&mut self, token: &str) -> std::io::Result<()> {
        let Some(p) = self.panes.get(token) else {
            return Ok(());
        };
        if p.relaunch_sent {
            return Ok(());
        }
        let known = p.finding.session.clone();
        let finding = match p.provider {
            Provider::Codex => probe_codex(&self.codex_home, &p.cwd, p.opened, known.as_deref()),
            Provider::OpenCode => probe_opencode(
                p.server,
                self.opencode_auth.as_deref(),
                self.opencode_status.as_deref(),
                known.as_deref(),
            ),
        };
        let p = self.panes.get_mut(token).expect("looked up above");
        if finding.session.is_some() {
            p.finding = finding;
        }
        p.was_limited |= p.finding.limited;
        let (generation, provider) = (p.generation, p.provider);
        let f = p.finding.clone();
        // What to report now.
        let report = if f.retrying {
            Some(("retrying", "the provider is retrying by itself"))
        } else if f.limited && p.live {
            Some(("rate_limited", "usage limit reached"))
        } else if p.was_limited && p.live && p.idle {
            Some((crate::panes::NEEDS_ATTENTION, "idle after a usage limit"))
        } else if f.limited && !p.live {
            Some(("waiting_for_reset", "will resume when the limit resets"))
        } else {
            None
        };
        if let Some((state, detail)) = report {
            let key = (state.to_string(), f.deadline_epoch);
            if p.reported.as_ref() != Some(&key) {
                p.reported = Some(key);
                let command = PluginCommand::Status {
                    v: PROTOCOL_VERSION,
                    token: token.to_string(),
                    generation,
                    state: state.to_string(),
                    detail: Some(detail.to_string()),
                    deadline_epoch: f.deadline_epoch,
                    attempt: f.attempt,
                };
                self.send(&command)?;
            }
        }
        // Relaunch only after the process exited, a limit was seen, the
        // session is known, and (when the provider says when) it has reset.
        let p = &self.panes[token];
        let due = f.deadline_epoch.is_none_or(|d| now_epoch() >= d);
        if !p.live
            && p.was_limited
            && due
            && !f.retrying
            && let Some(session) = &f.session
        {
            let command = PluginCommand::Relaunch {
                v: PROTOCOL_VERSION,
                token: token.to_string(),
                generation,
                resume_args: provider.resume_args(session),
            };
            if let Some(p) = self.panes.get_mut(token) {
                p.relaunch_sent = true;
            }
            self.send(&command)?;
        }
        Ok(())
    }

    /// Serve the protocol on stdin/stdout until `shutdown` or end of input.
    pub fn run(mut self, input: impl std::io::Read + Send + 'static) -> std::io::Result<()> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<String>(256);
        std::thread::spawn(move || {
            let reader = std::io::BufReader::new(input);
            for line in reader.split(b'\n') {
                let Ok(line) = line else { return };
                if tx
                    .send(String::from_utf8_lossy(&line).into_owned())
                    .is_err()
                {
                    return;
                }
            }
        });
        loop {
            match rx.recv_timeout(POLL) {
                Ok(line) => {
                    if !self.handle_line(&line)? {
                        return Ok(());
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => self.tick()?,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/panes")
            .join(name)
    }

    #[test]
    fn opencode_servers_are_taken_from_the_launch_command_on_loopback_only() {
        let addr = |s: &str| s.parse::<std::net::SocketAddr>().ok();
        assert_eq!(
            opencode_server("opencode --port 4096"),
            addr("127.0.0.1:4096")
        );
        assert_eq!(
            opencode_server("opencode --port=4096 --hostname ::1"),
            addr("[::1]:4096")
        );
        assert_eq!(
            opencode_server("opencode --hostname localhost --port 7"),
            addr("127.0.0.1:7")
        );
        assert_eq!(opencode_server("opencode"), None);
        assert_eq!(opencode_server("opencode --port 0"), None);
        assert_eq!(opencode_server("opencode --port x"), None);
        assert_eq!(
            opencode_server("opencode --port 4096 --hostname 0.0.0.0"),
            None
        );
        assert_eq!(
            opencode_server("opencode --port 4096 --hostname example.com"),
            None
        );
        assert_eq!(
            opencode_server("opencode --port 4096 --hostname 10.0.0.1"),
            None
        );
    }

    /// A one-shot loopback server answering every connection with `answer`.
    fn serve(answer: Vec<u8>) -> std::net::SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut request = [0u8; 4096];
                let _ = stream.read(&mut request);
                let _ = stream.write_all(&answer);
                // Like OpenCode's server: the connection stays open.
                std::thread::sleep(HTTP_TIMEOUT * 4);
            }
        });
        addr
    }

    #[test]
    fn status_is_read_over_http_with_a_length_or_in_chunks_and_bounded() {
        let plain = serve(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
                .to_vec(),
        );
        assert_eq!(
            http_get(plain, "/session/status", None).as_deref(),
            Some(&b"{}"[..])
        );
        let chunked = serve(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n5;x=y\r\n\":1}\n\r\n0\r\n\r\n".to_vec());
        assert_eq!(
            http_get(chunked, "/", None).as_deref(),
            Some(&b"{\"a\":1}\n"[..])
        );
        let refused = serve(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n".to_vec());
        assert_eq!(http_get(refused, "/", None), None);
        let huge = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
            MAX_STATUS_BYTES + 1
        );
        assert_eq!(http_get(serve(huge.into_bytes()), "/", None), None);
        let endless_head = serve(vec![b'x'; MAX_HEAD_BYTES * 2]);
        assert_eq!(http_get(endless_head, "/", None), None);
        // Short of its length: the wait is bounded by the timeout.
        let short = serve(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}".to_vec());
        assert_eq!(http_get(short, "/", None), None);
        let bad_chunk =
            serve(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n".to_vec());
        assert_eq!(http_get(bad_chunk, "/", None), None);
        // Nobody listening.
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        assert_eq!(http_get(closed, "/", None), None);
    }

    #[test]
    fn providers_are_recognised_from_the_launch_command() {
        assert_eq!(
            Provider::detect("/usr/bin/codex --model o3"),
            Some((Provider::Codex, None))
        );
        assert_eq!(
            Provider::detect("codex resume abc"),
            Some((Provider::Codex, Some("abc".into())))
        );
        assert_eq!(
            Provider::detect("opencode --session ses_1"),
            Some((Provider::OpenCode, Some("ses_1".into())))
        );
        assert_eq!(Provider::detect("claude"), None);
        assert_eq!(Provider::Codex.resume_args("x"), ["resume", "x"]);
        assert_eq!(Provider::OpenCode.resume_args("x"), ["--session", "x"]);
    }

    #[test]
    fn a_recorded_codex_rollout_gives_the_limit_and_its_reset() {
        let text = std::fs::read_to_string(fixture("codex-rollout-limit.jsonl")).unwrap();
        assert_eq!(rollout_limits_in(&text), (true, Some(1_764_520_200)));
        // A later snapshot under the limit clears it.
        let cleared = format!(
            "{text}{}\n",
            r#"{"timestamp":"2025-11-30T16:00:00Z","type":"event_msg","payload":{"type":"token_count","rate_limits":{"primary":{"used_percent":3.0,"window_minutes":300,"resets_at":1764538000}}}}"#
        );
        assert_eq!(rollout_limits_in(&cleared), (false, None));
        // Older CLIs give seconds from the event instead of a time.
        let relative = r#"{"timestamp":"2025-11-30T10:00:00Z","type":"event_msg","payload":{"type":"token_count","rate_limits":{"primary":{"used_percent":100.0,"window_minutes":300,"resets_in_seconds":60}}}}"#;
        assert_eq!(rollout_limits_in(relative), (true, Some(1_764_496_860)));
    }

    #[test]
    fn a_recorded_opencode_status_gives_the_retry_and_its_deadline() {
        let status: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(fixture("opencode-session-status.json")).unwrap(),
        )
        .unwrap();
        let f = opencode_finding(&status, None);
        assert_eq!(f.session.as_deref(), Some("ses_52f0a1b2c3d4"));
        assert!(f.retrying && f.limited);
        assert_eq!(f.deadline_epoch, Some(1_764_520_200));
        assert_eq!(f.attempt, 2);
        let two = serde_json::json!({"a": {"type": "idle"}, "b": {"type": "busy"}});
        assert_eq!(
            opencode_finding(&two, None).session,
            None,
            "ambiguous: never guessed"
        );
    }

    #[test]
    fn codex_relaunches_only_after_exit_and_reset_and_never_sends_the_transcript() {
        let home = tempfile::tempdir().unwrap();
        let day = home.path().join("sessions/2025/11/30");
        std::fs::create_dir_all(&day).unwrap();
        let reset = now_epoch() - 1;
        let rollout = std::fs::read_to_string(fixture("codex-rollout-limit.jsonl"))
            .unwrap()
            .replace("1764520200", &reset.to_string())
            .replace("/work/repo", "/r");
        std::fs::write(day.join("rollout-2025-11-30T10-00-00-x.jsonl"), rollout).unwrap();
        let mut out = Vec::new();
        {
            let mut p = Plugin::new(&mut out, home.path().to_path_buf(), None);
            p.handle_line(r#"{"event":"pane_opened","v":3,"token":"t","generation":1,"command":"codex","cwd":"/r"}"#).unwrap();
            p.handle_line(r#"{"event":"pane_idle","v":3,"token":"t","generation":1,"idle_ms":9}"#)
                .unwrap();
            p.handle_line(r#"{"event":"pane_exited","v":3,"token":"t","generation":1}"#)
                .unwrap();
        }
        let text = String::from_utf8(out).unwrap();
        let sent: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(sent[0]["cmd"], "status");
        assert_eq!(sent[0]["state"], "rate_limited");
        assert_eq!(sent[0]["deadline_epoch"], reset);
        let relaunch = sent
            .iter()
            .find(|c| c["cmd"] == "relaunch")
            .expect("a relaunch");
        assert_eq!(
            relaunch["resume_args"],
            serde_json::json!(["resume", "019a7c4e-5d2b-7f10-a3c1-2b9e8d0f4a11"])
        );
        assert!(!text.contains("TRANSCRIPT"), "{text}");
        assert_eq!(sent.iter().filter(|c| c["cmd"] == "relaunch").count(), 1);
    }
}
