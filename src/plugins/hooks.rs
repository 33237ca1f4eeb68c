//! A package's hooks file: a closed, versioned document
//! `{"version":1,"hooks":{EVENT:[{command,args,env,cwd,timeout_ms}]}}` with
//! the seven lifecycle events and `timeout_ms` from 1 to 30,000 (default
//! 5,000). npc reads it from its own namespace folder,
//! `dev.npcagent/hooks.json`, or else from Orcacode's,
//! `io.github.okikorg.orcacode/hooks.json`, so a package written for
//! Orcacode runs its hooks under npc unchanged. When both exist npc's own
//! wins and Orcacode's is reported (a warning) and ignored. An invalid
//! hooks file is an error and contributes no hooks: a policy is never
//! half-loaded. [`HooksFile`] is what the hook runner consumes.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::{
    HOOKS_FILE, NPC_NAMESPACE, ORCACODE_NAMESPACE, PLUGIN_DATA, PLUGIN_ROOT, Problem, Problems,
    schema,
};
use crate::model::HookEvent;
use crate::repofs::Root;

/// Default time limit of one plugin hook call.
pub const DEFAULT_TIMEOUT_MS: u64 = crate::model::DEFAULT_HOOK_TIMEOUT_MS;
/// Most entries read per event.
pub const MAX_ENTRIES_PER_EVENT: usize = 64;

/// Which namespace folder a hooks file came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HooksSource {
    /// `dev.npcagent/hooks.json`.
    Npc,
    /// `io.github.okikorg.orcacode/hooks.json`.
    Orcacode,
}

impl HooksSource {
    /// The file, relative to the package root.
    pub fn file(self) -> String {
        let ns = match self {
            HooksSource::Npc => NPC_NAMESPACE,
            HooksSource::Orcacode => ORCACODE_NAMESPACE,
        };
        format!("{ns}/{HOOKS_FILE}")
    }
}

/// One hook command of a plugin; placeholders are not yet expanded
/// (see [`super::expand`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HookEntry {
    pub command: String,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    pub timeout_ms: u64,
}

/// A valid hooks file: entries per event, in file order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HooksFile {
    pub source: HooksSource,
    pub hooks: BTreeMap<HookEvent, Vec<HookEntry>>,
}

impl HooksFile {
    /// Number of hook entries over all events.
    pub fn len(&self) -> usize {
        self.hooks.values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The entries of `event`, in order.
    pub fn entries(&self, event: HookEvent) -> &[HookEntry] {
        self.hooks.get(&event).map_or(&[], Vec::as_slice)
    }
}

pub(crate) fn read(root: &Root, problems: &mut Problems) -> Option<HooksFile> {
    let npc = HooksSource::Npc.file();
    let orca = HooksSource::Orcacode.file();
    let has = |f: &str| super::exists(root, std::path::Path::new(f));
    let (source, file) = match (has(&npc), has(&orca)) {
        (true, true) => {
            problems.push(
                Problem::warning(
                    &orca,
                    "",
                    format!("ignored: `{npc}` exists and npc reads its own hooks file first"),
                )
                .hint(format!("merge the two into `{npc}`, or remove one")),
            );
            (HooksSource::Npc, npc)
        }
        (true, false) => (HooksSource::Npc, npc),
        (false, true) => (HooksSource::Orcacode, orca),
        (false, false) => return None,
    };
    let doc = super::read_json(root, &file, false, problems)?;
    parse(root, source, &file, &doc, problems)
}

/// Check and convert one hooks document.
pub(crate) fn parse(
    root: &Root,
    source: HooksSource,
    file: &str,
    doc: &Value,
    problems: &mut Problems,
) -> Option<HooksFile> {
    let mut errors = schema::check(schema::Schema::Hooks, doc, file, "");
    let mut hooks = BTreeMap::new();
    if let Some(events) = doc.get("hooks").and_then(Value::as_object) {
        for (event_name, list) in events {
            let Some(event) = HookEvent::parse(event_name) else {
                // The schema reported it (`unknown field`): add the list.
                errors
                    .iter_mut()
                    .filter(|p| {
                        p.pointer == "/hooks" && p.message.contains(&format!("`{event_name}`"))
                    })
                    .for_each(|p| {
                        p.hint = Some(format!(
                            "events are {}",
                            HookEvent::NAMES.map(|n| format!("`{n}`")).join(", ")
                        ));
                    });
                continue;
            };
            let Some(list) = list.as_array() else {
                continue;
            };
            if list.len() > MAX_ENTRIES_PER_EVENT {
                errors.push(Problem::error(
                    file,
                    super::pointer(&["hooks", event_name]),
                    format!(
                        "has {} hooks, more than the {MAX_ENTRIES_PER_EVENT} allowed per event",
                        list.len()
                    ),
                ));
                continue;
            }
            let mut entries = Vec::new();
            for (i, entry) in list.iter().enumerate() {
                let base = super::pointer(&["hooks", event_name, &i.to_string()]);
                if let Some(e) = entry_of(root, file, &base, entry, &mut errors) {
                    entries.push(e);
                }
            }
            hooks.insert(event, entries);
        }
    }
    if errors.is_empty() {
        Some(HooksFile { source, hooks })
    } else {
        problems.extend(errors);
        None
    }
}

fn entry_of(
    root: &Root,
    file: &str,
    base: &str,
    entry: &Value,
    errors: &mut Vec<Problem>,
) -> Option<HookEntry> {
    let obj = entry.as_object()?;
    let command = obj.get("command")?.as_str()?.to_string();
    if !command.is_empty()
        && let Err((msg, hint)) = super::check_command(root, &command)
    {
        errors.push(Problem::error(file, format!("{base}/command"), msg).hint(hint));
    }
    let env: BTreeMap<String, String> = obj
        .get("env")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default();
    for reserved in [PLUGIN_ROOT, PLUGIN_DATA] {
        if env.contains_key(reserved) {
            let at = format!("{base}/env/{reserved}");
            errors.retain(|p| p.pointer != at);
            errors.push(
                Problem::error(
                    file,
                    at,
                    format!("`env` may not set `{reserved}`; npc sets it"),
                )
                .hint("remove the entry; the hook gets `PLUGIN_ROOT` and `PLUGIN_DATA` from npc"),
            );
        }
    }
    let cwd = obj.get("cwd").and_then(Value::as_str).map(str::to_string);
    if let Some(c) = &cwd
        && errors.iter().all(|p| p.pointer != format!("{base}/cwd"))
        && let Err(msg) = super::check_cwd(root, c)
    {
        errors.push(
            Problem::error(file, format!("{base}/cwd"), msg)
                .hint("keep `cwd` inside the package or its data directory"),
        );
    }
    let timeout_ms = obj
        .get("timeout_ms")
        .and_then(Value::as_u64)
        .unwrap_or(DEFAULT_TIMEOUT_MS);
    if let Some(p) = errors
        .iter_mut()
        .find(|p| p.pointer == format!("{base}/timeout_ms"))
    {
        p.hint = Some(format!(
            "use 1 to {} milliseconds (default {DEFAULT_TIMEOUT_MS})",
            crate::model::MAX_HOOK_TIMEOUT_MS
        ));
    }
    let args = obj
        .get("args")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    Some(HookEntry {
        command,
        args,
        env,
        cwd,
        timeout_ms,
    })
}
