//! How to start each agent CLI headless with structured output: a
//! [`LaunchPlan`] (program, arguments, environment) built from the
//! manifest's [`Provider`] and one [`LaunchRequest`]. The plan keeps
//! manifest values as [`Text`] so secrets stay redacted in `Debug`; the
//! supervisor calls [`Text::expose`] when it spawns.
//!
//! Flags (checked against `--help` of the versions in
//! `fixtures/clis/VERSIONS.md`):
//! - Claude Code: `claude -p PROMPT --output-format stream-json --verbose
//!   [ARGS] [--model M] [--mcp-config FILE --strict-mcp-config]` (strict: the
//!   run's servers only, not also the project's `.mcp.json`)
//! - Codex: `codex exec --json [ARGS] [--model M] [-c mcp_servers.NAME=TABLE]…
//!   PROMPT` (Codex has no MCP file flag; its `-c` overrides take any config
//!   key, checked for any user)
//! - Gemini CLI: `gemini [ARGS] -p PROMPT -o stream-json [-m M]
//!   [--allowed-mcp-server-names NAME…]`. Gemini 0.61 reads a
//!   `GEMINI_CLI_SYSTEM_SETTINGS_PATH` file only when it and every directory
//!   above it are root-owned and not group/world-writable, so a run's
//!   servers are those of the workspace settings (`.gemini/settings.json` in
//!   the run's directory, which `npc apply` writes) narrowed to the run's
//!   servers by name
//! - OpenCode: `opencode run --format json [ARGS] [--model M] PROMPT`, MCP
//!   servers through `OPENCODE_CONFIG=FILE` (an `opencode.json`)
//!
//! A run's own tool policy ([`RunPolicy`], from the profile) comes first on
//! the command line (Claude Code `--settings JSON`, Gemini CLI `--policy
//! FILE`) or in the environment (OpenCode `OPENCODE_PERMISSION`).
//!
//! `ARGS` are the manifest's `args`. A prompt that starts with `-` is passed
//! after `--` (or as `--prompt=…` for Gemini) so it cannot read as a flag.

use std::collections::BTreeMap;
use std::path::Path;

use crate::model::{Provider, ProviderKind, Text};

/// Environment variable OpenCode reads an extra config file from.
pub const OPENCODE_CONFIG_ENV: &str = "OPENCODE_CONFIG";

/// Environment variable OpenCode merges a `permission` object from, over
/// every config file.
pub const OPENCODE_PERMISSION_ENV: &str = "OPENCODE_PERMISSION";

/// A run's own tool policy, the way one CLI takes it per invocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunPolicy<'a> {
    /// Claude Code: `--settings JSON`.
    Settings { json: &'a str },
    /// Gemini CLI: `--policy FILE`.
    PolicyFile { path: &'a Path },
    /// OpenCode: [`OPENCODE_PERMISSION_ENV`].
    PermissionEnv { json: &'a str },
}

impl LaunchPlan {
    /// The plan with `policy` given to the CLI: its flags first (before any
    /// argument of the manifest's and before the prompt), or its variable.
    pub fn with_policy(mut self, policy: RunPolicy<'_>) -> Self {
        let flags = match policy {
            RunPolicy::Settings { json } => vec![Text::plain("--settings"), Text::plain(json)],
            RunPolicy::PolicyFile { path } => vec![
                Text::plain("--policy"),
                Text::plain(path.to_string_lossy().into_owned()),
            ],
            RunPolicy::PermissionEnv { json } => {
                self.env
                    .insert(OPENCODE_PERMISSION_ENV.to_string(), Text::plain(json));
                Vec::new()
            }
        };
        self.args.splice(0..0, flags);
        self
    }
}

/// What one run asks of a provider.
#[derive(Debug, Clone, Copy)]
pub struct LaunchRequest<'a> {
    /// The rendered prompt text.
    pub prompt: &'a str,
    /// A model name, passed with the CLI's model flag.
    pub model: Option<&'a str>,
    /// The run's own MCP servers, the way the provider takes them
    /// ([`mcp_handoff`]).
    pub mcp: Option<RunMcp<'a>>,
}

/// A run's own MCP servers as handed to one CLI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunMcp<'a> {
    /// A file in the CLI's native format (Claude Code, OpenCode).
    File { path: &'a Path },
    /// Codex `-c` overrides, `mcp_servers.NAME=TABLE` each.
    Overrides { pairs: &'a [String] },
    /// Gemini CLI: the names of the workspace settings' servers it may use.
    Named { names: &'a [String] },
}

/// How a provider takes a run's own MCP servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum McpHandoff {
    /// [`RunMcp::File`]: npc writes a file under the run's directory.
    File,
    /// [`RunMcp::Overrides`]: command-line config overrides, no file.
    Overrides,
    /// [`RunMcp::Named`]: the servers must already be in the workspace
    /// settings of the run's directory (`npc apply` writes them).
    WorkspaceSettings,
}

/// How `kind` takes a run's own MCP servers.
pub fn mcp_handoff(kind: ProviderKind) -> McpHandoff {
    match kind {
        ProviderKind::ClaudeCode | ProviderKind::Opencode => McpHandoff::File,
        ProviderKind::Codex => McpHandoff::Overrides,
        ProviderKind::GeminiCli => McpHandoff::WorkspaceSettings,
    }
}

/// A process to start.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchPlan {
    pub program: String,
    pub args: Vec<Text>,
    /// Variables to add to the child's environment.
    pub env: BTreeMap<String, Text>,
}

impl LaunchPlan {
    /// The real argument values, for the spawner only.
    pub fn exposed_args(&self) -> impl Iterator<Item = &str> {
        self.args.iter().map(Text::expose)
    }

    /// The real environment values, for the spawner only.
    pub fn exposed_env(&self) -> impl Iterator<Item = (&str, &str)> {
        self.env.iter().map(|(k, v)| (k.as_str(), v.expose()))
    }
}

/// Why no launch plan could be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchError {
    #[error(
        "`{}` takes a run's MCP servers as {wanted:?}, not as given; report this as a bug",
        kind.as_str()
    )]
    McpHandoff {
        kind: ProviderKind,
        wanted: McpHandoff,
    },
}

/// The launch plan for one run of `provider`.
pub fn launch_plan(
    provider: &Provider,
    req: &LaunchRequest<'_>,
) -> Result<LaunchPlan, LaunchError> {
    let program = if provider.command.is_empty() {
        provider.kind.default_command().to_string()
    } else {
        provider.command.clone()
    };
    let lit = |s: &str| Text::plain(s);
    let dash_prompt = req.prompt.starts_with('-');
    let mut args: Vec<Text> = Vec::new();
    let mut env: BTreeMap<String, Text> = provider.env.clone();
    let path_text = |p: &Path| Text::plain(p.to_string_lossy().into_owned());
    match provider.kind {
        ProviderKind::ClaudeCode => {
            args.push(lit("-p"));
            if !dash_prompt {
                args.push(lit(req.prompt));
            }
            args.extend(["--output-format", "stream-json", "--verbose"].map(lit));
            args.extend(provider.args.iter().cloned());
            if let Some(m) = req.model {
                args.extend([lit("--model"), lit(m)]);
            }
            if let Some(path) = handed_file(provider.kind, req.mcp)? {
                args.extend([
                    lit("--mcp-config"),
                    path_text(path),
                    lit("--strict-mcp-config"),
                ]);
            }
            if dash_prompt {
                args.extend([lit("--"), lit(req.prompt)]);
            }
        }
        ProviderKind::Codex => {
            args.extend(["exec", "--json"].map(lit));
            args.extend(provider.args.iter().cloned());
            if let Some(m) = req.model {
                args.extend([lit("--model"), lit(m)]);
            }
            match req.mcp {
                None => {}
                Some(RunMcp::Overrides { pairs }) => {
                    for pair in pairs {
                        args.extend([lit("-c"), lit(pair)]);
                    }
                }
                Some(_) => return Err(mismatch(provider.kind)),
            }
            if dash_prompt {
                args.push(lit("--"));
            }
            args.push(lit(req.prompt));
        }
        ProviderKind::GeminiCli => {
            args.extend(provider.args.iter().cloned());
            if dash_prompt {
                args.push(Text::plain(format!("--prompt={}", req.prompt)));
            } else {
                args.extend([lit("-p"), lit(req.prompt)]);
            }
            args.extend(["-o", "stream-json"].map(lit));
            if let Some(m) = req.model {
                args.extend([lit("-m"), lit(m)]);
            }
            match req.mcp {
                None => {}
                Some(RunMcp::Named { names }) => {
                    args.push(lit("--allowed-mcp-server-names"));
                    args.extend(names.iter().map(|n| lit(n)));
                }
                Some(_) => return Err(mismatch(provider.kind)),
            }
        }
        ProviderKind::Opencode => {
            args.extend(["run", "--format", "json"].map(lit));
            args.extend(provider.args.iter().cloned());
            if let Some(m) = req.model {
                args.extend([lit("--model"), lit(m)]);
            }
            if let Some(path) = handed_file(provider.kind, req.mcp)? {
                env.insert(OPENCODE_CONFIG_ENV.to_string(), path_text(path));
            }
            if dash_prompt {
                args.push(lit("--"));
            }
            args.push(lit(req.prompt));
        }
    }
    Ok(LaunchPlan { program, args, env })
}

fn mismatch(kind: ProviderKind) -> LaunchError {
    LaunchError::McpHandoff {
        kind,
        wanted: mcp_handoff(kind),
    }
}

/// The file of a [`RunMcp::File`] handoff (`None`: no servers).
fn handed_file<'a>(
    kind: ProviderKind,
    mcp: Option<RunMcp<'a>>,
) -> Result<Option<&'a Path>, LaunchError> {
    match mcp {
        None => Ok(None),
        Some(RunMcp::File { path }) => Ok(Some(path)),
        Some(_) => Err(mismatch(kind)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider(kind: ProviderKind) -> Provider {
        Provider {
            kind,
            driver: crate::model::ProviderDriver::Headless,
            command: kind.default_command().to_string(),
            args: vec![Text::plain("--extra")],
            env: BTreeMap::from([("API_KEY".to_string(), Text::secret("s3cret"))]),
            version: None,
        }
    }

    fn argv(plan: &LaunchPlan) -> Vec<&str> {
        plan.exposed_args().collect()
    }

    fn full<'a>() -> LaunchRequest<'a> {
        LaunchRequest {
            prompt: "fix the bug",
            model: Some("m1"),
            mcp: Some(RunMcp::File {
                path: Path::new("/tmp/mcp.json"),
            }),
        }
    }

    fn with(mcp: RunMcp<'_>) -> LaunchRequest<'_> {
        LaunchRequest {
            mcp: Some(mcp),
            ..full()
        }
    }

    #[test]
    fn claude_code_uses_print_stream_json_verbose() {
        let plan = launch_plan(&provider(ProviderKind::ClaudeCode), &full()).unwrap();
        assert_eq!(plan.program, "claude");
        assert_eq!(
            argv(&plan),
            [
                "-p",
                "fix the bug",
                "--output-format",
                "stream-json",
                "--verbose",
                "--extra",
                "--model",
                "m1",
                "--mcp-config",
                "/tmp/mcp.json",
                "--strict-mcp-config"
            ]
        );
    }

    #[test]
    fn codex_uses_exec_json_and_takes_servers_as_overrides() {
        let p = provider(ProviderKind::Codex);
        assert_eq!(
            launch_plan(&p, &full()),
            Err(LaunchError::McpHandoff {
                kind: ProviderKind::Codex,
                wanted: McpHandoff::Overrides,
            })
        );
        static PAIRS: [String; 0] = [];
        let pairs = vec![r#"mcp_servers.npc={command="npc"}"#.to_string()];
        let plan = launch_plan(&p, &with(RunMcp::Overrides { pairs: &pairs })).unwrap();
        assert_eq!(
            argv(&plan),
            [
                "exec",
                "--json",
                "--extra",
                "--model",
                "m1",
                "-c",
                r#"mcp_servers.npc={command="npc"}"#,
                "fix the bug"
            ]
        );
        let plan = launch_plan(&p, &with(RunMcp::Overrides { pairs: &PAIRS })).unwrap();
        assert!(!argv(&plan).contains(&"-c"));
    }

    #[test]
    fn gemini_uses_prompt_and_stream_json_and_names_the_servers() {
        let p = provider(ProviderKind::GeminiCli);
        assert!(matches!(
            launch_plan(&p, &full()),
            Err(LaunchError::McpHandoff { .. })
        ));
        let names = vec!["npc".to_string()];
        let plan = launch_plan(&p, &with(RunMcp::Named { names: &names })).unwrap();
        assert_eq!(
            argv(&plan),
            [
                "--extra",
                "-p",
                "fix the bug",
                "-o",
                "stream-json",
                "-m",
                "m1",
                "--allowed-mcp-server-names",
                "npc"
            ]
        );
        assert!(plan.env.keys().all(|k| k == "API_KEY"), "{:?}", plan.env);
    }

    #[test]
    fn opencode_uses_run_format_json_and_config_env() {
        let plan = launch_plan(&provider(ProviderKind::Opencode), &full()).unwrap();
        assert_eq!(
            argv(&plan),
            [
                "run",
                "--format",
                "json",
                "--extra",
                "--model",
                "m1",
                "fix the bug"
            ]
        );
        assert_eq!(plan.env[OPENCODE_CONFIG_ENV].expose(), "/tmp/mcp.json");
    }

    #[test]
    fn a_runs_policy_comes_first_or_in_the_environment() {
        let plan = launch_plan(&provider(ProviderKind::ClaudeCode), &full())
            .unwrap()
            .with_policy(RunPolicy::Settings { json: "{}" });
        assert_eq!(argv(&plan)[..3], ["--settings", "{}", "-p"]);
        let req = LaunchRequest {
            prompt: "hi",
            model: None,
            mcp: None,
        };
        let plan = launch_plan(&provider(ProviderKind::GeminiCli), &req)
            .unwrap()
            .with_policy(RunPolicy::PolicyFile {
                path: Path::new("/run/p.toml"),
            });
        assert_eq!(argv(&plan)[..2], ["--policy", "/run/p.toml"]);
        let plan = launch_plan(&provider(ProviderKind::Opencode), &req)
            .unwrap()
            .with_policy(RunPolicy::PermissionEnv { json: "{}" });
        assert_eq!(plan.env[OPENCODE_PERMISSION_ENV].expose(), "{}");
        assert_eq!(argv(&plan)[0], "run");
    }

    #[test]
    fn minimal_requests_add_no_optional_flags() {
        let req = LaunchRequest {
            prompt: "hi",
            model: None,
            mcp: None,
        };
        for kind in ProviderKind::ALL {
            let plan = launch_plan(&provider(kind), &req).unwrap();
            let args = argv(&plan);
            assert!(
                !args
                    .iter()
                    .any(|a| *a == "--model" || *a == "-m" || *a == "--mcp-config"),
                "{kind:?}: {args:?}"
            );
            assert!(args.contains(&"hi"));
        }
    }

    #[test]
    fn dash_prompts_cannot_read_as_flags() {
        let req = LaunchRequest {
            prompt: "--help",
            model: None,
            mcp: None,
        };
        let last_two = |kind| {
            let plan = launch_plan(&provider(kind), &req).unwrap();
            let a: Vec<String> = plan.exposed_args().map(str::to_string).collect();
            a[a.len() - 2..].to_vec()
        };
        assert_eq!(last_two(ProviderKind::ClaudeCode), ["--", "--help"]);
        assert_eq!(last_two(ProviderKind::Codex), ["--", "--help"]);
        assert_eq!(last_two(ProviderKind::Opencode), ["--", "--help"]);
        let plan = launch_plan(&provider(ProviderKind::GeminiCli), &req).unwrap();
        assert!(argv(&plan).contains(&"--prompt=--help"));
    }

    #[test]
    fn secrets_stay_redacted_in_debug_and_an_empty_command_uses_the_default() {
        let mut p = provider(ProviderKind::Codex);
        p.command.clear();
        let plan = launch_plan(
            &p,
            &LaunchRequest {
                prompt: "x",
                model: None,
                mcp: None,
            },
        )
        .unwrap();
        assert_eq!(plan.program, "codex");
        let dbg = format!("{plan:?}");
        assert!(!dbg.contains("s3cret"), "{dbg}");
        assert_eq!(
            plan.exposed_env().collect::<Vec<_>>(),
            [("API_KEY", "s3cret")]
        );
    }
}
