//! Plan output: Terraform-like lines with a symbol and a cause per
//! component, and the JSON document `npc plan --format json` prints.

use std::fmt::Write as _;

use serde::Serialize;

use super::{Action, Plan, Summary};

/// Human output. `against` says what the plan compared with.
pub fn render_human(plan: &Plan, against: &str) -> String {
    let mut out = String::new();
    if !plan.has_changes() {
        let _ = writeln!(
            out,
            "No changes. What runs matches the manifest ({against})."
        );
        return out;
    }
    let _ = writeln!(
        out,
        "npc will make these changes (compared with {against}):\n"
    );
    let width = plan
        .changes
        .iter()
        .filter(|c| c.action != Action::NoOp)
        .map(|c| c.id.to_string().len())
        .max()
        .unwrap_or(0);
    for c in plan.changes.iter().filter(|c| c.action != Action::NoOp) {
        let _ = writeln!(
            out,
            "  {:>3} {:<width$}  {}",
            c.action.symbol(),
            c.id.to_string(),
            c.cause
        );
        for f in &c.fields {
            match (&f.before, &f.after) {
                (Some(b), Some(a)) => {
                    let _ = writeln!(
                        out,
                        "        {:<width$}    {}: {b} → {a}",
                        "",
                        f.path.trim_start_matches('/').replace('/', ".")
                    );
                }
                (None, Some(a)) => {
                    let _ = writeln!(
                        out,
                        "        {:<width$}    {}: (added) {a}",
                        "",
                        f.path.trim_start_matches('/').replace('/', ".")
                    );
                }
                (Some(b), None) => {
                    let _ = writeln!(
                        out,
                        "        {:<width$}    {}: {b} (removed)",
                        "",
                        f.path.trim_start_matches('/').replace('/', ".")
                    );
                }
                (None, None) => {}
            }
        }
    }
    let s = plan.summary();
    let _ = write!(
        out,
        "\nPlan: {} to add, {} to change in place, {} to replace, {} to remove",
        s.add, s.update, s.replace, s.remove
    );
    if s.refused > 0 {
        let _ = write!(out, "; {} refused", s.refused);
    }
    out.push_str(".\n");
    out
}

#[derive(Serialize)]
struct JsonPlan<'a> {
    format_version: &'static str,
    against: &'a str,
    summary: Summary,
    actions: Vec<JsonAction<'a>>,
}

#[derive(Serialize)]
struct JsonAction<'a> {
    id: String,
    kind: &'static str,
    name: &'a str,
    action: Action,
    symbol: &'static str,
    cause: &'a str,
    fields: &'a [super::FieldChange],
}

/// The JSON plan: one action per component, unchanged ones included.
pub fn render_json(plan: &Plan, against: &str) -> serde_json::Value {
    let doc = JsonPlan {
        format_version: "1",
        against,
        summary: plan.summary(),
        actions: plan
            .changes
            .iter()
            .map(|c| JsonAction {
                id: c.id.to_string(),
                kind: c.id.kind.as_str(),
                name: &c.id.name,
                action: c.action,
                symbol: c.action.symbol(),
                cause: &c.cause,
                fields: &c.fields,
            })
            .collect(),
    };
    serde_json::to_value(doc).unwrap_or_default()
}
