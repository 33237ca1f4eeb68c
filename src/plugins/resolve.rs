//! A validated [`Package`] turned into what the manifest model runs: its
//! MCP servers as manifest servers named `PLUGIN__SERVER` (placeholders
//! expanded once, `PLUGIN_ROOT` / `PLUGIN_DATA` set), and its hooks and
//! skills as [`PluginParts`] (hook placeholders are left for the hook
//! runner, which expands them per call). One conversion for both plugin
//! sources: the manifest's `[plugins.*]` (lowering) and the user registry
//! ([`user_plugins`]).
//!
//! The user registry's enabled plugins join the manifest after its own
//! plugins (discovery order: manifest, user registry, built-ins — npc has
//! no built-in packages). The first registration of a `(kind, id)` wins;
//! a later one is dropped and noted as a [`PluginNotice::Collision`]
//! (`policy = "keep_first"`). A user plugin that does not load is dropped
//! and noted ([`PluginNotice::Dropped`]), never an error of the manifest.

use std::collections::BTreeMap;
use std::path::Path;

use super::Package;
use super::expand::Placeholders;
use super::mcp::Transport;
use super::registry::COLLISION_POLICY;
use crate::model::{
    CommandSpec, DEFAULT_MCP_IDLE_TIMEOUT_S, DEFAULT_STARTUP_TIMEOUT_MS, DEFAULT_TOOL_TIMEOUT_MS,
    Hook, HookEvent, Manifest, McpServer, McpTransport, Plugin, PluginNotice, PluginParts,
    PluginSkill, PluginSource, RestartPolicy, Text,
};

/// The manifest-server name of plugin `plugin`'s server `server`:
/// `PLUGIN__SERVER`, characters other than `A-Za-z0-9_-` replaced by `-`.
pub fn server_id(plugin: &str, server: &str) -> String {
    format!("{plugin}__{server}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// A server of a package that npc does not run, and why.
pub use crate::model::package::SkippedServer as Skipped;

/// The package's MCP servers as manifest servers (`(id, server)`, in file
/// order), with `PLUGIN_ROOT` at the package root and `PLUGIN_DATA` at `data`.
pub fn servers(
    plugin: &str,
    pkg: &Package,
    data: &Path,
) -> (Vec<(String, McpServer)>, Vec<Skipped>) {
    let places = Placeholders {
        root: &pkg.root,
        data,
    };
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    for server in &pkg.servers {
        let transport = match &server.transport {
            Transport::Stdio {
                command,
                args,
                env,
                cwd,
            } => {
                let program = match command.strip_prefix("./") {
                    Some(rel) => pkg.root.join(rel).to_string_lossy().into_owned(),
                    None => command.clone(),
                };
                McpTransport::Stdio(CommandSpec {
                    command: program,
                    args: places
                        .expand_all(args)
                        .into_iter()
                        .map(Text::plain)
                        .collect(),
                    env: super::data::plugin_env(env, &places)
                        .into_iter()
                        .map(|(k, v)| (k, Text::plain(v)))
                        .collect(),
                    cwd: Some(Text::plain(places.cwd(cwd.as_deref()).to_string_lossy())),
                })
            }
            Transport::StreamableHttp { url, headers } => McpTransport::Http {
                url: Text::plain(url.clone()),
                headers: headers
                    .iter()
                    .map(|(k, v)| (k.clone(), Text::plain(v.clone())))
                    .collect(),
                bearer_token_env: None,
            },
            Transport::Sse { .. } => {
                skipped.push(Skipped {
                    server: server.name.clone(),
                    reason: "it uses the legacy `sse` transport, which npc does not run; use `streamable-http`".into(),
                });
                continue;
            }
        };
        out.push((
            server_id(plugin, &server.name),
            McpServer {
                transport,
                enabled: true,
                startup_timeout_ms: DEFAULT_STARTUP_TIMEOUT_MS,
                tool_timeout_ms: DEFAULT_TOOL_TIMEOUT_MS,
                idle_timeout_s: DEFAULT_MCP_IDLE_TIMEOUT_S,
                enabled_tools: None,
                disabled_tools: Vec::new(),
                restart: RestartPolicy::OnFailure,
            },
        ));
    }
    (out, skipped)
}

/// The package's hooks and skills, its data directory at `data`.
pub fn parts(pkg: &Package, data: &Path) -> PluginParts {
    let mut hooks: BTreeMap<HookEvent, Vec<Hook>> = BTreeMap::new();
    if let Some(file) = &pkg.hooks {
        for (event, entries) in &file.hooks {
            let list: Vec<Hook> = entries
                .iter()
                .map(|e| Hook {
                    run: CommandSpec {
                        command: e.command.clone(),
                        args: e.args.iter().cloned().map(Text::plain).collect(),
                        env: e
                            .env
                            .iter()
                            .map(|(k, v)| (k.clone(), Text::plain(v.clone())))
                            .collect(),
                        cwd: e.cwd.clone().map(Text::plain),
                    },
                    timeout_ms: e.timeout_ms,
                    // Package hooks files have no `matcher`: every tool.
                    matcher: None,
                })
                .collect();
            if !list.is_empty() {
                hooks.insert(*event, list);
            }
        }
    }
    PluginParts {
        package: pkg.manifest.name.clone(),
        root: pkg.root.clone(),
        data: data.to_path_buf(),
        hooks,
        skills: pkg
            .skills
            .iter()
            .map(|s| PluginSkill {
                name: s.name.clone(),
                dir: pkg.root.join(&s.dir),
            })
            .collect(),
    }
}

/// One entry of the user registry as lowering sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserPlugin {
    pub name: String,
    /// Canonical package root.
    pub path: std::path::PathBuf,
    pub enabled: bool,
}

/// The user registry's entries, or why it cannot be read.
pub fn registered() -> Result<Vec<UserPlugin>, String> {
    let reg = match super::registry::load() {
        Ok(reg) => reg,
        // No user data directory: no registry, nothing to drop.
        Err(super::registry::RegistryError::Data(super::data::DataError::NoDataDir)) => {
            return Ok(Vec::new());
        }
        Err(e) => return Err(e.to_string()),
    };
    Ok(reg
        .plugins
        .into_iter()
        .map(|(name, e)| UserPlugin {
            name,
            path: e.path,
            enabled: e.enabled,
        })
        .collect())
}

/// Add the enabled user plugins to `m` (after its own plugins): each one
/// that loads joins `m.plugins` and its servers `m.mcp_servers`; every
/// collision and every plugin dropped is noted in `m.plugin_notices`.
/// `validate` reads a package (the real one is [`super::validate`]).
pub fn user_plugins(
    m: &mut Manifest,
    users: &[UserPlugin],
    validate: &dyn Fn(&Path) -> Option<super::Report>,
) {
    for user in users.iter().filter(|u| u.enabled) {
        let path = user.path.to_string_lossy().into_owned();
        if let Some(first) = m.plugins.get(&user.name) {
            m.plugin_notices.push(PluginNotice::Collision {
                kind: "plugin".into(),
                id: user.name.clone(),
                kept: first.source,
                dropped: PluginSource::User,
                dropped_path: path,
                policy: COLLISION_POLICY.into(),
            });
            continue;
        }
        let drop = |m: &mut Manifest, reason: String| {
            m.plugin_notices.push(PluginNotice::Dropped {
                id: user.name.clone(),
                source: PluginSource::User,
                path: path.clone(),
                reason,
            });
        };
        let Some(report) = validate(&user.path) else {
            drop(m, "its package directory cannot be read".into());
            continue;
        };
        let pkg = match &report.package {
            Some(pkg) if report.is_valid() => pkg,
            _ => {
                let first = report.problems.iter().find(|p| p.is_error()).map_or_else(
                    || "it is invalid".to_string(),
                    |p| format!("{}: {}", p.place(), p.message),
                );
                drop(m, format!("{first}; run `npc plugin validate {path}`"));
                continue;
            }
        };
        if pkg.manifest.name != user.name {
            drop(
                m,
                format!(
                    "its package is now named `{}`; reinstall it",
                    pkg.manifest.name
                ),
            );
            continue;
        }
        let data = match super::data::dir_of(&pkg.manifest.name) {
            Ok(d) => d,
            Err(e) => {
                drop(m, e.to_string());
                continue;
            }
        };
        let (servers, skipped) = servers(&user.name, pkg, &data);
        for s in skipped {
            m.plugin_notices.push(PluginNotice::Dropped {
                id: server_id(&user.name, &s.server),
                source: PluginSource::User,
                path: path.clone(),
                reason: s.reason,
            });
        }
        for (id, server) in servers {
            if m.mcp_servers.contains_key(&id) {
                m.plugin_notices.push(PluginNotice::Collision {
                    kind: "mcp_server".into(),
                    id,
                    kept: PluginSource::Manifest,
                    dropped: PluginSource::User,
                    dropped_path: path.clone(),
                    policy: COLLISION_POLICY.into(),
                });
                continue;
            }
            m.mcp_servers.insert(id, server);
        }
        m.plugins.insert(
            user.name.clone(),
            Plugin {
                path,
                enabled: true,
                source: PluginSource::User,
                parts: Some(parts(pkg, &data)),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        struct NoFiles;
        impl crate::model::Files for NoFiles {
            fn read_to_string(&self, _: &Path) -> std::io::Result<String> {
                Err(std::io::ErrorKind::NotFound.into())
            }
            fn is_dir(&self, _: &Path) -> bool {
                false
            }
        }
        let env = BTreeMap::<String, String>::new();
        crate::model::load_bytes(
            "t.toml",
            b"version = 1\n[mcp.servers.kit__echo]\ncommand = \"x\"\n",
            crate::model::Syntax::Toml,
            &env,
            &NoFiles,
        )
        .manifest
        .expect("valid")
    }

    fn package(dir: &Path, name: &str, hooks: bool) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(
            dir.join("plugin.json"),
            serde_json::json!({"$schema": super::super::PLUGIN_SCHEMA_URL, "name": name})
                .to_string(),
        )
        .unwrap();
        std::fs::write(
            dir.join("mcp.json"),
            serde_json::json!({"$schema": super::super::MCP_SCHEMA_URL,
                "mcpServers": {"echo": {"type": "stdio", "command": "python3"}}})
            .to_string(),
        )
        .unwrap();
        if hooks {
            std::fs::create_dir_all(dir.join("dev.npcagent")).unwrap();
            std::fs::write(
                dir.join("dev.npcagent/hooks.json"),
                r#"{"version":1,"hooks":{"before_tool":[{"command":"./deny","args":["${PLUGIN_DATA}/x"]}]}}"#,
            )
            .unwrap();
        }
    }

    fn user(name: &str, path: &Path, enabled: bool) -> UserPlugin {
        UserPlugin {
            name: name.into(),
            path: path.canonicalize().unwrap_or_else(|_| path.into()),
            enabled,
        }
    }

    #[test]
    fn user_plugins_join_after_the_manifests_and_bad_ones_are_dropped_with_a_notice() {
        let tmp = tempfile::tempdir().unwrap();
        package(&tmp.path().join("kit"), "kit", true);
        package(&tmp.path().join("other"), "other", false);
        package(&tmp.path().join("renamed"), "not-the-name", false);
        std::fs::create_dir_all(tmp.path().join("broken")).unwrap();
        std::fs::write(tmp.path().join("broken/plugin.json"), "{").unwrap();
        let mut m = manifest();
        m.plugins.insert(
            "other".into(),
            Plugin {
                path: "x".into(),
                enabled: false,
                source: PluginSource::Manifest,
                parts: None,
            },
        );
        let users = [
            user("kit", &tmp.path().join("kit"), true),
            user("other", &tmp.path().join("other"), true),
            user("renamed", &tmp.path().join("renamed"), true),
            user("broken", &tmp.path().join("broken"), true),
            user("off", &tmp.path().join("kit"), false),
        ];
        user_plugins(&mut m, &users, &|p| crate::plugins::validate(p).ok());
        // `kit` joined; its server collides with the manifest's `kit__echo`.
        let kit = &m.plugins["kit"];
        assert_eq!(kit.source, PluginSource::User);
        let parts = kit.parts.as_ref().unwrap();
        assert_eq!(parts.hooks[&HookEvent::BeforeTool].len(), 1);
        assert_eq!(
            m.mcp_servers["kit__echo"].transport,
            manifest().mcp_servers["kit__echo"].transport
        );
        let kinds: Vec<(String, String)> = m
            .plugin_notices
            .iter()
            .map(|n| match n {
                PluginNotice::Collision {
                    kind, id, policy, ..
                } => {
                    assert_eq!(policy, "keep_first");
                    (format!("collision {kind}"), id.clone())
                }
                PluginNotice::Dropped { id, .. } => ("dropped".into(), id.clone()),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                ("collision mcp_server".to_string(), "kit__echo".to_string()),
                ("collision plugin".to_string(), "other".to_string()),
                ("dropped".to_string(), "renamed".to_string()),
                ("dropped".to_string(), "broken".to_string()),
            ]
        );
        assert!(!m.plugins.contains_key("off"));
        assert_eq!(m.plugins["other"].source, PluginSource::Manifest);
        // Hooks order: the manifest's plugins, then the user registry's.
        assert_eq!(
            m.plugin_parts().iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            ["kit"]
        );
    }

    #[test]
    fn the_hook_set_runs_the_manifests_hooks_then_each_plugins_in_discovery_order() {
        let tmp = tempfile::tempdir().unwrap();
        for name in ["b-user", "a-user"] {
            package(&tmp.path().join(name), name, true);
        }
        let mut m = manifest();
        let hook = crate::model::Hook {
            run: CommandSpec {
                command: "true".into(),
                args: Vec::new(),
                env: BTreeMap::new(),
                cwd: None,
            },
            timeout_ms: 1000,
            matcher: None,
        };
        m.hooks.insert(HookEvent::BeforeTool, vec![hook]);
        // A manifest plugin named after both user ones still runs first.
        package(&tmp.path().join("z-manifest"), "z-manifest", true);
        let pkg = crate::plugins::validate(&tmp.path().join("z-manifest"))
            .unwrap()
            .package
            .unwrap();
        m.plugins.insert(
            "z-manifest".into(),
            Plugin {
                path: "z-manifest".into(),
                enabled: true,
                source: PluginSource::Manifest,
                parts: Some(parts(&pkg, &tmp.path().join("data"))),
            },
        );
        let users = [
            user("b-user", &tmp.path().join("b-user"), true),
            user("a-user", &tmp.path().join("a-user"), true),
        ];
        user_plugins(&mut m, &users, &|p| crate::plugins::validate(p).ok());
        // The order the hook set runs plugin hooks in (after the
        // manifest's own, `hooks::HookSet::for_repository`).
        let order: Vec<(&str, usize)> = m
            .plugin_parts()
            .into_iter()
            .map(|(name, parts)| (name, parts.hooks[&HookEvent::BeforeTool].len()))
            .collect();
        assert_eq!(order, [("z-manifest", 1), ("a-user", 1), ("b-user", 1)]);
    }

    #[test]
    fn server_ids_keep_only_safe_characters() {
        assert_eq!(server_id("kit", "echo"), "kit__echo");
        assert_eq!(server_id("a.b", "c d/e"), "a-b__c-d-e");
    }
}
