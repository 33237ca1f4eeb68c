//! The four real agent CLIs (Claude Code, Codex, Gemini CLI, OpenCode)
//! driven by `npc run` through one real turn each against the scripted
//! model server (`fixtures/model/scripted.py`, on 127.0.0.1): the profile
//! in gateway mode with `@modelcontextprotocol/server-everything` as the
//! upstream server, every CLI in a throwaway `HOME` of its own (its model
//! provider and trust set up there, as a user behind a model gateway would;
//! see docs/guide/providers.md). Each scenario checks npc's
//! event log and what reached the model: `echo` called through the gateway
//! (`mcp.tool_call`) with its text in the next request; `echo` denied by
//! npc's native hook bridge (`hook.call` under the CLI's own tool name) with
//! the denial in the next request; and no `unknown_event` in the parsed
//! stream. Two more per CLI: npc's rules file, command and subagent offered
//! in the request that reaches the model (each CLI's own kinds), and a
//! worktree run (through the daemon) whose edit, made by the CLI's own
//! shell tool, lands on the run's branch. A missing CLI skips its tests with a message, and fails them
//! under `CI=true` (CI installs the CLIs).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::support::{Peer, Stopped, WAIT_LIMIT, npc_path, repo_root, require, wait_for};

/// Longest one `npc run` of a real CLI may take (OpenCode's first start
/// installs nothing but reads its model list; each turn is two requests).
const RUN_TIMEOUT: Duration = Duration::from_secs(120);
/// The shell command OpenCode's rule refuses.
const REFUSED_COMMAND: &str = "printf refused";
/// The text the model asks `echo` to echo.
const ECHO_TOKEN: &str = "npc-real-cli-echo";
/// The reason the denying hook gives.
const DENIAL: &str = "npc-test-denied-echo";
/// The gateway's name for the upstream tool (`SERVER__TOOL`).
const GATEWAY_ECHO: &str = "everything__echo";
/// The account a non-root run borrows (`nobody`), as `setpriv` takes it.
const OTHER_USER: u32 = 65534;

/// One CLI under test: its provider kind and program.
#[derive(Debug, Clone, Copy)]
struct Cli {
    kind: &'static str,
    program: &'static str,
}

const CLAUDE: Cli = Cli {
    kind: "claude_code",
    program: "claude",
};
const CODEX: Cli = Cli {
    kind: "codex",
    program: "codex",
};
const GEMINI: Cli = Cli {
    kind: "gemini_cli",
    program: "gemini",
};
const OPENCODE: Cli = Cli {
    kind: "opencode",
    program: "opencode",
};

/// Whether `cli` and the global `@modelcontextprotocol/server-everything`
/// it is given are installed ([`require`]).
fn installed(cli: Cli) -> bool {
    require(Peer::program(cli.program, NPM_CLIS))
        && require(Peer::file(
            "the global npm package `@modelcontextprotocol/server-everything`",
            &everything_entry(),
            "npm install -g @modelcontextprotocol/server-everything",
        ))
}

/// How the agent CLIs are installed.
const NPM_CLIS: &str =
    "npm install -g @anthropic-ai/claude-code @openai/codex @google/gemini-cli opencode-ai";

/// The global npm root (`npm root -g`), asked once.
fn npm_root() -> &'static Path {
    static ROOT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ROOT.get_or_init(|| {
        let out = Command::new("npm")
            .args(["root", "-g"])
            .stderr(Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()),
            _ => PathBuf::from("/usr/lib/node_modules"),
        }
    })
}

fn everything_entry() -> PathBuf {
    npm_root().join("@modelcontextprotocol/server-everything/dist/index.js")
}

/// The scripted model server: its port and the requests it recorded.
struct Model {
    _child: Stopped,
    port: u16,
    record: PathBuf,
}

impl Model {
    /// A server that calls the offered tool ending in `tool` with `args`.
    fn start(dir: &Path, tool: &str, args: &Value) -> Self {
        let port_file = dir.join("model.port");
        let record = dir.join("model.jsonl");
        let child = Command::new("python3")
            .arg(repo_root().join("fixtures/model/scripted.py"))
            .arg("--port-file")
            .arg(&port_file)
            .arg("--record")
            .arg(&record)
            .args(["--tool", tool, "--args", &args.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("python3 runs the scripted model server");
        let child = Stopped::new(child);
        let port = wait_for("the scripted model's port", || {
            std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|p| p.trim().parse().ok())
        });
        Self {
            _child: child,
            port,
            record,
        }
    }

    /// Every request body, in order.
    fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.record)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .map(|r| r["body"].clone())
            .collect()
    }
}

/// Every tool name a request offers, whatever the dialect (Anthropic and
/// chat-completions `tools[].name`/`function.name`, Responses namespaces,
/// Gemini `functionDeclarations`).
fn offered_tools(body: &Value) -> Vec<String> {
    let mut names = Vec::new();
    for tool in body["tools"].as_array().into_iter().flatten() {
        for inner in tool["tools"].as_array().into_iter().flatten() {
            names.push(format!(
                "{}{}",
                tool["name"].as_str().unwrap_or(""),
                inner["name"].as_str().unwrap_or("")
            ));
        }
        for decl in tool["functionDeclarations"]
            .as_array()
            .into_iter()
            .flatten()
        {
            names.extend(decl["name"].as_str().map(str::to_string));
        }
        names.extend(tool["name"].as_str().map(str::to_string));
        names.extend(tool["function"]["name"].as_str().map(str::to_string));
    }
    names
}

/// A repository and a home of one CLI's run, with the model it talks to.
struct Setup {
    cli: Cli,
    repo: tempfile::TempDir,
    home: tempfile::TempDir,
    model: Model,
    /// Run npc (and so the CLI) as this uid, owner of the repository and
    /// the home, through `setpriv`.
    user: Option<u32>,
    /// More arguments for the CLI (the provider's `args`).
    provider_args: &'static [&'static str],
    /// The CLI is not allowed the call (no `--allowedTools` for Claude
    /// Code, no `--yolo` for Gemini CLI, a `deny` rule for OpenCode).
    refuse: bool,
    /// The provider has `driver = "acp"` (npc speaks ACP to the CLI's ACP
    /// program; its permission questions are npc's to answer).
    acp: bool,
    /// More lines of the profile (`denied_tools = …`).
    profile_extra: String,
}

/// What the scripted model asks for, and what the CLI needs to allow it.
struct Script {
    /// The offered tool (by name suffix) the model calls.
    tool: &'static str,
    args: Value,
    /// More provider `args` (a permission the call needs).
    provider_args: &'static [&'static str],
}

impl Setup {
    /// The repository (a git checkout) with a gateway-mode manifest whose
    /// profile `agent` uses `cli`; `hooks` is appended to the manifest.
    /// The CLI's home is set up to reach the model and trust the
    /// repository; `npc apply` writes the agent files.
    fn new(cli: Cli, hooks: &str) -> Self {
        Self::new_as(cli, hooks, None)
    }

    /// [`Setup::new`] for `user` (`None`: this process's).
    fn new_as(cli: Cli, hooks: &str, user: Option<u32>) -> Self {
        Self::scripted(cli, hooks, user, echo_script())
    }

    /// [`Setup::new_as`] with the model calling `script`'s tool.
    fn scripted(cli: Cli, hooks: &str, user: Option<u32>, script: Script) -> Self {
        Self::scripted_with(cli, hooks, user, script, false)
    }

    /// [`Setup::new`] where the CLI itself refuses the call ([`Setup::refuse`]):
    /// `echo`, but OpenCode's `bash` (OpenCode hides a tool a rule denies
    /// whole, and takes patterns for `bash`).
    fn refusing(cli: Cli) -> Self {
        let script = if cli.kind == "opencode" {
            Script {
                tool: "bash",
                args: serde_json::json!({"command": REFUSED_COMMAND, "description": "print"}),
                provider_args: &[],
            }
        } else {
            Script {
                tool: "echo",
                args: serde_json::json!({ "message": ECHO_TOKEN }),
                provider_args: &[],
            }
        };
        Self::scripted_with(cli, "", None, script, true)
    }

    fn scripted_with(
        cli: Cli,
        hooks: &str,
        user: Option<u32>,
        script: Script,
        refuse: bool,
    ) -> Self {
        Self::build(cli, hooks, user, script, refuse, false, "")
    }

    /// A setup whose provider has `driver = "acp"`, the model calling
    /// `script`'s tool, the profile with `profile_extra` lines.
    pub(crate) fn acp(cli: Cli, script: Script, profile_extra: &str) -> Self {
        Self::build(cli, "", None, script, false, true, profile_extra)
    }

    fn build(
        cli: Cli,
        hooks: &str,
        user: Option<u32>,
        script: Script,
        refuse: bool,
        acp: bool,
        profile_extra: &str,
    ) -> Self {
        let repo = tempfile::tempdir().unwrap();
        let home = tempfile::tempdir().unwrap();
        let model = Model::start(home.path(), script.tool, &script.args);
        let root = repo.path().canonicalize().unwrap();
        let git = Command::new("git")
            .args(["init", "-q", "."])
            .current_dir(&root)
            .status()
            .expect("git runs");
        assert!(git.success());
        let this = Self {
            cli,
            repo,
            home,
            model,
            user,
            provider_args: script.provider_args,
            refuse,
            acp,
            profile_extra: profile_extra.to_string(),
        };
        this.write_home(&root);
        let manifest = format!(
            "version = 1\n[mcp]\ngateway = true\n\n[mcp.servers.everything]\ncommand = \"node\"\nargs = [{everything:?}]\n\n{provider}\n[profiles.agent]\nprovider = \"p\"\ndescription = \"the real CLI under test\"\nmcp_servers = [\"everything\"]\n{extra}\n{hooks}",
            everything = everything_entry().to_string_lossy(),
            provider = this.provider(),
            extra = this.profile_extra,
        );
        std::fs::write(root.join("npcagent.toml"), manifest).unwrap();
        if let Some(uid) = user {
            give(&root, uid);
            give(this.home.path(), uid);
        }
        std::fs::write(
            root.join("deny.py"),
            format!(
                "import json, sys\njson.load(sys.stdin)\nprint(json.dumps({{\"decision\": \"deny\", \"reason\": \"{DENIAL}\"}}))\n"
            ),
        )
        .unwrap();
        let out = this.npc(&["apply", "--auto-approve"]).output().unwrap();
        assert!(
            out.status.success(),
            "npc apply failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if cli.kind == "codex" && hooks.contains("[[hooks.") {
            this.review_codex_hooks(&root);
        }
        this
    }

    /// Store Codex's review of the project's hooks the way its `/hooks`
    /// does (`hooks.state."KEY".trusted_hash` in its `config.toml`), with
    /// the keys and hashes its own `app-server` reports (`hooks/list`).
    fn review_codex_hooks(&self, root: &Path) {
        let mut child = Command::new("codex")
            .arg("app-server")
            .current_dir(root)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.home.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("codex app-server starts");
        let requests = [
            serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"clientInfo": {"name": "npc-test", "version": "0"}}}),
            serde_json::json!({"jsonrpc": "2.0", "method": "initialized"}),
            serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "hooks/list", "params": {"cwds": [root]}}),
        ];
        let mut stdin = child.stdin.take().unwrap();
        for r in requests {
            writeln!(stdin, "{r}").unwrap();
        }
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
                let Ok(line) = line else { break };
                if let Ok(v) = serde_json::from_str::<Value>(&line)
                    && v["id"] == 2
                {
                    let _ = tx.send(v);
                    break;
                }
            }
        });
        let answer = rx
            .recv_timeout(WAIT_LIMIT)
            .expect("codex answers hooks/list");
        let _ = child.kill();
        let _ = child.wait();
        drop(stdin);
        let mut config = std::fs::OpenOptions::new()
            .append(true)
            .open(self.home.path().join(".codex/config.toml"))
            .unwrap();
        let hooks = answer["result"]["data"][0]["hooks"].as_array().unwrap();
        assert!(!hooks.is_empty(), "{answer}");
        for hook in hooks {
            writeln!(
                config,
                "\n[hooks.state.{:?}]\ntrusted_hash = {:?}",
                hook["key"].as_str().unwrap(),
                hook["currentHash"].as_str().unwrap()
            )
            .unwrap();
        }
        // `npc doctor` reads the review as Codex does.
        let out = self.npc(&["doctor", "--format", "json"]).output().unwrap();
        let reports: Value = serde_json::from_slice(&out.stdout).unwrap();
        let codex = reports
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["kind"] == "codex")
            .unwrap_or_else(|| panic!("no codex report: {reports:#}"));
        let checks = codex["checks"].as_array().unwrap();
        for name in ["project_trust", "hook_trust"] {
            let check = checks.iter().find(|c| c["check"] == name).unwrap();
            assert_eq!(check["status"], "ok", "{check}");
        }
    }

    fn root(&self) -> PathBuf {
        self.repo.path().canonicalize().unwrap()
    }

    fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.model.port)
    }

    /// The `[providers.p]` table: what the CLI needs in its environment
    /// (`npc run` clears it) and on its command line.
    fn provider(&self) -> String {
        let url = self.base_url();
        let (env, args) = match self.cli.kind {
            "claude_code" => (
                format!(
                    "ANTHROPIC_BASE_URL = \"{url}\", ANTHROPIC_API_KEY = \"sk-scripted\", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC = \"1\""
                ),
                if self.refuse {
                    ""
                } else {
                    "\"--allowedTools\", \"mcp__npc__everything__echo\""
                },
            ),
            // The project's hooks run once reviewed: see `review_codex_hooks`.
            "codex" => ("SCRIPTED_API_KEY = \"sk-scripted\"".to_string(), ""),
            "gemini_cli" => (
                format!("GOOGLE_GEMINI_BASE_URL = \"{url}\", GEMINI_API_KEY = \"scripted\""),
                if self.refuse { "" } else { "\"--yolo\"" },
            ),
            _ => (String::new(), ""),
        };
        // An ACP program takes no headless flags: npc answers its
        // permission questions.
        let mut args: Vec<String> = (!args.is_empty() && !self.acp)
            .then(|| args.to_string())
            .into_iter()
            .collect();
        args.extend(self.provider_args.iter().map(|a| format!("{a:?}")));
        format!(
            "[providers.p]\nkind = \"{}\"\n{}env = {{ {env} }}\nargs = [{}]\n",
            self.cli.kind,
            if self.acp { "driver = \"acp\"\n" } else { "" },
            args.join(", ")
        )
    }

    /// The CLI's user-level files in the throwaway home.
    fn write_home(&self, root: &Path) {
        let home = self.home.path();
        let url = self.base_url();
        let write = |rel: &str, text: String| {
            let path = home.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        match self.cli.kind {
            "codex" => write(
                ".codex/config.toml",
                format!(
                    "model = \"scripted-model\"\nmodel_provider = \"scripted\"\n\n[model_providers.scripted]\nname = \"scripted\"\nbase_url = \"{url}/v1\"\nenv_key = \"SCRIPTED_API_KEY\"\nwire_api = \"responses\"\n\n[projects.{root:?}]\ntrust_level = \"trusted\"\n",
                    root = root.to_string_lossy()
                ),
            ),
            "gemini_cli" => {
                if self.refuse {
                    // A user policy that denies this call of the gateway's
                    // `echo` (its arguments), leaving the tool offered.
                    write(
                        ".gemini/policies/deny-echo.toml",
                        format!(
                            "[[rule]]\nmcpName = \"npc\"\ntoolName = \"{GATEWAY_ECHO}\"\nargsPattern = \"{ECHO_TOKEN}\"\ndecision = \"deny\"\npriority = 900\n"
                        ),
                    );
                }
                write(
                    ".gemini/settings.json",
                    r#"{"security": {"auth": {"selectedType": "gemini-api-key"}}}"#.to_string(),
                );
                write(
                    ".gemini/trustedFolders.json",
                    serde_json::json!({ root.to_string_lossy(): "TRUST_FOLDER" }).to_string(),
                );
            }
            "opencode" => {
                let mut config = serde_json::json!({
                    "provider": {"scripted": {
                        "npm": "@ai-sdk/openai-compatible",
                        "name": "scripted",
                        "options": {"baseURL": format!("{url}/v1"), "apiKey": "sk-scripted"},
                        "models": {"scripted-model": {"name": "scripted-model"}}
                    }},
                    "model": "scripted/scripted-model"
                });
                if self.refuse {
                    config["permission"] = serde_json::json!({
                        "bash": { "*": "allow", "printf *": "deny" }
                    });
                }
                write(".config/opencode/opencode.json", config.to_string())
            }
            _ => {}
        }
    }

    /// `npc ARGS` in the repository with the throwaway home, npc first on
    /// `PATH` (the agent files start `npc mcp serve` and `npc hook run`).
    fn npc(&self, args: &[&str]) -> Command {
        let mut cmd = match self.user {
            None => Command::new(npc_path()),
            Some(uid) => {
                let mut c = Command::new("setpriv");
                c.args([
                    format!("--reuid={uid}"),
                    format!("--regid={uid}"),
                    "--clear-groups".to_string(),
                ])
                .arg(npc_path());
                c
            }
        };
        cmd.args(args)
            .current_dir(self.root())
            .env("PATH", path_with_npc())
            .env("HOME", self.home.path())
            .env("XDG_DATA_HOME", self.home.path().join(".local/share"))
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("CODEX_HOME")
            .stdin(Stdio::null());
        cmd
    }

    /// A daemon holding the repository, with the CLI's home and npc first
    /// on `PATH` as its only environment.
    fn daemon(&self) -> crate::support::Daemon {
        let path = path_with_npc();
        let home = self.home.path().to_str().unwrap().to_string();
        let env = [("PATH", path.to_str().unwrap()), ("HOME", home.as_str())];
        crate::support::Daemon::start_in_with(
            &self.root(),
            crate::support::DaemonSetup {
                only_env: Some(&env),
                ..Default::default()
            },
        )
    }

    /// `npc run agent --prompt PROMPT --format json` started, its output
    /// piped.
    fn spawn_run(&self, prompt: &str) -> std::process::Child {
        let timeout = RUN_TIMEOUT.as_secs().to_string();
        self.npc(&[
            "run",
            "agent",
            "--prompt",
            prompt,
            "--format",
            "json",
            "--timeout",
            &timeout,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
    }

    /// `npc run agent` to its end: the run's agent events (`--format json`).
    fn run(&self) -> Vec<Value> {
        self.run_ending(0)
    }

    /// [`Setup::run`], which must exit `code`.
    fn run_ending(&self, code: i32) -> Vec<Value> {
        self.run_ending_one_of(&[code])
    }

    /// [`Setup::run`], which must exit with one of `codes`.
    fn run_ending_one_of(&self, codes: &[i32]) -> Vec<Value> {
        let timeout = RUN_TIMEOUT.as_secs().to_string();
        let out = self
            .npc(&[
                "run",
                "agent",
                "--prompt",
                "call the echo tool",
                "--format",
                "json",
                "--timeout",
                &timeout,
            ])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.code().is_some_and(|c| codes.contains(&c)),
            "{}: npc run ended otherwise ({}):\n{stdout}\n{}",
            self.cli.program,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Every event of the store.
    fn events(&self) -> Vec<Value> {
        let store =
            npcagent::store::Store::open_read_only(self.root().join(".npc/state.db")).unwrap();
        store
            .events_since(0, 100_000)
            .unwrap()
            .iter()
            .map(|e| serde_json::to_value(e).unwrap())
            .collect()
    }

    /// The requests that offered the gateway's `echo` (the agent's turns,
    /// not a title or routing call), and the last one (after the tool).
    fn turns(&self) -> Vec<Value> {
        self.model
            .requests()
            .into_iter()
            .filter(|b| offered_tools(b).iter().any(|t| t.ends_with(GATEWAY_ECHO)))
            .collect()
    }
}

/// `PATH` with npc's directory first: the agent files start `npc mcp serve`
/// and `npc hook run` by name.
fn path_with_npc() -> std::ffi::OsString {
    let mut dirs = vec![npc_path().parent().unwrap().to_path_buf()];
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(dirs).unwrap()
}

/// Make `path` and everything under it `uid`'s (links not followed).
fn give(path: &Path, uid: u32) {
    let id = Some(nix::unistd::Uid::from_raw(uid));
    let gid = Some(nix::unistd::Gid::from_raw(uid));
    nix::unistd::fchownat(
        nix::fcntl::AT_FDCWD,
        path,
        id,
        gid,
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .unwrap();
    if path.is_dir() && !path.is_symlink() {
        for entry in std::fs::read_dir(path).unwrap() {
            give(&entry.unwrap().path(), uid);
        }
    }
}

/// Whether this process may run npc and the CLIs as [`OTHER_USER`]: root,
/// `setpriv`, and an npc binary every account may run.
fn can_switch_user() -> bool {
    use std::os::unix::fs::PermissionsExt;
    let world_runs = |p: &Path| {
        p.ancestors()
            .skip(1)
            .all(|d| std::fs::metadata(d).is_ok_and(|m| m.permissions().mode() & 0o001 != 0))
            && std::fs::metadata(p).is_ok_and(|m| m.permissions().mode() & 0o001 != 0)
    };
    require(Peer::condition(
        "root (to act as another account)",
        nix::unistd::getuid().is_root(),
        "run the suite as root, as CI does",
    )) && require(Peer::program("setpriv", "apt-get install util-linux"))
        && require(Peer::condition(
            &format!(
                "an npc binary other accounts may run ({})",
                npc_path().display()
            ),
            world_runs(&npc_path()),
            "build in a directory every account may enter",
        ))
}

/// The checks every scenario shares: the run finished (`succeeded`, or
/// `blocked` exactly when a denial of it was recorded) with no unknown
/// event and no drift, the agent was offered the gateway's `echo` and no raw server's,
/// and a later turn carried `expect` (the tool's result) to the model.
fn check_turn(s: &Setup, events: &[Value], expect: &str) {
    let who = s.cli.program;
    assert!(
        !events.iter().any(|e| e["kind"] == "unknown_event"),
        "{who}: npc met an event it does not know: {events:#?}"
    );
    // The drift guard is armed for every CLI, and the real stream is the
    // recorded format: no switch to a fallback strategy.
    assert!(
        !events
            .iter()
            .any(|e| e["type"] == "cli_detection.drift_detected"),
        "{who}: the real stream was taken for drift: {events:#?}"
    );
    let stored = s.events();
    let finished = stored
        .iter()
        .find(|e| e["kind"] == "run.finished")
        .expect("run.finished");
    let denied = stored.iter().any(|e| e["kind"] == "tool.denied");
    let outcome = if denied { "blocked" } else { "succeeded" };
    assert_eq!(finished["payload"]["outcome"], outcome, "{who}: {finished}");
    let turns = s.turns();
    assert!(
        turns.len() >= 2,
        "{who}: {} turns reached the model",
        turns.len()
    );
    for turn in &turns {
        let echoes: Vec<String> = offered_tools(turn)
            .into_iter()
            .filter(|t| t.ends_with("echo"))
            .collect();
        assert!(
            echoes
                .iter()
                .all(|t| t.ends_with(GATEWAY_ECHO) && t.contains("npc")),
            "{who}: the agent was offered a server beside the gateway: {echoes:?}"
        );
    }
    let last = turns.last().unwrap().to_string();
    assert!(
        last.contains(expect),
        "{who}: the model never saw `{expect}`: {last}"
    );
}

/// (a) and (c): `echo` through the gateway, recorded, its text at the model.
fn echo_through_the_gateway(cli: Cli) {
    echo_through_the_gateway_as(cli, None);
}

/// [`echo_through_the_gateway`] with npc and the CLI run as `user`.
fn echo_through_the_gateway_as(cli: Cli, user: Option<u32>) {
    if !installed(cli) {
        return;
    }
    let s = Setup::new_as(cli, "", user);
    let events = s.run();
    check_turn(&s, &events, &format!("Echo: {ECHO_TOKEN}"));
    let stored = s.events();
    assert!(
        !stored.iter().any(|e| e["kind"] == "tool.denied"),
        "{}: a denial in a run that was allowed its call",
        cli.program
    );
    let call = stored
        .iter()
        .find(|e| e["kind"] == "mcp.tool_call" && e["payload"]["name"] == GATEWAY_ECHO)
        .unwrap_or_else(|| panic!("{}: no mcp.tool_call of echo", cli.program));
    assert_eq!(call["payload"]["outcome"], "ok", "{call}");
    assert_eq!(
        call["payload"]["arguments"]["message"], ECHO_TOKEN,
        "{call}"
    );
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "agent.message" || e["type"] == "agent.idle"),
        "{}: {events:#?}",
        cli.program
    );
}

/// (b): `echo` denied by the native hook bridge before the gateway saw it.
fn echo_denied_by_the_native_hook(cli: Cli) {
    if !installed(cli) {
        return;
    }
    let hooks = "\n[[hooks.before_tool]]\ncommand = \"python3\"\nargs = [\"deny.py\"]\nmatcher = \"echo\"\n";
    let s = Setup::new(cli, hooks);
    // Claude Code and Gemini CLI report the call their hook denied as their
    // own refusal: the run is `blocked`, exit 3 (the others once the hook's
    // denial is an event); `check_turn` holds it to what was recorded.
    let events = match cli.kind {
        "claude_code" | "gemini_cli" => s.run_ending(3),
        _ => s.run_ending_one_of(&[0, 3]),
    };
    check_turn(&s, &events, DENIAL);
    let stored = s.events();
    let denied: Vec<&Value> = stored
        .iter()
        .filter(|e| e["kind"] == "hook.call" && e["payload"]["decision"] == "deny")
        .collect();
    assert!(
        denied.iter().any(|e| {
            let tool = e["payload"]["tool"].as_str().unwrap_or("");
            tool != GATEWAY_ECHO && tool.ends_with(GATEWAY_ECHO)
        }),
        "{}: no denial under the CLI's own tool name (the native bridge): {denied:#?}",
        cli.program
    );
    assert!(
        !stored
            .iter()
            .any(|e| e["kind"] == "mcp.tool_call" && e["payload"]["outcome"] == "ok"),
        "{}: the denied call reached the server",
        cli.program
    );
    // The bridge's denial is a `tool.denied` of the run, with the hook.
    let run = events
        .iter()
        .find_map(|e| e["run_id"].as_str())
        .expect("the run's id");
    assert!(
        denials_of(&stored, run).iter().any(|d| d["by"] == "hook"
            && d["tool"]
                .as_str()
                .is_some_and(|t| t.ends_with(GATEWAY_ECHO))
            && d["reason"] == DENIAL
            && d["rule"].as_str().is_some_and(|r| !r.is_empty())),
        "{}: no tool.denied by the hook bridge: {stored:#?}",
        cli.program
    );
}

/// An `ask` of a real Claude Code run (a `before_tool` hook answering
/// `ask` for `echo`) parks the daemon's run until `npc runs approve`
/// answers; then the call goes through and the run succeeds.
#[test]
fn claude_ask_parks_the_run_and_npc_runs_approve_lets_echo_run() {
    if !installed(CLAUDE) {
        return;
    }
    let hooks =
        "\n[[hooks.before_tool]]\ncommand = \"python3\"\nargs = [\"ask.py\"]\nmatcher = \"echo\"\n";
    let s = Setup::new(CLAUDE, hooks);
    std::fs::write(
        s.root().join("ask.py"),
        "import json, sys\njson.load(sys.stdin)\nprint(json.dumps({\"decision\": \"ask\", \"reason\": \"echo needs a person\"}))\n",
    )
    .unwrap();
    let _daemon = s.daemon();
    let mut run = s.spawn_run("call the echo tool");
    let state = |id: Option<&str>| -> Option<(String, String)> {
        let out = s.npc(&["runs", "--format", "json"]).output().unwrap();
        let rows: Value = serde_json::from_slice(&out.stdout).ok()?;
        rows.as_array()?
            .iter()
            .find(|r| {
                id.is_none_or(|id| r["id"] == id) && (id.is_some() || r["state"] == "waiting")
            })
            .map(|r| {
                (
                    r["id"].as_str().unwrap_or("").to_string(),
                    r["state"].as_str().unwrap_or("").to_string(),
                )
            })
    };
    let (id, _) = wait_for("the Claude run to wait for an approval", || state(None));
    // Parked: the call has not reached the server.
    assert!(
        !s.events()
            .iter()
            .any(|e| e["kind"] == "mcp.tool_call" && e["payload"]["outcome"] == "ok"),
        "the call went through before anyone answered"
    );
    let waiting: Vec<Value> = s
        .events()
        .into_iter()
        .filter(|e| e["kind"] == "run.waiting")
        .collect();
    assert!(
        waiting[0]["payload"]["tool"]
            .as_str()
            .unwrap()
            .ends_with(GATEWAY_ECHO),
        "{waiting:?}"
    );
    assert_eq!(waiting[0]["payload"]["arguments"]["message"], ECHO_TOKEN);
    // Answer every ask of the run (the CLI's hook asks; the gateway's
    // stage applies the same hook to the call it forwards) until it ends.
    let mut approved = 0;
    let status = wait_for("the approved Claude run to end", || {
        if let Some(status) = run.try_wait().unwrap() {
            return Some(status);
        }
        if state(Some(&id)).is_some_and(|(_, st)| st == "waiting") {
            let out = s.npc(&["runs", "approve", &id]).output().unwrap();
            approved += usize::from(out.status.success());
        }
        None
    });
    let mut stdout = String::new();
    std::io::Read::read_to_string(run.stdout.as_mut().unwrap(), &mut stdout).unwrap();
    assert!(status.success(), "{status}: {stdout}");
    assert!(approved >= 1);
    let events: Vec<Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    check_turn(&s, &events, &format!("Echo: {ECHO_TOKEN}"));
    let stored = s.events();
    assert!(
        stored
            .iter()
            .any(|e| e["kind"] == "mcp.tool_call" && e["payload"]["outcome"] == "ok"),
        "the approved call never reached the server"
    );
    assert!(
        stored
            .iter()
            .filter(|e| e["kind"] == "run.approval")
            .all(|e| e["payload"]["decision"] == "allow" && e["payload"]["run_id"] == id.as_str())
    );
}

#[test]
fn claude_calls_echo_through_the_gateway() {
    echo_through_the_gateway(CLAUDE);
}

#[test]
fn claude_echo_is_denied_by_the_native_hook() {
    echo_denied_by_the_native_hook(CLAUDE);
}

#[test]
fn codex_calls_echo_through_the_gateway() {
    echo_through_the_gateway(CODEX);
}

#[test]
fn codex_echo_is_denied_by_the_native_hook() {
    echo_denied_by_the_native_hook(CODEX);
}

#[test]
fn gemini_calls_echo_through_the_gateway() {
    echo_through_the_gateway(GEMINI);
}

#[test]
fn gemini_echo_is_denied_by_the_native_hook() {
    echo_denied_by_the_native_hook(GEMINI);
}

#[test]
fn opencode_calls_echo_through_the_gateway() {
    echo_through_the_gateway(OPENCODE);
}

#[test]
fn opencode_echo_is_denied_by_the_native_hook() {
    echo_denied_by_the_native_hook(OPENCODE);
}

/// A run's servers reach every CLI for a user other than root too (Gemini
/// once skipped npc's per-run settings file for every non-root user).
#[test]
fn every_cli_gets_the_gateway_as_a_non_root_user() {
    if !can_switch_user() {
        return;
    }
    for cli in [CLAUDE, CODEX, GEMINI, OPENCODE] {
        echo_through_the_gateway_as(cli, Some(OTHER_USER));
    }
}

/// Rules, a command and a subagent npc writes for the repository (each
/// with a token to look for in what reaches the model).
const AGENT_CONFIG: &str = r#"
[instructions]
template = "Rules token: npc-rules-7f3a."

[prompts.npc-review]
template = "npc-command-91bc: review {{ vars.target }}"
command = true
description = "npc-command-desc-91bc"
[prompts.npc-review.variables]
target = { description = "what to review" }

[prompts.helper-body]
template = "You are npc-subagent-body-5d2e."

[profiles.npc-helper]
provider = "p"
description = "npc-subagent-desc-5d2e"
prompt = "helper-body"
"#;
/// The `[instructions]` text, in the rules file every CLI reads.
const RULES_TOKEN: &str = "npc-rules-7f3a";
/// The command's name and description, in Claude Code's list of commands.
const COMMAND_TOKENS: [&str; 2] = ["npc-review", "npc-command-desc-91bc"];
/// The subagent's name and description, in each CLI's list of agents.
const SUBAGENT_TOKENS: [&str; 2] = ["npc-helper", "npc-subagent-desc-5d2e"];

/// A run of `cli` in a repository where npc wrote [`AGENT_CONFIG`]: every
/// request that reached the model carried each of `expect`.
fn offered_agent_config(cli: Cli, expect: &[&str], before_run: impl FnOnce(&Setup)) {
    if !installed(cli) {
        return;
    }
    let s = Setup::new(cli, AGENT_CONFIG);
    before_run(&s);
    let events = s.run();
    check_turn(&s, &events, &format!("Echo: {ECHO_TOKEN}"));
    for turn in s.turns() {
        let text = turn.to_string();
        let missing: Vec<&&str> = expect.iter().filter(|t| !text.contains(**t)).collect();
        assert!(
            missing.is_empty(),
            "{}: the model was not offered {missing:?}",
            cli.program
        );
    }
}

/// Claude Code reads `CLAUDE.md`, lists `.claude/commands/` among its
/// commands and `.claude/agents/` among its agents.
#[test]
fn claude_is_offered_npc_s_rules_command_and_subagent() {
    let mut expect = vec![RULES_TOKEN];
    expect.extend(COMMAND_TOKENS);
    expect.extend(SUBAGENT_TOKENS);
    offered_agent_config(CLAUDE, &expect, |_| {});
}

/// Codex reads `AGENTS.md` and offers `.codex/agents/` roles (it has no
/// project commands).
#[test]
fn codex_is_offered_npc_s_rules_and_agent_role() {
    let mut expect = vec![RULES_TOKEN];
    expect.extend(SUBAGENT_TOKENS);
    offered_agent_config(CODEX, &expect, |_| {});
}

/// Gemini CLI reads `GEMINI.md`, and offers a project agent once the user
/// acknowledged its file (which `npc doctor` reports until then); its
/// commands are the user's to type, never offered to the model.
#[test]
fn gemini_is_offered_npc_s_rules_and_its_acknowledged_subagent() {
    let mut expect = vec![RULES_TOKEN];
    expect.extend(SUBAGENT_TOKENS);
    offered_agent_config(GEMINI, &expect, |s| {
        let ack = |s: &Setup| -> Value {
            let out = s.npc(&["doctor", "--format", "json"]).output().unwrap();
            let reports: Value = serde_json::from_slice(&out.stdout).unwrap();
            reports
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["kind"] == "gemini_cli")
                .flat_map(|r| r["checks"].as_array().unwrap())
                .find(|c| c["check"] == "agent_acknowledgement")
                .cloned()
                .unwrap_or_else(|| panic!("no acknowledgement check in {reports}"))
        };
        let before = ack(s);
        assert_eq!(before["status"], "problem", "{before}");
        assert!(before.to_string().contains("npc-helper"), "{before}");
        // What Gemini CLI's start-up dialog stores when the user accepts.
        let root = s.root();
        let mut acks = serde_json::Map::new();
        for name in ["agent", "npc-helper"] {
            use sha2::Digest as _;
            let text = std::fs::read(root.join(format!(".gemini/agents/{name}.md"))).unwrap();
            let hash: String = sha2::Sha256::digest(&text)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            acks.insert(name.to_string(), Value::String(hash));
        }
        let file = s.home.path().join(".gemini/acknowledgments/agents.json");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(
            &file,
            serde_json::json!({ root.to_string_lossy(): acks }).to_string(),
        )
        .unwrap();
        let after = ack(s);
        assert_eq!(after["status"], "ok", "{after}");
    });
}

/// OpenCode reads `AGENTS.md` and offers `.opencode/agents/` subagents to
/// its `task` tool (its commands are the user's to type).
#[test]
fn opencode_is_offered_npc_s_rules_and_subagent() {
    let mut expect = vec![RULES_TOKEN];
    expect.extend(SUBAGENT_TOKENS);
    offered_agent_config(OPENCODE, &expect, |_| {});
}

/// The file a worktree run's agent writes, and its text.
const EDITED_FILE: &str = "agent-edit.txt";
const EDITED_TEXT: &str = "edited by the agent";

/// `npc run --workspace worktree` of `cli`, carried out by the daemon: the
/// model has the CLI's own shell tool write a file, and the edit lands on
/// the run's branch (`npc/RUN`), not in the checkout.
fn worktree_edit_lands_on_its_branch(cli: Cli, script: Script) {
    worktree_edit_lands_on_its_branch_with(cli, script, &[]);
}

/// [`worktree_edit_lands_on_its_branch`] with `files` committed in the
/// repository too; the run's `run.finished`.
fn worktree_edit_lands_on_its_branch_with(
    cli: Cli,
    script: Script,
    files: &[(&str, &str)],
) -> Option<Value> {
    if !installed(cli) {
        return None;
    }
    let s = Setup::scripted(cli, "", None, script);
    let root = s.root();
    for (name, text) in files {
        let path = root.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .args(["-c", "user.name=test", "-c", "user.email=test@example.com"])
            .args(args)
            .current_dir(&root)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    git(&["add", "--all"]);
    git(&["commit", "--quiet", "-m", "start"]);
    let path = path_with_npc();
    let home = s.home.path().to_string_lossy().into_owned();
    let data = s
        .home
        .path()
        .join(".local/share")
        .to_string_lossy()
        .into_owned();
    let env = [
        ("PATH", path.to_str().unwrap()),
        ("HOME", home.as_str()),
        ("XDG_DATA_HOME", data.as_str()),
    ];
    let daemon = crate::support::Daemon::start_in_with(
        &root,
        crate::support::DaemonSetup {
            only_env: Some(&env),
            ..Default::default()
        },
    );
    let timeout = RUN_TIMEOUT.as_secs().to_string();
    let run = || {
        s.npc(&[
            "run",
            "agent",
            "--workspace",
            "worktree",
            "--prompt",
            "write the file",
            "--format",
            "json",
            "--timeout",
            &timeout,
        ])
        .output()
        .unwrap()
    };
    let claude_config = s.home.path().join(".claude.json");
    if cli.kind == "claude_code" {
        // Claude Code trusts a worktree through its repository, which nobody
        // trusted yet: the run fails at once with the fix, npc writes nothing.
        let out = run();
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{said}");
        let fix = format!("projects[\"{}\"].hasTrustDialogAccepted", root.display());
        assert!(said.contains(&fix), "{said}");
        assert!(!claude_config.exists());
        // What its trust dialog stores, as the fix says.
        std::fs::write(
            &claude_config,
            serde_json::json!({ "projects": { root.to_string_lossy(): { "hasTrustDialogAccepted": true } } })
                .to_string(),
        )
        .unwrap();
    }
    let out = run();
    assert!(
        out.status.success(),
        "{}: npc run failed ({}):\n{}\n{}\n{}",
        cli.program,
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        daemon.log()
    );
    let finished = daemon
        .events()
        .into_iter()
        .rev()
        .find(|e| e["kind"] == "run.finished")
        .expect("run.finished");
    assert_eq!(finished["payload"]["outcome"], "succeeded", "{finished}");
    let result = &finished["payload"]["result"];
    let branch = result["branch"]
        .as_str()
        .unwrap_or_else(|| panic!("{finished}"));
    assert!(branch.starts_with("npc/run-"), "{branch}");
    let text = git(&["show", &format!("{branch}:{EDITED_FILE}")]);
    assert_eq!(text.trim_end(), EDITED_TEXT, "{}", cli.program);
    assert!(
        !root.join(EDITED_FILE).exists(),
        "the checkout stays as it was"
    );
    assert_eq!(
        git(&["status", "--porcelain"]).trim(),
        "",
        "the checkout stays clean"
    );
    Some(finished)
}

/// The shell command the model asks for.
fn edit_command() -> String {
    format!("printf '%s\\n' '{EDITED_TEXT}' > {EDITED_FILE}")
}

/// The model asks `cli`'s own shell tool to run [`edit_command`], with
/// what the CLI needs to allow it.
fn edit_script(cli: Cli) -> Script {
    let (tool, args, provider_args): (&str, Value, &'static [&'static str]) = match cli.kind {
        "claude_code" => (
            "Bash",
            serde_json::json!({"command": edit_command(), "description": "write the file"}),
            &["--allowedTools", "Bash"],
        ),
        "codex" => (
            "exec_command",
            serde_json::json!({"cmd": edit_command()}),
            &["--sandbox", "danger-full-access"],
        ),
        "gemini_cli" => (
            "run_shell_command",
            serde_json::json!({"command": edit_command(), "description": "write the file"}),
            &[],
        ),
        _ => (
            "bash",
            serde_json::json!({"command": edit_command(), "description": "write the file"}),
            &[],
        ),
    };
    Script {
        tool,
        args,
        provider_args,
    }
}

#[test]
fn codex_edit_in_a_worktree_lands_on_its_branch() {
    worktree_edit_lands_on_its_branch(CODEX, edit_script(CODEX));
}

#[test]
fn gemini_edit_in_a_worktree_lands_on_its_branch() {
    worktree_edit_lands_on_its_branch(GEMINI, edit_script(GEMINI));
}

#[test]
fn opencode_edit_in_a_worktree_lands_on_its_branch() {
    worktree_edit_lands_on_its_branch(OPENCODE, edit_script(OPENCODE));
}

/// `PATH` without any directory that holds an `npc`: what a machine where
/// npc was never installed gives the agent CLI.
fn path_without_npc() -> std::ffi::OsString {
    let dirs: Vec<PathBuf> = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .filter(|d| !d.join("npc").exists())
        .collect();
    std::env::join_paths(dirs).unwrap()
}

/// A bridge that cannot run npc fails closed: with an allowing
/// `before_tool` hook bridged into the CLI's settings and no `npc` on the
/// CLI's `PATH` (npc itself started by its path), the shell command the
/// model asks for is blocked by the CLI's own hook mechanism — the file is
/// not written and the model is told why — instead of the 127 the CLIs
/// take as a non-blocking error.
fn bridge_without_npc_blocks_the_tool(cli: Cli) {
    if !installed(cli) {
        return;
    }
    let hooks = "\n[[hooks.before_tool]]\ncommand = \"true\"\n";
    let s = Setup::scripted(cli, hooks, None, edit_script(cli));
    let timeout = RUN_TIMEOUT.as_secs().to_string();
    let out = s
        .npc(&[
            "run",
            "agent",
            "--prompt",
            "write the file",
            "--format",
            "json",
            "--timeout",
            &timeout,
        ])
        .env("PATH", path_without_npc())
        .output()
        .unwrap();
    let who = cli.program;
    let log = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !s.root().join(EDITED_FILE).exists(),
        "{who}: the tool ran although the hook bridge could not run npc:\n{log}"
    );
    let told = s
        .model
        .requests()
        .iter()
        .any(|b| b.to_string().contains("npc hook run could not run"));
    assert!(
        told,
        "{who}: the model was never told the bridge could not run:\n{log}"
    );
}

#[test]
fn claude_bridge_without_npc_blocks_the_tool() {
    bridge_without_npc_blocks_the_tool(CLAUDE);
}

#[test]
fn codex_bridge_without_npc_blocks_the_tool() {
    bridge_without_npc_blocks_the_tool(CODEX);
}

#[test]
fn gemini_bridge_without_npc_blocks_the_tool() {
    bridge_without_npc_blocks_the_tool(GEMINI);
}

/// The profile line that denies the gateway's `echo` (as a profile names an
/// MCP tool).
const DENY_ECHO: &str = "denied_tools = [\"mcp__everything__echo\"]\n";

impl Setup {
    /// `npc run PROFILE` to its end, whatever its outcome: the run's id.
    fn run_profile(&self, profile: &str) -> String {
        let timeout = RUN_TIMEOUT.as_secs().to_string();
        let out = self
            .npc(&[
                "run",
                profile,
                "--prompt",
                "call the echo tool",
                "--format",
                "json",
                "--timeout",
                &timeout,
            ])
            .output()
            .unwrap();
        run_id_of(self.cli, &out)
    }
}

/// The run id in `npc run --format json`'s output.
fn run_id_of(cli: Cli, out: &std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find_map(|e| e["run_id"].as_str().map(str::to_string))
        .unwrap_or_else(|| {
            panic!(
                "{}: no run id ({}):\n{stdout}\n{}",
                cli.program,
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        })
}

/// The `tool.denied` events of run `run`.
fn denials_of(stored: &[Value], run: &str) -> Vec<Value> {
    stored
        .iter()
        .filter(|e| e["kind"] == "tool.denied" && e["payload"]["run_id"] == run)
        .map(|e| e["payload"].clone())
        .collect()
}

/// A profile whose `denied_tools` names the gateway's `echo`: the call is
/// refused by the gateway the CLI started for the run (it knows the run and
/// the profile from the entry's `env`, Codex's included), recorded as a
/// `tool.denied` of the run with the rule, and never reaches the server.
fn profile_denial_is_enforced_and_recorded(cli: Cli) {
    if !installed(cli) {
        return;
    }
    let s = Setup::new(cli, DENY_ECHO);
    let run = s.run_profile("agent");
    let stored = s.events();
    let denied = denials_of(&stored, &run);
    assert!(
        denied.iter().any(|d| d["tool"] == GATEWAY_ECHO
            && d["rule"] == "mcp__everything__echo"
            && d["by"] == "gateway"
            && d["profile"] == "agent"),
        "{}: no tool.denied of run {run}: {stored:#?}",
        cli.program
    );
    assert!(
        !stored
            .iter()
            .any(|e| e["kind"] == "mcp.tool_call" && e["payload"]["outcome"] == "ok"),
        "{}: the denied call reached the server",
        cli.program
    );
}

#[test]
fn claude_profile_denial_is_enforced_and_recorded() {
    profile_denial_is_enforced_and_recorded(CLAUDE);
}

#[test]
fn codex_profile_denial_is_enforced_and_recorded() {
    profile_denial_is_enforced_and_recorded(CODEX);
}

#[test]
fn gemini_profile_denial_is_enforced_and_recorded() {
    profile_denial_is_enforced_and_recorded(GEMINI);
}

#[test]
fn opencode_profile_denial_is_enforced_and_recorded() {
    profile_denial_is_enforced_and_recorded(OPENCODE);
}

/// A second profile of the same CLI that allows `echo`.
const OPEN_PROFILE: &str = "\n[profiles.open]\nprovider = \"p\"\ndescription = \"allows echo\"\nmcp_servers = [\"everything\"]\n";

/// Two profiles of one CLI, one denying `echo` and one not, fired at once:
/// each run holds to its own profile (a denial of the first's run, an `ok`
/// call of the second's).
fn two_profiles_hold_at_once(cli: Cli) {
    if !installed(cli) {
        return;
    }
    let s = Setup::new(cli, &format!("{DENY_ECHO}{OPEN_PROFILE}"));
    let timeout = RUN_TIMEOUT.as_secs().to_string();
    // Each run's CLI has a home of its own (two CLIs of one home race on
    // their own files at start-up: Codex's skills, OpenCode's database).
    let other_home = tempfile::tempdir().unwrap();
    copy_tree(s.home.path(), other_home.path());
    let start = |profile: &str, home: Option<&Path>| {
        let mut cmd = s.npc(&[
            "run",
            profile,
            "--prompt",
            "call the echo tool",
            "--format",
            "json",
            "--timeout",
            &timeout,
        ]);
        if let Some(home) = home {
            cmd.env("HOME", home)
                .env("XDG_DATA_HOME", home.join(".local/share"));
        }
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (denying, open) = (start("agent", None), start("open", Some(other_home.path())));
    let denying = run_id_of(cli, &denying.wait_with_output().unwrap());
    let open = run_id_of(cli, &open.wait_with_output().unwrap());
    let stored = s.events();
    assert!(
        denials_of(&stored, &denying)
            .iter()
            .any(|d| d["tool"] == GATEWAY_ECHO),
        "{}: the denying profile's run {denying} was not refused: {stored:#?}",
        cli.program
    );
    assert!(
        denials_of(&stored, &open).is_empty(),
        "{}: the other profile's run was refused",
        cli.program
    );
    assert!(
        stored.iter().any(|e| e["kind"] == "mcp.tool_call"
            && e["payload"]["run_id"] == open.as_str()
            && e["payload"]["outcome"] == "ok"),
        "{}: the other profile's call did not go through, linked to its run {open}: {stored:#?}",
        cli.program
    );
}

#[test]
fn claude_two_profiles_hold_at_once() {
    two_profiles_hold_at_once(CLAUDE);
}

#[test]
fn codex_two_profiles_hold_at_once() {
    two_profiles_hold_at_once(CODEX);
}

#[test]
fn gemini_two_profiles_hold_at_once() {
    two_profiles_hold_at_once(GEMINI);
}

#[test]
fn opencode_two_profiles_hold_at_once() {
    two_profiles_hold_at_once(OPENCODE);
}

/// Copy the files under `from` to `to` (directories made, links skipped).
fn copy_tree(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            std::fs::create_dir_all(&dst).unwrap();
            copy_tree(&src, &dst);
        } else if kind.is_file() {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

/// Every file of the repository but npc's state and git's, with its text.
fn repository_files(root: &Path) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().to_path_buf();
            if rel == Path::new(".npc")
                || rel == Path::new(".git")
                || rel == Path::new("npcagent.toml")
            {
                continue;
            }
            if path.is_dir() {
                dirs.push(path);
            } else {
                out.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

/// Adding, editing and removing a second profile of the same CLI (with
/// other tools) while runs of the first go on leaves the repository's files
/// byte for byte as they were (the user's `.claude/settings.json` allow
/// list included: it was once rewritten to `{}`), and the first profile's
/// runs are refused as before.
#[test]
fn a_second_profile_never_changes_the_firsts_files_or_runs() {
    let cli = CLAUDE;
    if !installed(cli) {
        return;
    }
    let s = Setup::new(cli, DENY_ECHO);
    let root = s.root();
    let user_settings = r#"{"permissions":{"allow":["Bash"]}}"#;
    std::fs::write(root.join(".claude/settings.json"), user_settings).unwrap();
    let apply = |s: &Setup| {
        let out = s.npc(&["apply", "--auto-approve"]).output().unwrap();
        assert!(
            out.status.success(),
            "npc apply: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    apply(&s);
    let before = repository_files(&root);
    let manifest = std::fs::read_to_string(root.join("npcagent.toml")).unwrap();
    let second = |tools: &str| {
        format!(
            "{manifest}\n[profiles.second]\nprovider = \"p\"\ndescription = \"another\"\nmcp_servers = [\"everything\"]\n{tools}"
        )
    };
    let steps = [
        second("allowed_tools = [\"Read\", \"mcp__everything__echo\"]\n"),
        second("allowed_tools = [\"Bash(ls:*)\"]\ndenied_tools = [\"WebFetch\"]\n"),
        manifest.clone(),
    ];
    for (i, text) in steps.iter().enumerate() {
        std::fs::write(root.join("npcagent.toml"), text).unwrap();
        apply(&s);
        let after = repository_files(&root);
        let changed: Vec<&PathBuf> = after
            .keys()
            .chain(before.keys())
            .filter(|k| after.get(*k) != before.get(*k))
            .collect();
        // A second profile is an agent of the CLI: its own file only.
        let changed: Vec<&&PathBuf> = changed
            .iter()
            .filter(|p| !p.starts_with(".claude/agents/second.md"))
            .collect();
        assert!(changed.is_empty(), "step {i} changed {changed:?}");
        assert_eq!(
            std::fs::read_to_string(root.join(".claude/settings.json")).unwrap(),
            user_settings
        );
        let plan = s.npc(&["plan"]).output().unwrap();
        assert!(plan.status.success());
        if i == 0 {
            // The first profile's run, beside the second profile.
            let run = s.run_profile("agent");
            assert!(
                denials_of(&s.events(), &run)
                    .iter()
                    .any(|d| d["tool"] == GATEWAY_ECHO),
                "the first profile's denial no longer holds"
            );
        }
    }
}

/// The file the denied shell command would create.
const DENIED_MARKER: &str = "denied-marker";

/// A profile that denies a shell command of the CLI's own (`Bash(touch:*)`):
/// the CLI refuses it under the run's own policy (Claude Code's
/// `--settings`, Gemini CLI's `--policy` file, OpenCode's
/// `OPENCODE_PERMISSION`), the command never runs, and the refusal is a
/// `tool.denied` of the run (`by = cli`) naming the pattern.
fn cli_refuses_a_denied_command(cli: Cli, script: Script) {
    if !installed(cli) {
        return;
    }
    let s = Setup::scripted(cli, "denied_tools = [\"Bash(touch:*)\"]\n", None, script);
    let run = s.run_profile("agent");
    assert!(
        !s.root().join(DENIED_MARKER).exists(),
        "{}: the denied command ran",
        cli.program
    );
    let stored = s.events();
    let denied = denials_of(&stored, &run);
    assert!(
        denied
            .iter()
            .any(|d| d["by"] == "cli" && d["rule"] == "Bash(touch:*)" && d["profile"] == "agent"),
        "{}: no tool.denied by the CLI of run {run}: {denied:#?}\n{stored:#?}",
        cli.program
    );
}

fn touch_command() -> String {
    format!("touch {DENIED_MARKER}")
}

#[test]
fn claude_refuses_a_denied_command_of_its_own() {
    cli_refuses_a_denied_command(
        CLAUDE,
        Script {
            tool: "Bash",
            args: serde_json::json!({"command": touch_command(), "description": "touch"}),
            provider_args: &["--allowedTools", "Bash"],
        },
    );
}

/// Claude Code allowed its shell only by the repository's own settings
/// (`.claude/settings.local.json`, which it reads in a trusted workspace
/// only, and for a worktree, through its repository): the run fails at
/// once with the fix until the repository is trusted, then the edit lands
/// (before, the call was refused and the run "succeeded" with nothing
/// changed).
#[test]
fn claude_edit_in_a_worktree_lands_on_its_branch() {
    worktree_edit_lands_on_its_branch_with(
        CLAUDE,
        Script {
            tool: "Bash",
            args: serde_json::json!({"command": edit_command(), "description": "write the file"}),
            provider_args: &[],
        },
        &[(
            ".claude/settings.local.json",
            r#"{"permissions": {"allow": ["Bash"]}}"#,
        )],
    );
}

#[test]
fn gemini_refuses_a_denied_command_of_its_own() {
    cli_refuses_a_denied_command(
        GEMINI,
        Script {
            tool: "run_shell_command",
            args: serde_json::json!({"command": touch_command(), "description": "touch"}),
            provider_args: &[],
        },
    );
}

#[test]
fn opencode_refuses_a_denied_command_of_its_own() {
    cli_refuses_a_denied_command(
        OPENCODE,
        Script {
            tool: "bash",
            args: serde_json::json!({"command": touch_command(), "description": "touch"}),
            provider_args: &[],
        },
    );
}

/// A call the CLI itself refuses (its own permission rules: the profile
/// does not allow it) ends the run `blocked`, not `succeeded`, with the
/// denial listed in `run.finished` and recorded as a `tool.denied` event of
/// the run; `npc run` exits 3.
fn refused_call_ends_the_run_blocked(cli: Cli) {
    if !installed(cli) {
        return;
    }
    let s = Setup::refusing(cli);
    s.run_ending(3);
    let stored = s.events();
    let finished = stored
        .iter()
        .find(|e| e["kind"] == "run.finished")
        .expect("run.finished");
    assert_eq!(finished["payload"]["outcome"], "blocked", "{finished}");
    let denials = finished["payload"]["denials"].as_array().unwrap();
    let tool = if cli.kind == "opencode" {
        "bash"
    } else {
        "echo"
    };
    assert!(
        denials
            .iter()
            .any(|d| d["tool"].as_str().is_some_and(|t| t.ends_with(tool))),
        "{}: {finished}",
        cli.program
    );
    let run_id = finished["payload"]["run_id"].as_str().unwrap();
    assert!(
        stored.iter().any(|e| e["kind"] == "tool.denied"
            && e["payload"]["run_id"] == run_id
            && e["payload"]["by"] == "cli"),
        "{}: {stored:#?}",
        cli.program
    );
    assert!(
        !stored
            .iter()
            .any(|e| e["kind"] == "mcp.tool_call" && e["payload"]["outcome"] == "ok"),
        "{}: the refused call reached the server",
        cli.program
    );
}

#[test]
fn claude_refused_call_ends_the_run_blocked() {
    refused_call_ends_the_run_blocked(CLAUDE);
}

#[test]
fn gemini_refused_call_ends_the_run_blocked() {
    refused_call_ends_the_run_blocked(GEMINI);
}

#[test]
fn opencode_refused_call_ends_the_run_blocked() {
    refused_call_ends_the_run_blocked(OPENCODE);
}

/// Codex has no per-run setting for its own tools: a profile's
/// `denied_tools` reach them through the hook bridge, which applies the
/// run's profile (named in the run's environment). The denied shell
/// command never runs, the denial is a `tool.denied` of the run by `hook`
/// with the pattern, and the run ends `blocked`.
#[test]
fn codex_denied_tools_hold_for_its_own_shell() {
    if !installed(CODEX) {
        return;
    }
    let s = Setup::scripted(
        CODEX,
        "denied_tools = [\"Bash(printf:*)\"]\n",
        None,
        edit_script(CODEX),
    );
    s.review_codex_hooks(&s.root());
    let timeout = RUN_TIMEOUT.as_secs().to_string();
    let out = s
        .npc(&[
            "run",
            "agent",
            "--prompt",
            "write the file",
            "--format",
            "json",
            "--timeout",
            &timeout,
        ])
        .output()
        .unwrap();
    let id = run_id_of(CODEX, &out);
    assert!(
        !s.root().join(EDITED_FILE).exists(),
        "the denied command ran: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let denied = denials_of(&s.events(), &id);
    assert!(
        denied
            .iter()
            .any(|d| d["by"] == "hook" && d["rule"] == "Bash(printf:*)"),
        "{denied:#?}"
    );
    assert_eq!(out.status.code(), Some(3), "{out:?}");
}

// ---- `driver = "acp"`: the same CLIs driven over the Agent Client Protocol.

/// The model calls the gateway's `echo` with [`ECHO_TOKEN`].
fn echo_script() -> Script {
    Script {
        tool: "echo",
        args: serde_json::json!({ "message": ECHO_TOKEN }),
        provider_args: &[],
    }
}

/// The same script with the CLI's own flags left out (an ACP program
/// takes none).
fn acp_script(script: Script) -> Script {
    Script {
        provider_args: &[],
        ..script
    }
}

/// Whether `cli`'s ACP program is installed (the two adapters come from
/// npm; Gemini CLI and OpenCode speak ACP themselves).
fn acp_installed(cli: Cli) -> bool {
    let adapter = match cli.kind {
        "claude_code" => Some("claude-agent-acp"),
        "codex" => Some("codex-acp"),
        _ => None,
    };
    installed(cli)
        && adapter.is_none_or(|a| {
            require(Peer::program(
                a,
                "npm install -g @agentclientprotocol/claude-agent-acp@0.101.0 @agentclientprotocol/codex-acp@2.6.0",
            ))
        })
}

/// An ACP run's `echo` goes through npc's gateway (handed over in
/// `session/new`, no native file written for it), is linked to its run,
/// and its text reaches the model; the turn ends `end_turn`, so the run
/// succeeds although npc stopped the ACP program.
fn acp_echo_through_the_gateway(cli: Cli) {
    if !acp_installed(cli) {
        return;
    }
    let script = echo_script();
    let s = Setup::acp(cli, script, "");
    let events = s.run();
    check_turn(&s, &events, &format!("Echo: {ECHO_TOKEN}"));
    let run = events
        .iter()
        .find_map(|e| e["run_id"].as_str())
        .expect("the run's id");
    let stored = s.events();
    let call = stored
        .iter()
        .find(|e| e["kind"] == "mcp.tool_call" && e["payload"]["name"] == GATEWAY_ECHO)
        .unwrap_or_else(|| panic!("{}: no mcp.tool_call of echo: {stored:#?}", cli.program));
    assert_eq!(call["payload"]["outcome"], "ok", "{call}");
    assert_eq!(
        call["payload"]["run_id"], run,
        "{}: the call is not linked to its run: {call}",
        cli.program
    );
    for kind in ["agent.started", "agent.tool_call", "agent.idle"] {
        assert!(
            events.iter().any(|e| e["type"] == kind),
            "{}: no {kind} in {events:#?}",
            cli.program
        );
    }
    let idle = events.iter().find(|e| e["type"] == "agent.idle").unwrap();
    assert_eq!(idle["status"], "end_turn", "{idle}");
}

/// An ACP run whose profile denies the CLI's shell tool: the agent's
/// permission question is answered with a reject option it offered
/// (`run.permission`, `denied`), the file is not written, and the run is
/// `blocked` (exit 3) with the denial recorded.
fn acp_shell_denied_by_policy(cli: Cli) {
    if !acp_installed(cli) {
        return;
    }
    let script = acp_script(edit_script(cli));
    let denied = match cli.kind {
        "claude_code" => "Bash",
        "codex" => "exec_command",
        "gemini_cli" => "run_shell_command",
        // A profile names OpenCode's own tools as Claude Code does.
        _ => "Bash",
    };
    let s = Setup::acp(cli, script, &format!("denied_tools = [\"{denied}\"]"));
    let events = s.run_ending(3);
    let stored = s.events();
    let permission = stored
        .iter()
        .find(|e| e["kind"] == "run.permission")
        .unwrap_or_else(|| panic!("{}: no run.permission: {stored:#?}", cli.program));
    assert_eq!(permission["payload"]["answer"], "denied", "{permission}");
    let offered = permission["payload"]["options"].as_array().unwrap();
    assert!(
        offered.contains(&permission["payload"]["option_id"]),
        "{}: npc answered an option the agent did not offer: {permission}",
        cli.program
    );
    assert!(
        !s.root().join(EDITED_FILE).exists(),
        "{}: the denied command ran",
        cli.program
    );
    let finished = stored.iter().find(|e| e["kind"] == "run.finished").unwrap();
    assert_eq!(finished["payload"]["outcome"], "blocked", "{finished}");
    let run = events.iter().find_map(|e| e["run_id"].as_str()).unwrap();
    assert!(
        denials_of(&stored, run).iter().any(|d| d["tool"] == denied),
        "{}: no tool.denied of `{denied}`: {stored:#?}",
        cli.program
    );
}

/// An ACP run of a profile naming a `model` the agent lists: npc sets it
/// through the session's model option, and the model server sees the
/// requests of that model; a model the agent does not list is never sent
/// (a notice names what it offers, the run keeps the agent's model).
fn acp_profile_model_reaches_the_model(cli: Cli, model: &str, seen: &str) {
    if !acp_installed(cli) {
        return;
    }
    let s = Setup::acp(cli, echo_script(), &format!("model = \"{model}\""));
    let events = s.run();
    // The turn ends as the model answers (with another model than the
    // scripted one, Codex offers the model no tools: only its id counts).
    assert_run_succeeded(&s);
    let notices: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "agent.notice")
        .collect();
    assert!(
        notices
            .iter()
            .all(|n| !n["text"].as_str().unwrap_or_default().contains("model")),
        "{}: {notices:#?}",
        cli.program
    );
    let models: Vec<String> = s
        .model
        .requests()
        .iter()
        .filter_map(|b| b["model"].as_str().map(str::to_string))
        .collect();
    assert!(
        !models.is_empty(),
        "{}: no request named a model",
        cli.program
    );
    assert!(
        models.iter().all(|m| m.contains(seen)),
        "{}: the profile's `{model}` did not reach the model server: {models:?}",
        cli.program
    );

    let s = Setup::acp(cli, echo_script(), "model = \"no-such-model\"");
    let events = s.run();
    check_turn(&s, &events, &format!("Echo: {ECHO_TOKEN}"));
    assert_run_succeeded(&s);
    let notice = events
        .iter()
        .find(|e| {
            e["type"] == "agent.notice"
                && e["text"]
                    .as_str()
                    .is_some_and(|t| t.contains("no-such-model"))
        })
        .unwrap_or_else(|| {
            panic!(
                "{}: no notice of the unlisted model: {events:#?}",
                cli.program
            )
        });
    assert!(
        notice["text"]
            .as_str()
            .unwrap()
            .contains("is not one the agent offers"),
        "{notice}"
    );
    assert!(
        s.model.requests().iter().all(|b| b["model"]
            .as_str()
            .is_none_or(|m| !m.contains("no-such-model"))),
        "{}: an unlisted model was sent",
        cli.program
    );
}

/// The run of `s` ended `succeeded`.
fn assert_run_succeeded(s: &Setup) {
    let stored = s.events();
    let finished = stored
        .iter()
        .find(|e| e["kind"] == "run.finished")
        .unwrap_or_else(|| panic!("{}: no run.finished: {stored:#?}", s.cli.program));
    assert_eq!(finished["payload"]["outcome"], "succeeded", "{finished}");
}

#[test]
fn acp_claude_profile_model_reaches_the_model() {
    acp_profile_model_reaches_the_model(CLAUDE, "haiku", "haiku");
}

#[test]
fn acp_codex_profile_model_reaches_the_model() {
    acp_profile_model_reaches_the_model(CODEX, "gpt-6-luna", "gpt-6-luna");
}

#[test]
fn acp_claude_calls_echo_through_the_gateway() {
    acp_echo_through_the_gateway(CLAUDE);
}

#[test]
fn acp_codex_calls_echo_through_the_gateway() {
    acp_echo_through_the_gateway(CODEX);
}

#[test]
fn acp_gemini_calls_echo_through_the_gateway() {
    acp_echo_through_the_gateway(GEMINI);
}

#[test]
fn acp_opencode_calls_echo_through_the_gateway() {
    acp_echo_through_the_gateway(OPENCODE);
}

#[test]
fn acp_claude_shell_is_denied_by_the_profile() {
    acp_shell_denied_by_policy(CLAUDE);
}

/// Codex over ACP asks about none of its own tool calls, so a profile
/// that rules on them does not start with `driver = "acp"`: refused with
/// the reason, nothing run.
#[test]
fn acp_codex_refuses_a_profile_ruling_on_its_own_tools() {
    if !acp_installed(CODEX) {
        return;
    }
    let script = acp_script(edit_script(CODEX));
    let s = Setup::acp(CODEX, script, "denied_tools = [\"exec_command\"]");
    let out = s
        .npc(&[
            "run",
            "agent",
            "--prompt",
            "write the file",
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("`exec_command`") && stderr.contains("driver = \"headless\""),
        "{stderr}"
    );
    assert!(s.model.requests().is_empty(), "the agent ran");
    assert!(!s.root().join(EDITED_FILE).exists());
}

#[test]
fn acp_gemini_shell_is_denied_by_the_profile() {
    acp_shell_denied_by_policy(GEMINI);
}

#[test]
fn acp_opencode_shell_is_denied_by_the_profile() {
    acp_shell_denied_by_policy(OPENCODE);
}

/// An ACP run whose profile asks before the CLI's shell tool parks when
/// the agent asks permission (`run.waiting`, nothing run yet); `npc runs
/// approve` answers, the agent gets the allow option it offered, the file
/// is written and the run succeeds.
fn acp_ask_parks_until_approved(cli: Cli, asked: &str) {
    if !acp_installed(cli) {
        return;
    }
    let script = acp_script(edit_script(cli));
    let s = Setup::acp(cli, script, &format!("ask_tools = [\"{asked}\"]"));
    let _daemon = s.daemon();
    let mut run = s.spawn_run("write the file");
    // The agent starts first (OpenCode's first start takes seconds).
    let waiting = crate::support::poll_within(RUN_TIMEOUT, || {
        s.events().into_iter().find(|e| e["kind"] == "run.waiting")
    })
    .unwrap_or_else(|| {
        let _ = run.kill();
        let mut out = String::new();
        let _ = std::io::Read::read_to_string(run.stdout.as_mut().unwrap(), &mut out);
        panic!(
            "{}: the ACP run never parked: {out}\n{:#?}",
            cli.program,
            s.events()
                .iter()
                .map(|e| format!("{} {}", e["kind"], e["payload"]))
                .collect::<Vec<_>>()
        )
    });
    assert!(
        !s.root().join(EDITED_FILE).exists(),
        "{}: the command ran before anyone answered",
        cli.program
    );
    let id = waiting["payload"]["run_id"].as_str().unwrap().to_string();
    // Answer every ask of the run until it ends (Claude Code's adapter also
    // runs the project's hook bridge, which asks about the same call).
    let mut approved = 0;
    let status =
        crate::support::wait_for_within("the approved ACP run to end", RUN_TIMEOUT, || {
            if let Some(status) = run.try_wait().unwrap() {
                return Some(status);
            }
            let stored = s.events();
            let parked = stored.iter().filter(|e| e["kind"] == "run.waiting").count();
            let answered = stored
                .iter()
                .filter(|e| e["kind"] == "run.approval")
                .count();
            if parked > answered {
                let out = s.npc(&["runs", "approve", &id]).output().unwrap();
                approved += usize::from(out.status.success());
            }
            None
        });
    assert!(approved >= 1);
    let mut stderr = String::new();
    std::io::Read::read_to_string(run.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{}: {status}: {stderr}", cli.program);
    assert!(
        s.root().join(EDITED_FILE).exists(),
        "{}: the approved command did not run",
        cli.program
    );
    let stored = s.events();
    let permission = stored
        .iter()
        .find(|e| e["kind"] == "run.permission")
        .expect("run.permission");
    assert_eq!(permission["payload"]["answer"], "allowed", "{permission}");
    assert!(
        stored
            .iter()
            .any(|e| e["kind"] == "run.approval" && e["payload"]["decision"] == "allow"),
        "{stored:#?}"
    );
}

#[test]
fn acp_gemini_ask_parks_until_approved() {
    acp_ask_parks_until_approved(GEMINI, "run_shell_command");
}

#[test]
fn acp_claude_ask_parks_until_approved() {
    acp_ask_parks_until_approved(CLAUDE, "Bash");
}

#[test]
fn acp_opencode_ask_parks_until_approved() {
    acp_ask_parks_until_approved(OPENCODE, "Bash");
}

/// Ctrl-C on an ACP run mid-turn (the agent in a 30 s tool call) is
/// carried out as the protocol says: `session/cancel`, and the agent ends
/// its turn `cancelled`; the run ends `cancelled` (exit 130) long before the
/// tool would have finished.
fn acp_cancel_mid_turn(cli: Cli) {
    if !acp_installed(cli) {
        return;
    }
    let script = Script {
        tool: if cli.kind == "codex" {
            "trigger_long_running_operation"
        } else {
            "trigger-long-running-operation"
        },
        args: serde_json::json!({"duration": 30, "steps": 3}),
        provider_args: &[],
    };
    let s = Setup::acp(cli, script, "");
    let mut run = s.spawn_run("run the long operation");
    let stdout = run.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Value>();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
            let Ok(line) = line else { break };
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                let _ = tx.send(v);
            }
        }
    });
    let mut seen = Vec::new();
    loop {
        let event = rx
            .recv_timeout(RUN_TIMEOUT)
            .unwrap_or_else(|_| panic!("{}: no tool call: {seen:#?}", cli.program));
        let started = event["type"] == "agent.tool_call";
        seen.push(event);
        if started {
            break;
        }
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(run.id()).unwrap()),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status =
        crate::support::wait_for_within("the cancelled ACP run to end", RUN_TIMEOUT, || {
            run.try_wait().unwrap()
        });
    assert_eq!(status.code(), Some(130), "{}: {status}", cli.program);
    seen.extend(rx.try_iter());
    let stored = s.events();
    let finished = stored.iter().find(|e| e["kind"] == "run.finished").unwrap();
    assert_eq!(finished["payload"]["outcome"], "cancelled", "{finished}");
    let idle = seen
        .iter()
        .find(|e| e["type"] == "agent.idle")
        .unwrap_or_else(|| panic!("{}: the agent never ended its turn: {seen:#?}", cli.program));
    assert_eq!(idle["status"], "cancelled", "{}: {idle}", cli.program);
}

#[test]
fn acp_gemini_cancel_mid_turn_ends_cancelled() {
    acp_cancel_mid_turn(GEMINI);
}

#[test]
fn acp_claude_cancel_mid_turn_ends_cancelled() {
    acp_cancel_mid_turn(CLAUDE);
}

#[test]
fn acp_codex_cancel_mid_turn_ends_cancelled() {
    acp_cancel_mid_turn(CODEX);
}

#[test]
fn acp_opencode_cancel_mid_turn_ends_cancelled() {
    acp_cancel_mid_turn(OPENCODE);
}

/// The same turn through `headless` and `acp` means the same: the same
/// tool called (by its gateway name), its result, a message and a
/// finished turn, in that order; the gateway's record of the call is the
/// same but for timing.
fn headless_and_acp_runs_mean_the_same(cli: Cli) {
    if !acp_installed(cli) {
        return;
    }
    let headless = Setup::scripted(cli, "", None, echo_script());
    let acp = Setup::acp(cli, echo_script(), "");
    // What a run means: its tool calls (by gateway name) and results
    // (whether they carried the echo) in order, then its answer (fragments
    // of one message counted once) and the end of its turn. Text before the
    // first call is left out: Codex's adapter reports a warning about the
    // model's metadata as agent text there.
    let meaning = |events: &[Value]| -> Vec<String> {
        let first_call = events
            .iter()
            .position(|e| e["type"] == "agent.tool_call")
            .unwrap_or(0);
        let events = &events[first_call..];
        let mut out: Vec<String> = Vec::new();
        for e in events {
            let kind = e["type"].as_str().unwrap_or("");
            let word = match kind {
                "agent.tool_call" => {
                    let name = e["name"].as_str().unwrap_or("");
                    format!("call {}", &name[name.find(GATEWAY_ECHO).unwrap_or(0)..])
                }
                "agent.tool_result" => format!(
                    "result {}",
                    e["output"].as_str().unwrap_or("").contains(ECHO_TOKEN)
                ),
                "agent.message" => "message".to_string(),
                "agent.idle" => format!("idle error={}", e["is_error"]),
                _ => continue,
            };
            if out.last() != Some(&word) {
                out.push(word);
            }
        }
        out
    };
    let a = meaning(&headless.run());
    let b = meaning(&acp.run());
    assert_eq!(a, b, "{}: headless and acp runs differ", cli.program);
    let call = |s: &Setup| {
        let stored = s.events();
        let mut c = stored
            .into_iter()
            .find(|e| e["kind"] == "mcp.tool_call")
            .unwrap()["payload"]
            .clone();
        c["duration_ms"] = Value::Null;
        c["run_id"] = Value::Null;
        c
    };
    assert_eq!(call(&headless), call(&acp), "{}", cli.program);
}

#[test]
fn gemini_headless_and_acp_runs_mean_the_same() {
    headless_and_acp_runs_mean_the_same(GEMINI);
}

#[test]
fn opencode_headless_and_acp_runs_mean_the_same() {
    headless_and_acp_runs_mean_the_same(OPENCODE);
}

#[test]
fn claude_headless_and_acp_runs_mean_the_same() {
    headless_and_acp_runs_mean_the_same(CLAUDE);
}

#[test]
fn codex_headless_and_acp_runs_mean_the_same() {
    headless_and_acp_runs_mean_the_same(CODEX);
}

/// `npc run --resume RUN` of an ACP run continues the agent's session
/// (`session/resume`, or `session/load` where that is all it offers): the
/// same session id, and the model's first request of the new turn carries
/// the earlier turn's words.
fn acp_resume_continues_the_session(cli: Cli) {
    if !acp_installed(cli) {
        return;
    }
    let script = echo_script();
    let s = Setup::acp(cli, script, "");
    let first = s.run();
    let run = first
        .iter()
        .find_map(|e| e["run_id"].as_str())
        .unwrap()
        .to_string();
    let session = first
        .iter()
        .find(|e| e["type"] == "agent.started")
        .and_then(|e| e["session_id"].as_str())
        .unwrap_or_else(|| panic!("{}: no session: {first:#?}", cli.program))
        .to_string();
    let before = s.model.requests().len();
    let out = s
        .npc(&[
            "run",
            "agent",
            "--prompt",
            "and once more",
            "--resume",
            &run,
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}: {}\n{stdout}\n{}",
        cli.program,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let second: Vec<Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let resumed = second
        .iter()
        .find(|e| e["type"] == "agent.started")
        .and_then(|e| e["session_id"].as_str());
    assert_eq!(resumed, Some(session.as_str()), "{}", cli.program);
    let requests = s.model.requests();
    let next = requests[before..]
        .iter()
        .find(|r| {
            r.to_string().contains("and once more")
                && offered_tools(r).iter().any(|t| t.ends_with(GATEWAY_ECHO))
        })
        .unwrap_or_else(|| panic!("{}: the new prompt never reached the model", cli.program));
    assert!(
        next.to_string().contains("call the echo tool"),
        "{}: the earlier turn is not in the resumed conversation: {next}",
        cli.program
    );
}

#[test]
fn acp_claude_resume_continues_the_session() {
    acp_resume_continues_the_session(CLAUDE);
}

#[test]
fn acp_codex_resume_continues_the_session() {
    acp_resume_continues_the_session(CODEX);
}

/// Gemini CLI 0.61 over ACP offers only `session/load`, and when npc's
/// gateway announced a changed tool list during the first turn it records
/// the conversation under a new chat, so its load finds nothing; when the
/// list did not change in time, the load works. Either way npc says what
/// happened: the run goes on in the session (its prompt reaches the model),
/// or it fails with the agent's own words and says what to do.
#[test]
fn acp_gemini_resume_continues_or_fails_with_the_agent_s_reason() {
    if !acp_installed(GEMINI) {
        return;
    }
    let script = echo_script();
    let s = Setup::acp(GEMINI, script, "");
    let first = s.run();
    let run = first
        .iter()
        .find_map(|e| e["run_id"].as_str())
        .unwrap()
        .to_string();
    let before = s.model.requests().len();
    let out = s
        .npc(&["run", "agent", "--prompt", "again", "--resume", &run])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => {
            let later = s.model.requests();
            assert!(
                later[before..]
                    .iter()
                    .any(|r| r.to_string().contains("again")),
                "the resumed turn never reached the model: {stderr}"
            );
        }
        Some(1) => assert!(
            stderr.contains("session/load") && stderr.contains("start a new run"),
            "{stderr}"
        ),
        other => panic!("the resumed run ended with {other:?}: {stderr}"),
    }
}

#[test]
fn acp_opencode_resume_continues_the_session() {
    acp_resume_continues_the_session(OPENCODE);
}

/// `--resume` of something that is not a run of this repository is
/// refused before anything starts.
#[test]
fn resume_of_an_unknown_run_is_refused() {
    if !acp_installed(GEMINI) {
        return;
    }
    let script = echo_script();
    let s = Setup::acp(GEMINI, script, "");
    for bad in ["../../etc/passwd", "run-20261205t000000000z-deadbeef"] {
        let out = s
            .npc(&["run", "agent", "--prompt", "x", "--resume", bad])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("npc runs") || stderr.contains("no agent session"),
            "{stderr}"
        );
    }
    assert!(s.model.requests().is_empty());
}

/// An ACP run's ask with nobody to answer it (no daemon) is denied and
/// recorded, never let through: the command does not run and the run is
/// `blocked`, not `succeeded` with nothing done.
#[test]
fn acp_gemini_ask_with_nobody_to_answer_is_denied_and_the_run_blocked() {
    if !acp_installed(GEMINI) {
        return;
    }
    let s = Setup::acp(
        GEMINI,
        acp_script(edit_script(GEMINI)),
        "ask_tools = [\"run_shell_command\"]",
    );
    s.run_ending(3);
    assert!(!s.root().join(EDITED_FILE).exists(), "the command ran");
    let stored = s.events();
    let permission = stored
        .iter()
        .find(|e| e["kind"] == "run.permission")
        .expect("run.permission");
    assert_eq!(permission["payload"]["answer"], "denied", "{permission}");
    assert!(
        stored.iter().any(|e| e["kind"] == "tool.denied"
            && e["payload"]["by"] == "approval"
            && e["payload"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("nobody can be asked"))),
        "{stored:#?}"
    );
}

/// Section 3 of the sandbox: each real CLI, headless and over ACP, does its
/// turn inside `sandbox = "workspace"`: the gateway, handed the run's
/// channel (in its `mcpServers` entry over ACP, by name to Codex, in the
/// environment to the others), starts its servers (logging in the run's `TMPDIR`,
/// npc's state being read-only there) and records the call as the run's
/// over the channel; the run's private `TMPDIR` shows it was sandboxed.
fn sandboxed_turn(cli: Cli, acp: bool) {
    let present = if acp {
        acp_installed(cli)
    } else {
        installed(cli)
    };
    if !present {
        return;
    }
    let sandbox = "sandbox = \"workspace\"";
    let s = if acp {
        Setup::acp(cli, echo_script(), sandbox)
    } else {
        Setup::build(cli, "", None, echo_script(), false, false, sandbox)
    };
    // The sandbox lets a CLI write its state directory where it exists (a
    // user's OpenCode has made its data, state and cache directories by its
    // first use);
    // it does not let the run create directories in the home.
    for dir in [
        ".local/share/opencode",
        ".local/state/opencode",
        ".cache/opencode",
    ] {
        std::fs::create_dir_all(s.home.path().join(dir)).unwrap();
    }
    let events = s.run();
    check_turn(&s, &events, &format!("Echo: {ECHO_TOKEN}"));
    let run = events.iter().find_map(|e| e["run_id"].as_str()).unwrap();
    assert!(
        s.root().join(".npc/runs").join(run).join("tmp").is_dir(),
        "{}: the run was not sandboxed",
        cli.program
    );
    let stored = s.events();
    let started = stored
        .iter()
        .find(|e| e["kind"] == "run.started")
        .expect("run.started");
    assert_eq!(started["payload"]["sandbox"], "workspace", "{started}");
    let call = stored
        .iter()
        .find(|e| e["kind"] == "mcp.tool_call" && e["payload"]["name"] == GATEWAY_ECHO)
        .expect("the gateway's call");
    assert_eq!(call["payload"]["run_id"], run, "{call}");
}

#[test]
fn acp_gemini_turn_in_a_workspace_sandbox() {
    sandboxed_turn(GEMINI, true);
}

#[test]
fn headless_gemini_turn_in_a_workspace_sandbox() {
    sandboxed_turn(GEMINI, false);
}

#[test]
fn acp_claude_turn_in_a_workspace_sandbox() {
    sandboxed_turn(CLAUDE, true);
}

#[test]
fn headless_claude_turn_in_a_workspace_sandbox() {
    sandboxed_turn(CLAUDE, false);
}

#[test]
fn acp_codex_turn_in_a_workspace_sandbox() {
    sandboxed_turn(CODEX, true);
}

#[test]
fn headless_codex_turn_in_a_workspace_sandbox() {
    sandboxed_turn(CODEX, false);
}

#[test]
fn acp_opencode_turn_in_a_workspace_sandbox() {
    sandboxed_turn(OPENCODE, true);
}

#[test]
fn headless_opencode_turn_in_a_workspace_sandbox() {
    sandboxed_turn(OPENCODE, false);
}

/// Add `declared` (workflow tables) to `s`'s manifest, commit, start a
/// daemon, start workflow `name` through it and wait for its end: `npc
/// workflow show ID --format json`.
fn run_workflow(s: &Setup, declared: &str, name: &str) -> Value {
    let root = s.root();
    let mut manifest = std::fs::read_to_string(root.join("npcagent.toml")).unwrap();
    manifest.push_str(declared);
    std::fs::write(root.join("npcagent.toml"), manifest).unwrap();
    crate::fleet_code::commit(&root, "start");
    let _daemon = s.daemon();
    let out = s
        .npc(&["workflow", "run", name, "--format", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = serde_json::from_slice::<Value>(&out.stdout).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    wait_for(&format!("workflow `{name}` to end"), || {
        let out = s
            .npc(&["workflow", "show", &id, "--format", "json"])
            .output()
            .unwrap();
        let view: Value = serde_json::from_slice(&out.stdout).ok()?;
        matches!(view["state"].as_str(), Some("succeeded" | "failed")).then_some(view)
    })
}

/// A workflow whose second step is a real Claude Code agent: it works in a
/// worktree made from the first (command) step's result, its call through
/// npc's gateway is recorded as its run's, and what it said last is the
/// step's `message`.
#[test]
fn a_workflow_step_runs_a_real_claude_code_agent_on_the_branch_of_the_step_before() {
    if !installed(CLAUDE) {
        return;
    }
    let s = Setup::new(CLAUDE, "");
    let view = run_workflow(
        &s,
        r#"
[workflows.w.steps.prep]
command = "sh"
args = ["-c", "echo prepared > prep.txt"]
workspace = "worktree"

[workflows.w.steps.agent]
profile = "agent"
prompt = "Call the echo tool. You work on {{ steps.prep.branch }}."
needs = ["prep"]
base = "{{ steps.prep.head }}"
"#,
        "w",
    );
    assert_eq!(view["state"], "succeeded", "{view:#}");
    let prep_head = view["steps"]["prep"]["head"].as_str().unwrap();
    let agent = &view["steps"]["agent"];
    let branch = agent["branch"].as_str().unwrap();
    let root = s.root();
    crate::worktrees::git(&root, &["merge-base", "--is-ancestor", prep_head, branch]);
    assert_eq!(
        crate::worktrees::git(&root, &["show", &format!("{branch}:prep.txt")]).trim(),
        "prepared"
    );
    let run = agent["run"].as_str().unwrap();
    let call = s
        .events()
        .into_iter()
        .find(|e| e["kind"] == "mcp.tool_call" && e["payload"]["name"] == GATEWAY_ECHO)
        .expect("the agent step's call through the gateway");
    assert_eq!(call["payload"]["run_id"], run, "{call}");
    assert!(
        agent["outputs"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{view:#}"
    );
}

/// A real Claude Code agent of a workflow step reports its progress through
/// the gateway's `npc_progress`: the report is its run's `run.progress`, and
/// the step hands the values on as `steps.agent.progress`.
#[test]
fn a_real_claude_code_agent_reports_progress_that_its_workflow_step_hands_on() {
    if !installed(CLAUDE) {
        return;
    }
    let script = Script {
        tool: "npc_progress",
        args: serde_json::json!({
            "text": "half of the files are done",
            "outputs": { "files_done": 3, "summary": "renamed the module" },
        }),
        provider_args: &["--allowedTools", "mcp__npc__npc_progress"],
    };
    let s = Setup::scripted(CLAUDE, "", None, script);
    let view = run_workflow(
        &s,
        r#"
[workflows.w.steps.agent]
profile = "agent"
prompt = "Report your progress."
"#,
        "w",
    );
    assert_eq!(view["state"], "succeeded", "{view:#}");
    let agent = &view["steps"]["agent"];
    assert_eq!(
        agent["outputs"]["progress"],
        serde_json::json!({ "files_done": 3, "summary": "renamed the module" }),
        "{view:#}"
    );
    let run = agent["run"].as_str().unwrap();
    let progress = s
        .events()
        .into_iter()
        .find(|e| e["kind"] == "run.progress")
        .expect("the agent's run.progress");
    assert_eq!(progress["payload"]["run_id"], run, "{progress}");
    assert_eq!(progress["payload"]["text"], "half of the files are done");
    let call = s
        .events()
        .into_iter()
        .find(|e| e["kind"] == "mcp.tool_call" && e["payload"]["name"] == "npc_progress")
        .expect("the gateway's record of the call");
    assert_eq!(call["payload"]["outcome"], "ok", "{call}");
    assert_eq!(call["payload"]["run_id"], run, "{call}");
}

/// An agent's report past the bounds (here 40 keys) is refused with the
/// reason, which the agent reads; nothing is recorded as its progress.
#[test]
fn a_real_claude_code_agents_oversized_progress_report_is_refused() {
    if !installed(CLAUDE) {
        return;
    }
    let outputs: serde_json::Map<String, Value> =
        (0..40).map(|i| (format!("k{i}"), Value::from(i))).collect();
    let script = Script {
        tool: "npc_progress",
        args: serde_json::json!({ "text": "too much", "outputs": outputs }),
        provider_args: &["--allowedTools", "mcp__npc__npc_progress"],
    };
    let s = Setup::scripted(CLAUDE, "", None, script);
    crate::fleet_code::commit(&s.root(), "start");
    let _daemon = s.daemon();
    s.run();
    let stored = s.events();
    assert!(
        !stored.iter().any(|e| e["kind"] == "run.progress"),
        "{stored:#?}"
    );
    let call = stored
        .iter()
        .find(|e| e["kind"] == "mcp.tool_call" && e["payload"]["name"] == "npc_progress")
        .expect("the gateway's record of the call");
    assert_ne!(call["payload"]["outcome"], "ok", "{call}");
    let model = std::fs::read_to_string(&s.model.record).unwrap();
    assert!(
        model.contains("more than 32 keys"),
        "the refusal reached no model"
    );
}

/// A real Claude Code agent calls the gateway's `npc_delegate`: the daemon
/// starts a run of the named profile for it (origin `delegate`, its own
/// worktree), waits for it and hands back its outcome and final message.
/// That run's agent delegates again (2 deep, the bound), and the third
/// asking is refused with the reason, which its agent reads.
#[test]
fn a_real_claude_code_agent_delegates_a_run_and_gets_its_result_and_the_depth_is_bounded() {
    if !installed(CLAUDE) {
        return;
    }
    let script = Script {
        tool: "npc_delegate",
        args: serde_json::json!({ "profile": "agent", "prompt": "a delegated task" }),
        provider_args: &["--allowedTools", "mcp__npc__npc_delegate"],
    };
    let s = Setup::scripted(CLAUDE, "", None, script);
    let root = s.root();
    crate::fleet_code::commit(&root, "start");
    let _daemon = s.daemon();
    let events = s.run();
    let parent = events
        .iter()
        .find_map(|e| e["run_id"].as_str())
        .unwrap()
        .to_string();
    let out = s.npc(&["runs", "--format", "json"]).output().unwrap();
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let delegated: Vec<&Value> = rows.iter().filter(|r| r["origin"] == "delegate").collect();
    assert_eq!(delegated.len(), 2, "{rows:#?}");
    for r in &delegated {
        assert_eq!(r["state"], "succeeded", "{r}");
    }
    let calls: Vec<Value> = s
        .events()
        .into_iter()
        .filter(|e| {
            e["kind"] == "mcp.tool_call"
                && e["payload"]["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with("npc_delegate"))
        })
        .collect();
    assert_eq!(calls.len(), 3, "{calls:#?}");
    // The first two started runs; the third, two deep already, was refused.
    let by_run = |run: &str| {
        calls
            .iter()
            .find(|c| c["payload"]["run_id"] == run)
            .unwrap_or_else(|| panic!("no call of {run}: {calls:#?}"))
    };
    assert_eq!(by_run(&parent)["payload"]["outcome"], "ok", "{calls:#?}");
    let refused: Vec<&Value> = calls
        .iter()
        .filter(|c| c["payload"]["outcome"] != "ok")
        .collect();
    assert_eq!(refused.len(), 1, "{calls:#?}");
    let model = std::fs::read_to_string(&s.model.record).unwrap();
    assert!(
        model.contains("delegates at most 2 deep"),
        "the refusal reached no model"
    );
}

/// A real Claude Code agent of profile `agent` (which denies `Write`) asks
/// `npc_delegate` for a run of `profile`, declared by `declared`: the
/// setup, after the asking run ended, and the repository's runs.
fn delegate_to(profile: &str, declared: &str) -> (Setup, Vec<Value>) {
    let script = Script {
        tool: "npc_delegate",
        args: serde_json::json!({ "profile": profile, "prompt": "a task" }),
        provider_args: &["--allowedTools", "mcp__npc__npc_delegate"],
    };
    let s = Setup::build(
        CLAUDE,
        "",
        None,
        script,
        false,
        false,
        &format!("denied_tools = [\"Write\"]\n\n{declared}"),
    );
    crate::fleet_code::commit(&s.root(), "start");
    let _daemon = s.daemon();
    let _ = s.run();
    let out = s.npc(&["runs", "--format", "json"]).output().unwrap();
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    (s, rows)
}

/// `npc_delegate` for a profile narrower than the asking run's (the same
/// provider and servers, one more tool denied) starts a run of it.
#[test]
fn a_real_claude_code_agent_delegates_to_a_narrower_profile() {
    if !installed(CLAUDE) {
        return;
    }
    let (s, rows) = delegate_to(
        "reader",
        "[profiles.reader]\nprovider = \"p\"\ndescription = \"narrower\"\nmcp_servers = [\"everything\"]\ndenied_tools = [\"Write\", \"Edit\"]\n",
    );
    let delegated: Vec<&Value> = rows.iter().filter(|r| r["origin"] == "delegate").collect();
    assert!(!delegated.is_empty(), "{rows:#?}");
    let events = s.events();
    for r in &delegated {
        assert_eq!(r["state"], "succeeded", "{r}");
        let started = events
            .iter()
            .find(|e| e["kind"] == "run.started" && e["payload"]["run_id"] == r["id"])
            .unwrap_or_else(|| panic!("no run.started of {r}"));
        assert_eq!(started["payload"]["profile"], "reader", "{started}");
    }
}

/// `npc_delegate` for a profile broader than the asking run's (it does not
/// deny what the asking one denies) is refused (a delegated run never
/// widens the asking agent's policy): nothing runs, and the agent reads why.
#[test]
fn a_real_claude_code_agent_cannot_delegate_to_another_profile() {
    if !installed(CLAUDE) {
        return;
    }
    let (s, rows) = delegate_to(
        "admin",
        "[profiles.admin]\nprovider = \"p\"\ndescription = \"broader\"\nmcp_servers = [\"everything\"]\n",
    );
    assert!(rows.iter().all(|r| r["origin"] != "delegate"), "{rows:#?}");
    let model = std::fs::read_to_string(&s.model.record).unwrap();
    assert!(
        model.contains("it does not deny `Write`"),
        "the refusal reached no model"
    );
}
