//! Planning. PURE: the desired components of a manifest against what is
//! applied (observed), giving one action per component with its cause.
//!
//! Equality is decided by fingerprints of typed values (derived `Hash`, see
//! [`fingerprint`]); the JSON form of each config (secrets redacted) only
//! explains *what* differs and which kind of change that is: each [`Kind`]
//! declares the paths that need a restart, everything else is live.

mod component;
pub mod fingerprint;
pub mod outcome;
mod render;
mod standing;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use component::*;
pub use render::{render_human, render_json};
pub use standing::Standing;

/// What is applied for one component: its fingerprint and its redacted JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observed {
    pub fingerprint: String,
    pub config: serde_json::Value,
}

impl From<&Config> for Observed {
    fn from(c: &Config) -> Self {
        Observed {
            fingerprint: c.fingerprint(),
            config: c.to_json(),
        }
    }
}

/// Observed state of every applied component.
pub type ObservedState = BTreeMap<ComponentId, Observed>;

/// The observed form of a desired state (what it will be once applied).
pub fn observe(desired: &Desired) -> ObservedState {
    desired
        .iter()
        .map(|(id, c)| (id.clone(), Observed::from(c)))
        .collect()
}

/// What happens to one component.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// `+`: start or write it.
    Add,
    /// `~`: change it live, without a restart.
    Update,
    /// `-/+`: stop the old one, start the new one.
    Replace,
    /// `-`: stop or delete it.
    Remove,
    /// Unchanged.
    NoOp,
    /// A change that cannot be applied while npc runs.
    Refuse,
}

impl Action {
    pub fn symbol(self) -> &'static str {
        match self {
            Action::Add => "+",
            Action::Update => "~",
            Action::Replace => "-/+",
            Action::Remove => "-",
            Action::NoOp => " ",
            Action::Refuse => "!",
        }
    }
}

/// One line of a plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    pub id: ComponentId,
    pub action: Action,
    /// Why, in words: "new", "removed from the manifest", "`args` changed"…
    pub cause: String,
    /// The JSON paths that differ (for updates and replacements).
    pub fields: Vec<FieldChange>,
    #[serde(skip)]
    pub before: Option<Observed>,
    #[serde(skip)]
    pub after: Option<Observed>,
}

/// One differing path, with short printable values where they are scalars.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FieldChange {
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<serde_json::Value>,
}

/// A whole plan, in start order.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Plan {
    pub changes: Vec<Change>,
}

/// Counts by action.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct Summary {
    pub add: usize,
    pub update: usize,
    pub replace: usize,
    pub remove: usize,
    pub unchanged: usize,
    pub refused: usize,
}

impl Plan {
    pub fn summary(&self) -> Summary {
        let mut s = Summary::default();
        for c in &self.changes {
            match c.action {
                Action::Add => s.add += 1,
                Action::Update => s.update += 1,
                Action::Replace => s.replace += 1,
                Action::Remove => s.remove += 1,
                Action::NoOp => s.unchanged += 1,
                Action::Refuse => s.refused += 1,
            }
        }
        s
    }

    /// True when applying would change something.
    pub fn has_changes(&self) -> bool {
        self.changes.iter().any(|c| c.action != Action::NoOp)
    }

    /// The changes that do something, in start order.
    pub fn actionable(&self) -> impl Iterator<Item = &Change> {
        self.changes
            .iter()
            .filter(|c| !matches!(c.action, Action::NoOp | Action::Refuse))
    }

    /// The plan that undoes this one (for rolling back a failed reload).
    pub fn flip(&self) -> Plan {
        let changes = self
            .changes
            .iter()
            .map(|c| {
                let action = match c.action {
                    Action::Add => Action::Remove,
                    Action::Remove => Action::Add,
                    other => other,
                };
                let fields = c
                    .fields
                    .iter()
                    .map(|f| FieldChange {
                        path: f.path.clone(),
                        before: f.after.clone(),
                        after: f.before.clone(),
                    })
                    .collect();
                Change {
                    id: c.id.clone(),
                    action,
                    cause: format!("roll back: {}", c.cause),
                    fields,
                    before: c.after.clone(),
                    after: c.before.clone(),
                }
            })
            .collect();
        Plan { changes }
    }
}

/// Plan `desired` against `observed`.
pub fn plan(desired: &Desired, observed: &ObservedState) -> Plan {
    // JSON is only needed to explain a change: skip it for components whose
    // fingerprint matches what is applied (most of them, most of the time).
    let after: ObservedState = desired
        .iter()
        .map(|(id, c)| {
            let fingerprint = c.fingerprint();
            let config = match observed.get(id) {
                Some(o) if o.fingerprint == fingerprint => serde_json::Value::Null,
                _ => c.to_json(),
            };
            (
                id.clone(),
                Observed {
                    fingerprint,
                    config,
                },
            )
        })
        .collect();
    plan_observed(&after, observed)
}

/// Plan between two observed states (`after` is what should be).
pub fn plan_observed(after: &ObservedState, before: &ObservedState) -> Plan {
    // Both maps are sorted by id: walk them together (a merge join), so
    // planning stays linear in the number of components.
    let mut changes = Vec::with_capacity(after.len().max(before.len()));
    let (mut a_iter, mut b_iter) = (after.iter().peekable(), before.iter().peekable());
    loop {
        let order = match (b_iter.peek(), a_iter.peek()) {
            (None, None) => break,
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (Some((b, _)), Some((a, _))) => b.cmp(a),
        };
        let before_entry = if order.is_le() { b_iter.next() } else { None };
        let after_entry = if order.is_ge() { a_iter.next() } else { None };
        let Some(id) = before_entry.or(after_entry).map(|(id, _)| id) else {
            break;
        };
        let (b, a) = (before_entry.map(|e| e.1), after_entry.map(|e| e.1));
        let (action, cause, fields) = match (b, a) {
            (None, Some(_)) => (Action::Add, "new".to_string(), Vec::new()),
            (Some(b), Some(a)) if b.fingerprint == a.fingerprint => {
                (Action::NoOp, "unchanged".to_string(), Vec::new())
            }
            (Some(b), Some(a)) => classify(id.kind, b, a),
            _ => (
                Action::Remove,
                "no longer in the manifest (or disabled)".to_string(),
                Vec::new(),
            ),
        };
        let keep = action != Action::NoOp;
        changes.push(Change {
            id: id.clone(),
            action,
            cause,
            fields,
            before: b.filter(|_| keep).cloned(),
            after: a.filter(|_| keep).cloned(),
        });
    }
    Plan { changes }
}

/// Largest scalar shown inline in a field change.
pub const MAX_SHOWN_VALUE_CHARS: usize = 60;

fn classify(kind: Kind, before: &Observed, after: &Observed) -> (Action, String, Vec<FieldChange>) {
    let mut paths = Vec::new();
    diff("", &before.config, &after.config, &mut paths);
    if paths.is_empty() {
        // Fingerprints differ but the redacted forms agree: a secret changed,
        // and it could be anywhere, so a kind with a process restarts.
        return if kind.replace_paths().is_empty() {
            (
                Action::Update,
                "a secret value changed (applied live)".to_string(),
                Vec::new(),
            )
        } else {
            (
                Action::Replace,
                "a secret value changed (restarts it)".to_string(),
                Vec::new(),
            )
        };
    }
    let fields: Vec<FieldChange> = paths
        .iter()
        .map(|p| FieldChange {
            path: p.clone(),
            before: shown(pointer(&before.config, p)),
            after: shown(pointer(&after.config, p)),
        })
        .collect();
    for (frozen, reason) in kind.frozen_paths() {
        if paths.iter().any(|p| starts_with_path(p, frozen)) {
            return (
                Action::Refuse,
                format!("`{}` cannot change while npc runs: {reason}", &frozen[1..]),
                fields,
            );
        }
    }
    let replace = paths
        .iter()
        .any(|p| kind.replace_paths().iter().any(|r| starts_with_path(p, r)));
    let names: Vec<String> = top_fields(&paths);
    let cause = format!(
        "{} changed",
        names
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if replace {
        (Action::Replace, format!("{cause} (restarts it)"), fields)
    } else {
        (Action::Update, format!("{cause} (applied live)"), fields)
    }
}

fn starts_with_path(path: &str, prefix: &str) -> bool {
    path == prefix || path.starts_with(&format!("{prefix}/"))
}

/// The distinct field names (first two path segments, `run.args`) of paths.
fn top_fields(paths: &[String]) -> Vec<String> {
    let mut out: Vec<String> = paths
        .iter()
        .map(|p| {
            let segs: Vec<&str> = p.trim_start_matches('/').split('/').collect();
            let take = if segs.len() > 1
                && matches!(
                    segs[0],
                    "run" | "transport" | "source" | "profile" | "action" | "mcp_servers"
                ) {
                2
            } else {
                1
            };
            segs.iter()
                .take(take)
                .copied()
                .collect::<Vec<_>>()
                .join(".")
        })
        .collect();
    out.dedup();
    out
}

fn pointer<'a>(v: &'a serde_json::Value, path: &str) -> Option<&'a serde_json::Value> {
    if path.is_empty() {
        Some(v)
    } else {
        v.pointer(path)
    }
}

fn shown(v: Option<&serde_json::Value>) -> Option<serde_json::Value> {
    let v = v?;
    let text = v.to_string();
    if (v.is_string() || v.is_number() || v.is_boolean())
        && text.chars().count() <= MAX_SHOWN_VALUE_CHARS
    {
        Some(v.clone())
    } else {
        None
    }
}

fn escape_pointer(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// JSON pointers of every leaf (or container whose shape changed) that differs.
fn diff(path: &str, a: &serde_json::Value, b: &serde_json::Value, out: &mut Vec<String>) {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let p = format!("{path}/{}", escape_pointer(k));
                match (x.get(k), y.get(k)) {
                    (Some(va), Some(vb)) => diff(&p, va, vb, out),
                    _ => out.push(p),
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (va, vb)) in x.iter().zip(y).enumerate() {
                diff(&format!("{path}/{i}"), va, vb, out);
            }
        }
        _ if a != b => out.push(path.to_string()),
        _ => {}
    }
}

#[cfg(test)]
mod tests;
