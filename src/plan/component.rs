//! Desired state: the manifest as one component per `(kind, name)`. Each
//! component carries everything its effect depends on (a profile carries its
//! prompt's text and its servers' configs), so a change anywhere it reads
//! shows up as a change of that component.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use super::fingerprint::fingerprint;
use crate::model::*;

/// The kinds of component npc manages, in the order they start (and the
/// reverse of the order they stop).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Project,
    Daemon,
    Provider,
    Prompt,
    McpServer,
    Plugin,
    Hooks,
    Profile,
    PanePlugin,
    Pane,
    Trigger,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Project => "project",
            Kind::Daemon => "daemon",
            Kind::Provider => "provider",
            Kind::Prompt => "prompt",
            Kind::McpServer => "mcp_server",
            Kind::Plugin => "plugin",
            Kind::Hooks => "hooks",
            Kind::Profile => "profile",
            Kind::PanePlugin => "pane_plugin",
            Kind::Pane => "pane",
            Kind::Trigger => "trigger",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        KINDS.iter().copied().find(|k| k.as_str() == s)
    }

    /// JSON paths (prefixes) whose change needs a restart (`-/+`); any other
    /// change of this kind is applied in place (`~`).
    pub fn replace_paths(self) -> &'static [&'static str] {
        match self {
            // A stdio server's process, or an HTTP server's endpoint.
            Kind::McpServer => &["/transport", "/restart"],
            // Only command/args/env replace a pane plugin's child; resume
            // flags and watch_on_signal apply at the next guard decision.
            Kind::PanePlugin => &["/run", "/restart"],
            Kind::Pane => &["/run"],
            // The listener rebinds; the log level changes live.
            Kind::Daemon => &["/listen", "/token_env", "/allow_remote"],
            // A different package directory is a different plugin.
            Kind::Plugin => &["/path", "/package"],
            // A trigger of another kind is another trigger; a new schedule,
            // route or action keeps the trigger's state.
            Kind::Trigger => &["/source/kind"],
            Kind::Project | Kind::Provider | Kind::Prompt | Kind::Hooks | Kind::Profile => &[],
        }
    }

    /// Paths that cannot change while npc runs, with the reason.
    pub fn frozen_paths(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Kind::Project => &[(
                "/state_dir",
                "the state directory holds the running daemon's database; stop the daemon, move `.npc`, then start it again",
            )],
            _ => &[],
        }
    }
}

/// Every kind, in start order.
pub const KINDS: [Kind; 11] = [
    Kind::Project,
    Kind::Daemon,
    Kind::Provider,
    Kind::Prompt,
    Kind::McpServer,
    Kind::Plugin,
    Kind::Hooks,
    Kind::Profile,
    Kind::PanePlugin,
    Kind::Pane,
    Kind::Trigger,
];

/// `(kind, name)`, printed `kind.name`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ComponentId {
    pub kind: Kind,
    pub name: String,
}

impl ComponentId {
    pub fn new(kind: Kind, name: impl Into<String>) -> Self {
        Self {
            kind,
            name: name.into(),
        }
    }

    /// Parse `kind.name`.
    pub fn parse(s: &str) -> Option<Self> {
        let (kind, name) = s.split_once('.')?;
        Some(Self::new(Kind::parse(kind)?, name))
    }
}

impl fmt::Display for ComponentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.kind.as_str(), self.name)
    }
}

impl Serialize for ComponentId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for ComponentId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Self::parse(&text)
            .ok_or_else(|| serde::de::Error::custom(format!("`{text}` is no component id")))
    }
}

/// A profile and everything its rendered form depends on.
#[derive(Debug, Clone, PartialEq, Hash, Serialize)]
pub struct ProfileConfig {
    pub profile: Profile,
    pub provider: Option<Provider>,
    pub prompt: Option<Prompt>,
    pub mcp_servers: BTreeMap<String, McpServer>,
}

/// A plugin declaration plus a digest of its package files, so editing the
/// package marks the plugin changed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct PluginConfig {
    pub path: String,
    pub package: Option<String>,
}

/// The typed configuration of one component.
#[derive(Debug, Clone, PartialEq, Hash, Serialize)]
#[serde(untagged)]
pub enum Config {
    Project(Project),
    Daemon(Daemon),
    Provider(Provider),
    Prompt(Prompt),
    McpServer(McpServer),
    Plugin(PluginConfig),
    Hooks(Vec<Hook>),
    Profile(ProfileConfig),
    PanePlugin(PanePlugin),
    Pane(Pane),
    Trigger(Trigger),
}

impl Config {
    /// SHA-256 of the typed value, secrets included (they never leave the hash).
    pub fn fingerprint(&self) -> String {
        fingerprint(self)
    }

    /// The config as JSON, secrets redacted: what plans and the store show.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}

/// Facts about files the manifest references that the pure layer cannot
/// read itself: the caller computes them (see `runtime`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExternalInputs {
    /// Digest of each plugin package directory, by plugin name.
    pub plugin_digests: BTreeMap<String, String>,
}

/// The desired components of a manifest.
pub type Desired = BTreeMap<ComponentId, Config>;

/// One component per `(kind, name)`. Disabled servers, plugins, triggers and
/// pane plugins are not components: enabling one adds it, disabling removes it.
pub fn desired(m: &Manifest, inputs: &ExternalInputs) -> Desired {
    let mut out = Desired::new();
    out.insert(
        ComponentId::new(Kind::Project, "project"),
        Config::Project(m.project.clone()),
    );
    out.insert(
        ComponentId::new(Kind::Daemon, "api"),
        Config::Daemon(m.daemon.clone()),
    );
    for (name, p) in &m.providers {
        out.insert(
            ComponentId::new(Kind::Provider, name),
            Config::Provider(p.clone()),
        );
    }
    for (name, p) in &m.prompts {
        out.insert(
            ComponentId::new(Kind::Prompt, name),
            Config::Prompt(p.clone()),
        );
    }
    for (name, s) in m.mcp_servers.iter().filter(|(_, s)| s.enabled) {
        out.insert(
            ComponentId::new(Kind::McpServer, name),
            Config::McpServer(s.clone()),
        );
    }
    for (name, p) in m.plugins.iter().filter(|(_, p)| p.enabled) {
        let config = PluginConfig {
            path: p.path.clone(),
            package: inputs.plugin_digests.get(name).cloned(),
        };
        out.insert(ComponentId::new(Kind::Plugin, name), Config::Plugin(config));
    }
    for (event, hooks) in &m.hooks {
        out.insert(
            ComponentId::new(Kind::Hooks, event.as_str()),
            Config::Hooks(hooks.clone()),
        );
    }
    for (name, p) in &m.profiles {
        let config = ProfileConfig {
            profile: p.clone(),
            provider: m.providers.get(&p.provider).cloned(),
            prompt: p.prompt.as_ref().and_then(|n| m.prompts.get(n)).cloned(),
            mcp_servers: p
                .mcp_servers
                .iter()
                .filter_map(|s| m.mcp_servers.get(s).map(|c| (s.clone(), c.clone())))
                .collect(),
        };
        out.insert(
            ComponentId::new(Kind::Profile, name),
            Config::Profile(config),
        );
    }
    for (name, p) in m.pane_plugins.iter().filter(|(_, p)| p.enabled) {
        out.insert(
            ComponentId::new(Kind::PanePlugin, name),
            Config::PanePlugin(p.clone()),
        );
    }
    for (name, p) in &m.panes {
        out.insert(ComponentId::new(Kind::Pane, name), Config::Pane(p.clone()));
    }
    for (name, t) in m.triggers.iter().filter(|(_, t)| t.enabled) {
        out.insert(
            ComponentId::new(Kind::Trigger, name),
            Config::Trigger(t.clone()),
        );
    }
    out
}
