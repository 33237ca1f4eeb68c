//! What a notification says: [`Message`], made from a recorded event and
//! its run ([`RunContext`]), sink-independent; and the request each kind
//! of sink sends for it ([`Request`]). Everything from an event or a
//! payload is data: cleaned of control characters, cut to a bound
//! ([`MAX_TITLE_CHARS`], [`MAX_FIELD_CHARS`], [`MAX_TEXT_CHARS`]), written
//! as JSON or as escaped text, never compiled as a template; it never
//! picks a URL, a header or a file (links are built from the daemon's own
//! address and a percent-encoded run id).

use std::fmt::Write as _;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::Serialize;
use serde_json::{Value, json};

use crate::model::{NotifyOn, NotifySink, NtfyPriority, RunOrigin, Sink, template};
use crate::store::queue::RowOrigin;

use super::topics;

/// Longest title, in characters.
pub const MAX_TITLE_CHARS: usize = 120;
/// Longest field taken from an event or a payload (a reason, an issue's
/// title, a tool's arguments), in characters.
pub const MAX_FIELD_CHARS: usize = 300;
/// Longest message text, in characters.
pub const MAX_TEXT_CHARS: usize = 2_000;

/// What started a run, where the run's row says.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StartedBy {
    /// The trigger (`@manual` for runs by hand).
    pub trigger: String,
    /// What asked for the run, as its row says.
    pub origin: RowOrigin,
    /// A webhook's event (GitHub's `X-GitHub-Event`: `issues`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// `issue` or `pull_request`, when the payload has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub number: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
}

/// A run as a notification sees it: its row and the profile it uses.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunContext {
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    pub started_by: StartedBy,
}

impl RunContext {
    /// The context of run `id` from its row's trigger, origin and payload;
    /// the profile from the payload (a run by hand), else `trigger_profile`
    /// (the profile its trigger's action runs).
    pub fn of_row(
        id: &str,
        trigger: &str,
        origin: &RowOrigin,
        payload: &Value,
        trigger_profile: Option<&str>,
    ) -> Self {
        let text = |v: Option<&Value>| v.and_then(Value::as_str).map(|s| clean(s, MAX_FIELD_CHARS));
        let profile = text(payload.get("profile")).or_else(|| trigger_profile.map(str::to_string));
        let body = payload.get("body");
        let (subject, item) = ["issue", "pull_request"]
            .into_iter()
            .find_map(|key| {
                body.and_then(|b| b.get(key))
                    .filter(|v| v.is_object())
                    .map(|v| (key, v))
            })
            .map_or((None, None), |(k, v)| (Some(k.to_string()), Some(v)));
        Self {
            id: clean(id, MAX_FIELD_CHARS),
            profile,
            started_by: StartedBy {
                trigger: clean(trigger, MAX_FIELD_CHARS),
                origin: origin.clone(),
                event: text(payload.get("event")),
                subject,
                number: item.and_then(|i| i.get("number")).and_then(Value::as_u64),
                title: text(item.and_then(|i| i.get("title"))),
            },
        }
    }
}

/// Links a person acts through, built from the daemon's address.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Links {
    /// The dashboard, on the run when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dashboard: Option<String>,
    /// `POST` here (with the API's credential) to approve a waiting run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approve: Option<String>,
}

/// One notification, whatever the sink.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Message {
    /// The `on` name it tells (`run.failed`).
    pub on: String,
    pub title: String,
    /// The whole message in words (title excluded).
    pub text: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<RunContext>,
    /// How the run ended (`failed`, `blocked`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// Why it failed, was blocked or needs attention.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What a waiting run asks (or the denied call): the tool and its
    /// arguments.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
    /// The component an event concerns (`pane/NAME`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub component: Option<String>,
    /// How many events this message stands for (more than one when
    /// coalesced).
    pub events: u64,
    pub links: Links,
}

/// Text from an event or a payload, made safe to show: control
/// characters (line breaks too) become spaces, runs of spaces one, and it
/// is cut to `max` characters with `…`.
pub fn clean(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max * 4));
    let mut chars = 0;
    let mut space = false;
    for c in text.trim().chars() {
        let c = if c.is_control() { ' ' } else { c };
        if c == ' ' && space {
            continue;
        }
        space = c == ' ';
        if chars == max {
            out.push('…');
            break;
        }
        out.push(c);
        chars += 1;
    }
    out
}

/// What a run id keeps unencoded in a link: letters, digits, `-`, `_`.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_');

/// A run id as one URL path segment.
fn segment(id: &str) -> String {
    utf8_percent_encode(id, SEGMENT).to_string()
}

impl Message {
    /// The message for event `kind` (`payload`, `component`) told as `on`,
    /// of `run` if it concerns one; links on `base` (the API's URL).
    pub fn of_event(
        on: NotifyOn,
        payload: &Value,
        component: Option<&str>,
        run: Option<RunContext>,
        base: Option<&str>,
    ) -> Self {
        let field = |key: &str| {
            payload.get(key).and_then(|v| match v {
                Value::String(s) => Some(clean(s, MAX_FIELD_CHARS)),
                Value::Null => None,
                other => Some(clean(&other.to_string(), MAX_FIELD_CHARS)),
            })
        };
        let run_id = run
            .as_ref()
            .map(|r| r.id.clone())
            .or_else(|| topics::run_id(payload).map(|id| clean(id, MAX_FIELD_CHARS)));
        let links = Links {
            dashboard: base.map(|b| match &run_id {
                Some(id) => format!("{b}/#run={}", segment(id)),
                None => format!("{b}/"),
            }),
            approve: match (base, &run_id, on) {
                (Some(b), Some(id), NotifyOn::RunWaiting) => {
                    Some(format!("{b}/api/v1/runs/{}/approve", segment(id)))
                }
                _ => None,
            },
        };
        let reason = ["error", "reason", "detail", "question"]
            .iter()
            .find_map(|k| field(k));
        // A denial names its rule (`tool.denied`, an approval's question).
        let reason = match (field("rule"), reason) {
            (Some(rule), Some(why)) => Some(format!("{why} (rule `{rule}`)")),
            (Some(rule), None) => Some(format!("rule `{rule}`")),
            (None, why) => why,
        };
        let mut message = Message {
            on: on.as_str().to_string(),
            title: String::new(),
            text: String::new(),
            outcome: field("outcome"),
            reason,
            tool: field("tool"),
            arguments: field("arguments"),
            component: component.map(|c| clean(c, MAX_FIELD_CHARS)),
            run,
            events: 1,
            links,
        };
        message.title = clean(&message.headline(run_id.as_deref()), MAX_TITLE_CHARS);
        message.text = message.words();
        message
    }

    /// A sample of `on` for `npc notify test`: a run of a GitHub issue.
    pub fn sample(on: NotifyOn, base: Option<&str>) -> Self {
        let run = RunContext {
            id: "run-sample".into(),
            profile: Some("triage".into()),
            started_by: StartedBy {
                trigger: "issues".into(),
                origin: RowOrigin::Known(RunOrigin::Webhook),
                event: Some("issues".into()),
                subject: Some("issue".into()),
                number: Some(42),
                title: Some("Sample: the build fails on main".into()),
            },
        };
        let payload = json!({
            "run_id": "run-sample",
            "outcome": "failed",
            "error": "this is a test notification from `npc notify test`",
            "tool": "Bash",
            "arguments": "{\"command\":\"git push\"}",
        });
        Self::of_event(on, &payload, None, Some(run), base)
    }

    /// The same message standing for `events` events.
    pub fn coalesced(mut self, events: u64) -> Self {
        self.events = events;
        self.text = self.words();
        self
    }

    fn headline(&self, run_id: Option<&str>) -> String {
        let run = run_id.map_or_else(String::new, |id| format!("run {id} "));
        let what = match self.on.as_str() {
            "run.waiting" => format!("{run}waits for your answer"),
            "run.blocked" => format!("{run}was blocked"),
            "run.failed" => format!(
                "{run}{}",
                self.outcome
                    .as_deref()
                    .map_or("failed".into(), |o| format!("ended {o}"))
            ),
            "run.succeeded" => format!("{run}succeeded"),
            "run.finished" => format!("{run}ended {}", self.outcome.as_deref().unwrap_or("")),
            "run.queued" => format!("{run}was queued"),
            "run.cancelled" => format!("{run}was cancelled"),
            "tool.denied" => format!("{run}: a tool call was denied"),
            "pane.attention" => format!(
                "{} needs your attention",
                self.component.as_deref().unwrap_or("a pane")
            ),
            "component.failed" => format!(
                "{} failed",
                self.component.as_deref().unwrap_or("a component")
            ),
            "manifest.invalid" => "the manifest does not load".to_string(),
            other => other.to_string(),
        };
        format!("npc: {}", what.trim())
    }

    /// The message in words: what started the run, what it asks or why it
    /// ended so, how many events, and the links.
    fn words(&self) -> String {
        let mut text = String::new();
        if let Some(run) = &self.run {
            let by = &run.started_by;
            let _ = write!(text, "Started by {} (trigger `{}`", by.origin, by.trigger);
            if let Some(event) = &by.event {
                let _ = write!(text, ", event `{event}`");
            }
            text.push(')');
            if let (Some(subject), Some(number)) = (&by.subject, by.number) {
                let noun = if subject == "pull_request" {
                    "pull request"
                } else {
                    "issue"
                };
                let _ = write!(text, " for {noun} #{number}");
                if let Some(title) = &by.title {
                    let _ = write!(text, ": {title}");
                }
            }
            text.push('\n');
            if let Some(profile) = &run.profile {
                let _ = writeln!(text, "Profile: {profile}");
            }
        }
        if let Some(tool) = &self.tool {
            let verb = if self.on == "run.waiting" {
                "Asks to run"
            } else {
                "Tool"
            };
            let _ = write!(text, "{verb}: {tool}");
            if let Some(args) = &self.arguments {
                let _ = write!(text, " {args}");
            }
            text.push('\n');
        }
        if let Some(reason) = &self.reason {
            let _ = writeln!(text, "Why: {reason}");
        }
        if self.events > 1 {
            let _ = writeln!(text, "({} events coalesced into this message)", self.events);
        }
        if let Some(link) = &self.links.dashboard {
            let _ = writeln!(text, "Open: {link}");
        }
        if let Some(link) = &self.links.approve {
            let _ = writeln!(text, "Approve: {link}");
        }
        clean_lines(text.trim_end(), MAX_TEXT_CHARS)
    }
}

/// `text` cut to `max` characters with `…` (its lines are already clean).
fn clean_lines(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// What a sink is sent for one message.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// An HTTP POST.
    Post {
        url: String,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// `notify-send TITLE TEXT`.
    Desktop { title: String, text: String },
}

/// The request `sink` sends for `message`, or why there is none (a `body`
/// that fails to render or renders no JSON).
pub fn request(sink: &NotifySink, message: &Message) -> Result<Request, String> {
    let json = ("Content-Type".to_string(), "application/json".to_string());
    match &sink.sink {
        Sink::Webhook { url, headers, body } => {
            let body = match body {
                Some(source) => render_body(source, message)?,
                None => serde_json::to_vec(message).map_err(|e| e.to_string())?,
            };
            let mut all = vec![json];
            all.extend(
                headers
                    .iter()
                    .map(|(k, v)| (k.clone(), v.expose().to_string())),
            );
            Ok(Request::Post {
                url: url.expose().to_string(),
                headers: all,
                body,
            })
        }
        Sink::Slack { url } => {
            let text = format!(
                "*{}*\n{}",
                slack_escape(&message.title),
                slack_escape(&message.text)
            );
            let body = serde_json::to_vec(&json!({ "text": text })).map_err(|e| e.to_string())?;
            Ok(Request::Post {
                url: url.expose().to_string(),
                headers: vec![json],
                body,
            })
        }
        Sink::Ntfy {
            url,
            priority,
            token,
        } => {
            let priority = priority.unwrap_or(if message.on == "run.waiting" {
                NtfyPriority::High
            } else {
                NtfyPriority::Default
            });
            let tag = match message.on.as_str() {
                "run.succeeded" => "white_check_mark",
                "run.waiting" => "question",
                "run.finished" | "run.queued" => "information_source",
                _ => "warning",
            };
            let mut headers = vec![
                ("Title".to_string(), ascii_header(&message.title)),
                ("Priority".to_string(), priority.as_str().to_string()),
                ("Tags".to_string(), tag.to_string()),
                (
                    "Content-Type".to_string(),
                    "text/plain; charset=utf-8".to_string(),
                ),
            ];
            if let Some(link) = &message.links.dashboard {
                headers.push(("Click".to_string(), link.clone()));
            }
            if let Some(link) = &message.links.approve {
                headers.push(("Actions".to_string(), format!("view, Approve, {link}")));
            }
            if let Some(token) = token {
                headers.push((
                    "Authorization".to_string(),
                    format!("Bearer {}", token.expose()),
                ));
            }
            Ok(Request::Post {
                url: url.expose().to_string(),
                headers,
                body: message.text.clone().into_bytes(),
            })
        }
        Sink::Desktop => Ok(Request::Desktop {
            title: message.title.clone(),
            text: message.text.clone(),
        }),
    }
}

/// A webhook's `body` template rendered with `message` (values written as
/// JSON, within the template bounds); the result must be JSON.
fn render_body(source: &str, message: &Message) -> Result<Vec<u8>, String> {
    let env = template::json_environment();
    let compiled = template::compile(&env, "body", source)
        .map_err(|e| format!("the `body` template does not compile: {e}"))?;
    let ctx =
        minijinja::context! { message => minijinja::Value::from(minijinja::value::Serde(message)) };
    let rendered = template::render_bounded(&compiled, ctx).map_err(|f| match f.exhausted {
        Some(bound) => bound.describe(),
        None => format!("the `body` template failed: {}", f.error),
    })?;
    serde_json::from_str::<Value>(&rendered.text).map_err(|e| format!("the `body` template rendered no JSON ({e}); write values bare, as in `{{\"text\": {{{{ message.text }}}}}}`"))?;
    Ok(rendered.text.into_bytes())
}

/// Slack's escaping of text: `&`, `<` and `>` (no mention, no link made
/// from a payload).
fn slack_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A header value of visible ASCII: other characters become `?`.
fn ascii_header(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_drops_control_characters_and_cuts() {
        assert_eq!(clean("a\nb\r\n\u{1b}[31mc", 100), "a b [31mc");
        assert_eq!(clean(&"x".repeat(10), 4), "xxxx…");
    }

    #[test]
    fn template_text_in_a_payload_is_data() {
        let payload =
            json!({ "run_id": "r1", "outcome": "failed", "error": "{{ 7 * 7 }} \"quoted\"" });
        let message = Message::of_event(
            NotifyOn::RunFailed,
            &payload,
            None,
            None,
            Some("http://127.0.0.1:1"),
        );
        let sink = NotifySink {
            sink: Sink::Webhook {
                url: crate::model::Text::plain("http://127.0.0.1:1/x"),
                headers: Default::default(),
                body: Some("{\"why\": {{ message.reason }}}".into()),
            },
            on: vec![NotifyOn::RunFailed],
            triggers: vec![],
            profiles: vec![],
            origins: vec![],
            attempts: 1,
            timeout_ms: 1000,
            enabled: true,
        };
        let Request::Post { body, .. } = request(&sink, &message).unwrap() else {
            panic!()
        };
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["why"], "{{ 7 * 7 }} \"quoted\"");
    }

    #[test]
    fn links_encode_the_run_id() {
        let payload = json!({ "run_id": "../x?y" });
        let m = Message::of_event(NotifyOn::RunWaiting, &payload, None, None, Some("http://h"));
        assert_eq!(
            m.links.approve.as_deref(),
            Some("http://h/api/v1/runs/%2E%2E%2Fx%3Fy/approve")
        );
    }
}
