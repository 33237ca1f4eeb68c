//! How to start each agent CLI headless with structured output: a
//! [`LaunchPlan`] (program, arguments, environment) built from the
//! manifest's [`Provider`] and one [`LaunchRequest`]. The plan keeps
//! manifest values as [`Text`] so secrets stay redacted in `Debug`; the
//! supervisor calls [`Text::expose`] when it spawns.
//!
//! Flags (checked against `--help` of the versions in
//! `fixtures/clis/VERSIONS.md`):
//! - Claude Code: `claude -p PROMPT --output-format stream-json --verbose
//!   [ARGS] [--model M] [--mcp-config FILE]`
//! - Codex: `codex exec --json [ARGS] [--model M] PROMPT`
//! - Gemini CLI: `gemini [ARGS] -p PROMPT -o stream-json [-m M]`, MCP servers
//!   through `GEMINI_CLI_SYSTEM_SETTINGS_PATH=FILE` (a Gemini `settings.json`)
//! - OpenCode: `opencode run --format json [ARGS] [--model M] PROMPT`, MCP
//!   servers through `OPENCODE_CONFIG=FILE` (an `opencode.json`)
//!
//! `ARGS` are the manifest's `args`. A prompt that starts with `-` is passed
//! after `--` (or as `--prompt=…` for Gemini) so it cannot read as a flag.

use std::collections::BTreeMap;
use std::path::Path;

use crate::model::{Provider, ProviderKind, Text};

/// Environment variable Gemini CLI reads a system settings file from.
pub const GEMINI_SETTINGS_ENV: &str = "GEMINI_CLI_SYSTEM_SETTINGS_PATH";
/// Environment variable OpenCode reads an extra config file from.
pub const OPENCODE_CONFIG_ENV: &str = "OPENCODE_CONFIG";

/// What one run asks of a provider.
#[derive(Debug, Clone, Copy)]
pub struct LaunchRequest<'a> {
    /// The rendered prompt text.
    pub prompt: &'a str,
    /// A model name, passed with the CLI's model flag.
    pub model: Option<&'a str>,
    /// An MCP configuration file npc wrote in this provider's native format.
    pub mcp_config: Option<&'a Path>,
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
        "`codex` has no flag or variable to load an MCP configuration file; `npc apply` writes the manifest's servers into the repository's `.codex/config.toml`, which Codex reads once the project is trusted"
    )]
    McpConfigUnsupported { kind: ProviderKind },
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
            if let Some(file) = req.mcp_config {
                args.extend([lit("--mcp-config"), path_text(file)]);
            }
            if dash_prompt {
                args.extend([lit("--"), lit(req.prompt)]);
            }
        }
        ProviderKind::Codex => {
            if req.mcp_config.is_some() {
                return Err(LaunchError::McpConfigUnsupported {
                    kind: provider.kind,
                });
            }
            args.extend(["exec", "--json"].map(lit));
            args.extend(provider.args.iter().cloned());
            if let Some(m) = req.model {
                args.extend([lit("--model"), lit(m)]);
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
            if let Some(file) = req.mcp_config {
                env.insert(GEMINI_SETTINGS_ENV.to_string(), path_text(file));
            }
        }
        ProviderKind::Opencode => {
            args.extend(["run", "--format", "json"].map(lit));
            args.extend(provider.args.iter().cloned());
            if let Some(m) = req.model {
                args.extend([lit("--model"), lit(m)]);
            }
            if let Some(file) = req.mcp_config {
                env.insert(OPENCODE_CONFIG_ENV.to_string(), path_text(file));
            }
            if dash_prompt {
                args.push(lit("--"));
            }
            args.push(lit(req.prompt));
        }
    }
    Ok(LaunchPlan { program, args, env })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider(kind: ProviderKind) -> Provider {
        Provider {
            kind,
            command: kind.default_command().to_string(),
            args: vec![Text::plain("--extra")],
            env: BTreeMap::from([("API_KEY".to_string(), Text::secret("s3cret"))]),
            version: None,
        }
    }

    fn argv(plan: &LaunchPlan) -> Vec<&str> {
        plan.exposed_args().collect()
    }

    fn full() -> LaunchRequest<'static> {
        LaunchRequest {
            prompt: "fix the bug",
            model: Some("m1"),
            mcp_config: Some(Path::new("/tmp/mcp.json")),
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
                "/tmp/mcp.json"
            ]
        );
    }

    #[test]
    fn codex_uses_exec_json_and_refuses_an_mcp_file() {
        let p = provider(ProviderKind::Codex);
        assert_eq!(
            launch_plan(&p, &full()),
            Err(LaunchError::McpConfigUnsupported {
                kind: ProviderKind::Codex
            })
        );
        let req = LaunchRequest {
            mcp_config: None,
            ..full()
        };
        let plan = launch_plan(&p, &req).unwrap();
        assert_eq!(
            argv(&plan),
            ["exec", "--json", "--extra", "--model", "m1", "fix the bug"]
        );
    }

    #[test]
    fn gemini_uses_prompt_and_stream_json_and_settings_env() {
        let plan = launch_plan(&provider(ProviderKind::GeminiCli), &full()).unwrap();
        assert_eq!(
            argv(&plan),
            [
                "--extra",
                "-p",
                "fix the bug",
                "-o",
                "stream-json",
                "-m",
                "m1"
            ]
        );
        assert_eq!(plan.env[GEMINI_SETTINGS_ENV].expose(), "/tmp/mcp.json");
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
    fn minimal_requests_add_no_optional_flags() {
        let req = LaunchRequest {
            prompt: "hi",
            model: None,
            mcp_config: None,
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
            mcp_config: None,
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
                mcp_config: None,
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
