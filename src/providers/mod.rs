//! Agent CLI providers: how to launch Claude Code, Codex, Gemini CLI and
//! OpenCode headless with structured output ([`launch_plan`]), and how to
//! read what they print ([`Parser`] → [`AgentEvent`]).
//!
//! Each provider declares a detection strategy chain ([`detection_chain`]):
//!
//! | provider | chain |
//! |---|---|
//! | `claude_code` | `native_stream_json` → `capture_diff_fallback` → `regex_fallback` |
//! | `codex` | `native_json` → `capture_diff_fallback` → `regex_fallback` |
//! | `gemini_cli` | `capture_diff_fallback` → `probe_on_stale` |
//! | `opencode` | `native_ndjson` → `capture_diff_fallback` |
//!
//! The `native_*` strategies read the provider's JSON lines.
//! `capture_diff_fallback` reads them too, and when it is the last strategy
//! left it also passes every other line on as text: `agent.message`, or
//! `agent.idle` for a line that is one of the [`IDLE_MARKERS`]. While a
//! JSON-reading strategy has a fallback after it and a fixture baseline is
//! loaded, a drift guard ([`drift`]) compares the shape of the recent lines
//! with the newest recorded fixture; below [`DRIFT_THRESHOLD`] the parser
//! emits `cli_detection.drift_detected` and moves one step down the chain.
//! Until the guard's first verdict (after [`DRIFT_MIN_LINES`] lines, or at
//! the end of output) a line the strategy cannot read is held back together
//! with everything after it, so that a switch re-reads those lines with the
//! next strategy instead of losing them; lines read before that are
//! delivered at once. `regex_fallback` reads `[ASSISTANT]`-style markers;
//! `probe_on_stale` reads an interactive screen, idle by [`IDLE_MARKERS`],
//! and [`Parser::needs_probe`] tells the runner when output has gone stale
//! (advisory: the parser never writes to the agent; `npc run` sends the
//! probe, a newline on the agent's stdin, and records whether output
//! followed).
//!
//! Parsing is incremental and total: feed any bytes, in any chunks; bad
//! lines become `agent.error` events and parsing goes on.

pub mod acp;
mod claude;
mod codex;
pub mod drift;
mod event;
mod gemini;
pub mod launch;
mod native;
mod opencode;
pub mod resume;
pub mod similarity;
pub mod text;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::model::ProviderKind;

pub use drift::{
    Baseline, DRIFT_MIN_LINES, DRIFT_THRESHOLD, DRIFT_WINDOW_LINES, EMBEDDED_FIXTURES,
    EmbeddedFixture, FixtureError, Guard,
};
pub use event::{AgentEvent, ErrorKind};
pub use launch::{
    LaunchError, LaunchPlan, LaunchRequest, McpHandoff, OPENCODE_PERMISSION_ENV, RunMcp, RunPolicy,
    launch_plan, mcp_handoff,
};
pub use native::Read;
pub use similarity::{similarity, str_similarity};
pub use text::IDLE_MARKERS;

use crate::stdx::lines::{Overlong, Piece, Splitter};
use native::NativeState;

/// Longest output line a parser accepts; longer lines are skipped with an
/// `agent.error` of kind `line_too_long`.
pub const MAX_LINE_BYTES: usize = 8 * 1024 * 1024;
/// How much of a bad line is quoted in its `agent.error` message.
pub const ERROR_PREVIEW_BYTES: usize = 200;
/// Silence after which an agent that is not idle counts as stale and
/// [`Parser::needs_probe`] says so.
pub const STALE_AFTER: Duration = Duration::from_secs(30);

pub use crate::event::Strategy;

impl Strategy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NativeStreamJson => "native_stream_json",
            Self::NativeJson => "native_json",
            Self::NativeNdjson => "native_ndjson",
            Self::CaptureDiffFallback => "capture_diff_fallback",
            Self::RegexFallback => "regex_fallback",
            Self::ProbeOnStale => "probe_on_stale",
        }
    }

    /// Does this strategy read the provider's JSON lines?
    pub fn reads_json(self) -> bool {
        !matches!(self, Self::RegexFallback | Self::ProbeOnStale)
    }
}

/// The detection strategy chain of a provider, first choice first.
pub fn detection_chain(kind: ProviderKind) -> &'static [Strategy] {
    use Strategy::*;
    match kind {
        ProviderKind::ClaudeCode => &[NativeStreamJson, CaptureDiffFallback, RegexFallback],
        ProviderKind::Codex => &[NativeJson, CaptureDiffFallback, RegexFallback],
        ProviderKind::GeminiCli => &[CaptureDiffFallback, ProbeOnStale],
        ProviderKind::Opencode => &[NativeNdjson, CaptureDiffFallback],
    }
}

/// The fixtures in the source tree (`fixtures/clis`), for tests and
/// benchmarks only: the binary reads its baselines from the copies
/// embedded at build time ([`Parser::embedded`]).
pub fn source_fixtures_root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/clis"))
}

/// A line held back until the drift guard's first verdict.
#[derive(Debug)]
struct Held {
    line: Vec<u8>,
    at_end: bool,
}

/// An incremental reader of one agent process's output.
#[derive(Debug)]
pub struct Parser {
    kind: ProviderKind,
    chain: &'static [Strategy],
    active: usize,
    max_line: usize,
    stdout: Splitter,
    stderr: Splitter,
    guard: Option<Guard>,
    held: Vec<Held>,
    native: NativeState,
    pending: Vec<AgentEvent>,
    created: Instant,
    last_output: Option<Instant>,
    idle: bool,
    probe_sent: Option<Instant>,
    stale_after: Duration,
}

impl Parser {
    /// A parser for `kind`. With `fixtures_root`, the newest fixture under
    /// `<root>/<kind>/<version>/` arms the drift guard; a fixture directory
    /// that cannot be read is reported as an `agent.error` of kind
    /// `detection` with the first events, and the guard stays off.
    pub fn new(kind: ProviderKind, fixtures_root: Option<&Path>) -> Self {
        let (baseline, pending) = match fixtures_root.map(|root| Baseline::load(root, kind)) {
            None | Some(Ok(None)) => (None, Vec::new()),
            Some(Ok(Some(b))) => (Some(b), Vec::new()),
            Some(Err(e)) => (
                None,
                vec![AgentEvent::error(
                    ErrorKind::Detection,
                    format!("drift detection is off: {e}"),
                )],
            ),
        };
        let mut parser = Self::with_baseline(kind, baseline);
        parser.pending = pending;
        parser
    }

    /// A parser whose drift guard compares with the fixtures embedded in the
    /// binary (what `npc run` uses, wherever `npc` is installed).
    pub fn embedded(kind: ProviderKind) -> Self {
        Self::with_baseline(kind, Baseline::embedded(kind))
    }

    /// A parser with an explicit baseline (`None`: no drift guard).
    pub fn with_baseline(kind: ProviderKind, baseline: Option<Baseline>) -> Self {
        Self {
            kind,
            chain: detection_chain(kind),
            active: 0,
            max_line: MAX_LINE_BYTES,
            stdout: line_splitter(MAX_LINE_BYTES),
            stderr: line_splitter(MAX_LINE_BYTES),
            guard: baseline.map(Guard::new),
            held: Vec::new(),
            native: NativeState::default(),
            pending: Vec::new(),
            created: Instant::now(),
            last_output: None,
            idle: false,
            probe_sent: None,
            stale_after: STALE_AFTER,
        }
    }

    /// Count the agent as stale after `quiet` of silence instead of
    /// [`STALE_AFTER`].
    pub fn with_stale_after(mut self, quiet: Duration) -> Self {
        self.stale_after = quiet;
        self
    }

    /// Use a different line bound (before feeding anything).
    pub fn with_line_limit(mut self, max_line: usize) -> Self {
        self.max_line = max_line;
        self.stdout = line_splitter(max_line);
        self.stderr = line_splitter(max_line);
        self
    }

    pub fn kind(&self) -> ProviderKind {
        self.kind
    }

    /// The strategy reading output now.
    pub fn strategy(&self) -> Strategy {
        self.chain[self.active]
    }

    /// The fixture version the drift guard compares with, if armed.
    pub fn baseline_version(&self) -> Option<&str> {
        self.guard.as_ref().map(|g| g.baseline().version.as_str())
    }

    /// Feed a chunk of the child's stdout.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<AgentEvent> {
        self.feed_at(chunk, Instant::now())
    }

    /// [`Parser::feed`] with an explicit clock, for stale detection.
    pub fn feed_at(&mut self, chunk: &[u8], now: Instant) -> Vec<AgentEvent> {
        let mut out = std::mem::take(&mut self.pending);
        if !chunk.is_empty() {
            self.last_output = Some(now);
        }
        let mut splitter = std::mem::replace(&mut self.stdout, line_splitter(0));
        splitter.feed(chunk, |piece| self.on_piece(piece, false, &mut out));
        self.stdout = splitter;
        self.track_idle(&out);
        out
    }

    /// Feed a chunk of the child's stderr: each line becomes an
    /// `agent.error` of kind `stderr`.
    pub fn feed_stderr(&mut self, chunk: &[u8]) -> Vec<AgentEvent> {
        self.feed_stderr_at(chunk, Instant::now())
    }

    pub fn feed_stderr_at(&mut self, chunk: &[u8], now: Instant) -> Vec<AgentEvent> {
        let mut out = std::mem::take(&mut self.pending);
        if !chunk.is_empty() {
            self.last_output = Some(now);
        }
        self.stderr
            .feed(chunk, |piece| stderr_piece(piece, &mut out));
        out
    }

    /// The child's output ended: read the unterminated rest and let the
    /// drift guard decide on whatever it has seen.
    pub fn finish(&mut self) -> Vec<AgentEvent> {
        let mut out = std::mem::take(&mut self.pending);
        let mut splitter = std::mem::replace(&mut self.stdout, line_splitter(0));
        if let Some(piece) = splitter.finish() {
            self.on_piece(piece, true, &mut out);
        }
        self.stdout = splitter;
        self.decide(true, &mut out);
        if let Some(piece) = self.stderr.finish() {
            stderr_piece(piece, &mut out);
        }
        self.track_idle(&out);
        out
    }

    /// Does this provider's chain have `probe_on_stale` (so a runner keeps
    /// the agent's stdin open to probe it)?
    pub fn probes(&self) -> bool {
        self.chain.contains(&Strategy::ProbeOnStale)
    }

    /// When the agent will count as stale: its last output (or the parser's
    /// creation) plus the stale time, unless it is idle or was probed since
    /// that output. `None` for providers that are never probed.
    pub fn probe_due(&self) -> Option<Instant> {
        if !self.probes() || self.idle {
            return None;
        }
        let since = self.last_output.unwrap_or(self.created);
        if self.probe_sent.is_some_and(|p| p >= since) {
            return None;
        }
        Some(since + self.stale_after)
    }

    /// Advisory stale detection for providers whose chain has
    /// `probe_on_stale`: true when the agent is not idle, has been silent
    /// for [`STALE_AFTER`] (or [`Parser::with_stale_after`]), and no probe
    /// was recorded since its last output. The runner decides whether to
    /// send a probe (and then calls [`Parser::probe_sent`]).
    pub fn needs_probe(&self, now: Instant) -> bool {
        self.probe_due().is_some_and(|due| now >= due)
    }

    /// The last output the agent wrote (stdout or stderr).
    pub fn last_output(&self) -> Option<Instant> {
        self.last_output
    }

    /// Record that the runner probed the agent at `now`.
    pub fn probe_sent(&mut self, now: Instant) {
        self.probe_sent = Some(now);
    }

    /// Has the agent said it is idle since its last other output?
    pub fn is_idle(&self) -> bool {
        self.idle
    }

    fn track_idle(&mut self, out: &[AgentEvent]) {
        for e in out {
            match e {
                AgentEvent::Idle { .. } => self.idle = true,
                AgentEvent::Message { .. }
                | AgentEvent::ToolCall { .. }
                | AgentEvent::ToolResult { .. }
                | AgentEvent::Started { .. } => self.idle = false,
                _ => {}
            }
        }
    }

    fn guard_armed(&self) -> bool {
        self.guard.is_some()
            && self.strategy().reads_json()
            && self.active + 1 < self.chain.len()
            && self.chain[self.active..].contains(&Strategy::CaptureDiffFallback)
    }

    fn on_piece(&mut self, piece: Piece<'_>, at_end: bool, out: &mut Vec<AgentEvent>) {
        match piece {
            Piece::TooLong { bytes } => out.push(AgentEvent::error(
                ErrorKind::LineTooLong,
                format!(
                    "skipped a {} output line of {bytes} bytes, longer than the {} byte limit",
                    self.kind.as_str(),
                    self.max_line
                ),
            )),
            Piece::Line(line) | Piece::Truncated(line) => {
                self.read_line(line, at_end, true, out);
                self.decide(false, out);
            }
        }
    }

    /// Read one line with the active strategy. `hold`: may the line be held
    /// back for the drift guard's verdict (and counted by the guard)?
    fn read_line(&mut self, line: &[u8], at_end: bool, hold: bool, out: &mut Vec<AgentEvent>) {
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        let strategy = self.strategy();
        if !strategy.reads_json() {
            let text = String::from_utf8_lossy(line);
            match strategy {
                Strategy::RegexFallback => text::regex_line(&text, out),
                _ => text::screen_line(&text, out),
            }
            return;
        }
        let parsed: Result<Value, ErrorKind> = match std::str::from_utf8(line) {
            Err(_) => Err(ErrorKind::InvalidUtf8),
            Ok(s) => serde_json::from_str(s).map_err(|_| {
                if at_end {
                    ErrorKind::Truncated
                } else {
                    ErrorKind::NotJson
                }
            }),
        };
        let armed = self.guard_armed();
        if hold && armed {
            let shape = match &parsed {
                Ok(v) => drift::value_shape(v),
                Err(_) => drift::TEXT_SHAPE.to_string(),
            };
            // Text after the agent said it is idle is what a CLI prints as
            // it exits (a stack trace of a server it was still starting),
            // not its format: it does not count toward drift. JSON does.
            let exit_chatter = self.idle && parsed.is_err();
            if let Some(g) = self.guard.as_mut()
                && !exit_chatter
            {
                g.observe(&shape);
            }
            if !self.held.is_empty() {
                self.held.push(Held {
                    line: line.to_vec(),
                    at_end,
                });
                return;
            }
        }
        let mut events = Vec::new();
        let capture_text = strategy == Strategy::CaptureDiffFallback && !armed;
        let understood = match &parsed {
            Ok(v) if !v.is_object() && capture_text => {
                text::screen_line(&String::from_utf8_lossy(line), &mut events);
                true
            }
            Ok(v) if v.is_object() => {
                let read = match self.kind {
                    ProviderKind::ClaudeCode => claude::parse(v, &mut self.native, &mut events),
                    ProviderKind::Codex => codex::parse(v, &mut self.native, &mut events),
                    ProviderKind::GeminiCli => gemini::parse(v, &mut self.native, &mut events),
                    ProviderKind::Opencode => opencode::parse(v, &mut self.native, &mut events),
                };
                if read == Read::Unknown {
                    let ty = v.get("type").and_then(Value::as_str).unwrap_or("?");
                    events.push(AgentEvent::error(
                        ErrorKind::UnknownEvent,
                        format!(
                            "skipped a {} line of unknown type `{}`; the CLI may be newer than npc's parser",
                            self.kind.as_str(),
                            preview(ty.as_bytes())
                        ),
                    ));
                }
                read == Read::Understood
            }
            Ok(_) => {
                events.push(AgentEvent::error(
                    ErrorKind::UnknownEvent,
                    format!(
                        "skipped a {} line that is JSON but not an object: {}",
                        self.kind.as_str(),
                        preview(line)
                    ),
                ));
                false
            }
            Err(_) if capture_text => {
                text::screen_line(&String::from_utf8_lossy(line), &mut events);
                true
            }
            Err(kind) => {
                let what = match kind {
                    ErrorKind::InvalidUtf8 => "that is not UTF-8",
                    ErrorKind::Truncated => "cut off at the end of output",
                    _ => "that is not JSON",
                };
                events.push(AgentEvent::error(
                    *kind,
                    format!(
                        "skipped a {} line {what}: {}",
                        self.kind.as_str(),
                        preview(line)
                    ),
                ));
                false
            }
        };
        // Idle as soon as the line that says so is read, not at the chunk's end.
        self.track_idle(&events);
        let undecided = self.guard.as_ref().is_none_or(|g| g.ratio(false).is_none());
        if hold && armed && !understood && undecided {
            self.held.push(Held {
                line: line.to_vec(),
                at_end,
            });
        } else {
            out.extend(events);
        }
    }

    /// Let the drift guard judge: switch strategies on drift (re-reading the
    /// held lines), or release the held lines.
    fn decide(&mut self, at_end: bool, out: &mut Vec<AgentEvent>) {
        loop {
            let ratio = match &self.guard {
                Some(g) if self.guard_armed() => g.ratio(at_end),
                _ => None,
            };
            match ratio {
                Some(r) if drift::is_drift(r) => {
                    let from = self.strategy();
                    self.active += 1;
                    let to = self.strategy();
                    let fixture_version = self.baseline_version().unwrap_or_default().to_string();
                    out.push(AgentEvent::DriftDetected {
                        provider: self.kind,
                        ratio: r,
                        threshold: DRIFT_THRESHOLD,
                        fixture_version,
                        from,
                        to,
                    });
                    if let Some(g) = self.guard.as_mut() {
                        g.reset();
                    }
                    for h in std::mem::take(&mut self.held) {
                        self.read_line(&h.line, h.at_end, true, out);
                    }
                }
                None if !at_end && self.guard_armed() => return,
                _ => {
                    for h in std::mem::take(&mut self.held) {
                        self.read_line(&h.line, h.at_end, false, out);
                    }
                    return;
                }
            }
        }
    }
}

/// How an agent's output is cut into lines: at most `max` bytes each (a
/// longer line is skipped and reported), CRLF read as LF.
fn line_splitter(max: usize) -> Splitter {
    Splitter::new(max, Overlong::Skip).trim_cr()
}

/// Starts of the stderr lines agent CLIs print that are no errors (see
/// [`AgentEvent::Notice`]).
pub const STDERR_CHATTER: [&str; 4] = [
    // Codex, when its prompt is an argument and stdin is not a terminal.
    "Reading additional input from stdin",
    // Gemini CLI, under `--yolo` (npc's headless runs).
    "YOLO mode is enabled",
    // Gemini CLI, without a true-colour terminal (a pipe).
    "Warning: True color (24-bit) support not detected",
    "Warning: Basic terminal detected",
];

fn stderr_piece(piece: Piece<'_>, out: &mut Vec<AgentEvent>) {
    match piece {
        Piece::TooLong { bytes } => out.push(AgentEvent::error(
            ErrorKind::LineTooLong,
            format!("skipped a stderr line of {bytes} bytes"),
        )),
        Piece::Line(line) | Piece::Truncated(line) if line.iter().all(u8::is_ascii_whitespace) => {}
        Piece::Line(line) | Piece::Truncated(line) => {
            let text = preview(line);
            // Colour codes may wrap it: found anywhere in the line.
            if STDERR_CHATTER.iter().any(|c| text.contains(c)) {
                out.push(AgentEvent::Notice { text });
            } else {
                out.push(AgentEvent::error(ErrorKind::Stderr, text))
            }
        }
    }
}

/// The start of a line as text, at most [`ERROR_PREVIEW_BYTES`] long.
fn preview(line: &[u8]) -> String {
    let cut = line.len().min(ERROR_PREVIEW_BYTES);
    let mut text = String::from_utf8_lossy(&line[..cut]).into_owned();
    if cut < line.len() {
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests;
