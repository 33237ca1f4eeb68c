//! `npc man [--out DIR]`: the man pages, generated — `npc(1)` and one
//! `npc-SUBCOMMAND(1)` per subcommand (nested ones too) from the clap
//! definitions with `clap_mangen`, and `npcagent.toml(5)` from the
//! manifest's JSON Schema. Each command's page ends with EXIT STATUS (from
//! [`Exit::meaning`], the one table of exit codes, and the command's own
//! words in [`DOCS`]) and EXAMPLES (also in [`DOCS`]). The committed copies live in `man/`; a test
//! fails when they drift (`cargo run -- man --out man` regenerates them).

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::CommandFactory as _;
use serde_json::Value;

use super::{Cli, Exit};

/// One page: its path under the output directory (`man1/npc.1`) and text.
pub type Page = (PathBuf, Vec<u8>);

/// Every page, in a stable order.
pub fn pages() -> anyhow::Result<Vec<Page>> {
    let mut out = Vec::new();
    let mut root = Cli::command();
    root.build();
    command_pages(&root, "npc", &mut out)?;
    out.push((
        PathBuf::from("man5/npcagent.toml.5"),
        manifest_page().into_bytes(),
    ));
    Ok(out)
}

fn command_pages(cmd: &clap::Command, name: &str, out: &mut Vec<Page>) -> anyhow::Result<()> {
    let cmd = cmd.clone().name(name.to_string());
    let mut text = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .title(name.to_uppercase())
        .section("1")
        .source(format!("npc {}", env!("CARGO_PKG_VERSION")))
        .manual("npc manual")
        .render(&mut text)
        .context("rendering a man page")?;
    let command = name.replace('-', " ");
    let doc = doc(&command).with_context(|| {
        format!("`man::DOCS` has no entry for `{command}`; add its exit statuses and examples")
    })?;
    let mut text = String::from_utf8(text).context("a man page that is not UTF-8")?;
    // EXIT STATUS and EXAMPLES go before VERSION, as man-pages(7) orders them.
    let at = text.find(VERSION_HEADING).unwrap_or(text.len());
    text.insert_str(at, &(exit_status_section(doc) + &examples_section(doc)));
    out.push((PathBuf::from(format!("man1/{name}.1")), text.into_bytes()));
    for sub in cmd.get_subcommands() {
        if sub.get_name() == "help" || sub.is_hide_set() {
            continue;
        }
        command_pages(sub, &format!("{name}-{}", sub.get_name()), out)?;
    }
    Ok(())
}

/// The heading clap_mangen writes last but one (the new sections go before it).
const VERSION_HEADING: &str = ".SH VERSION\n";

/// The entry of [`DOCS`] for `command` (`npc runs approve`).
fn doc(command: &str) -> Option<&'static Doc> {
    DOCS.iter().find(|d| d.command == command)
}

/// EXIT STATUS: for `npc` itself the whole table; for a command the three
/// statuses every command may exit with and the others it uses, each in
/// the command's own words where it has them.
fn exit_status_section(doc: &Doc) -> String {
    let statuses: Vec<Exit> = if doc.command == "npc" {
        Exit::ALL.to_vec()
    } else {
        Exit::ALL
            .into_iter()
            .filter(|e| COMMON_EXITS.contains(e) || doc.exits.iter().any(|(x, _)| x == e))
            .collect()
    };
    let mut out = String::from(".SH \"EXIT STATUS\"\n");
    for status in statuses {
        let meaning = doc
            .exits
            .iter()
            .find(|(x, _)| *x == status)
            .map_or_else(|| status.meaning(), |(_, m)| m);
        out.push_str(&format!(
            ".TP\n\\fB{}\\fR\n{}\n",
            status as u8,
            roff(meaning)
        ));
    }
    out.push_str(".PP\nEvery command follows one table of exit codes: see \\fBnpc\\fR(1).\n");
    out
}

/// EXAMPLES: each command line in a literal block, after what it does.
fn examples_section(doc: &Doc) -> String {
    let mut out = String::from(".SH EXAMPLES\n");
    for (line, what) in doc.examples {
        out.push_str(&format!(
            ".PP\n{}:\n.PP\n.RS 4\n.nf\n{}\n.fi\n.RE\n",
            roff(what),
            literal(line)
        ));
    }
    out
}

/// A command line as roff prints it verbatim: a backslash, a hyphen (not a
/// typographic one) and an apostrophe (not a right quote) escaped.
fn literal(line: &str) -> String {
    roff(line).replace('-', "\\-").replace('\'', "\\*(Aq")
}

/// What one page of `npc(1)`'s family adds to clap's text: the command's
/// own meaning of some exit statuses (beside [`Exit::meaning`], the one
/// table every command follows) and a few real command lines.
#[derive(Debug)]
pub struct Doc {
    /// The command as typed, without its arguments (`npc runs approve`).
    pub command: &'static str,
    /// Statuses this command gives a meaning of its own (or adds to 0, 1
    /// and 2, which every command may exit with).
    pub exits: &'static [(Exit, &'static str)],
    /// Command lines and what each does; a test parses every one with the
    /// current command line.
    pub examples: &'static [(&'static str, &'static str)],
}

/// Statuses every command may exit with: success, a failure (a failed
/// write to stdout included), a usage error (clap's own).
const COMMON_EXITS: [Exit; 3] = [Exit::Ok, Exit::Failed, Exit::Usage];

/// The EXIT STATUS and EXAMPLES of every page, one entry per command (a
/// unit test holds the list to the command line's commands).
pub const DOCS: &[Doc] = &[
    Doc {
        command: "npc",
        exits: &[],
        examples: &[
            ("npc init", "Write a commented starter manifest"),
            ("npc validate", "Check it: every problem at once"),
            ("npc plan", "Show what would change"),
            ("npc apply", "Apply it, after asking"),
            ("npc daemon", "Keep it applied, reloading on every change"),
        ],
    },
    Doc {
        command: "npc validate",
        exits: &[(
            Exit::Failed,
            "the manifest is invalid (every problem is printed)",
        )],
        examples: &[
            (
                "npc validate",
                "Check the manifest found from the current directory",
            ),
            (
                "npc validate --allow-missing-env",
                "Check it in CI, where the secrets are not set",
            ),
            (
                "npc validate -m other/npcagent.toml --format json",
                "Check another manifest, for a script",
            ),
        ],
    },
    Doc {
        command: "npc schema",
        exits: &[],
        examples: &[
            ("npc schema", "Print the manifest's JSON Schema"),
            (
                "npc schema --openapi",
                "Print the daemon API's OpenAPI document",
            ),
            (
                "npc schema --events --markdown",
                "Print the reference of every event kind",
            ),
        ],
    },
    Doc {
        command: "npc init",
        exits: &[],
        examples: &[
            ("npc init", "Write npcagent.toml into the current directory"),
            ("npc init services/api", "Write it into another directory"),
        ],
    },
    Doc {
        command: "npc render",
        exits: &[],
        examples: &[
            (
                "npc render profile review",
                "Print the agent profile `review`",
            ),
            (
                "npc render prompt fix --var issue=42",
                "Print the prompt `fix` with a variable set",
            ),
        ],
    },
    Doc {
        command: "npc render profile",
        exits: &[(
            Exit::Failed,
            "the manifest is invalid, or it has no such profile",
        )],
        examples: &[
            (
                "npc render profile review",
                "Print the agent profile `review` (Markdown and YAML frontmatter)",
            ),
            (
                "npc render profile review --write",
                "Write it where its agent CLI reads it",
            ),
        ],
    },
    Doc {
        command: "npc render prompt",
        exits: &[(
            Exit::Failed,
            "the manifest is invalid, it has no such prompt, or a variable is missing",
        )],
        examples: &[
            (
                "npc render prompt fix --var issue=42",
                "Print the prompt `fix` with `issue` set",
            ),
            (
                "npc render prompt triage --profile review",
                "Print it as the profile `review` sees it",
            ),
        ],
    },
    Doc {
        command: "npc run",
        exits: &[
            (Exit::Ok, "the run succeeded"),
            (Exit::Failed, "the run failed, or the manifest is invalid"),
            (
                Exit::Blocked,
                "a policy or permission denial stopped what the agent tried (the run is `blocked`)",
            ),
            (Exit::TimedOut, "the run timed out (as `timeout(1)`)"),
            (Exit::Interrupted, "cancelled by SIGINT (Ctrl-C)"),
            (Exit::Terminated, "cancelled by SIGTERM"),
        ],
        examples: &[
            (
                "npc run review --prompt \"review the last commit\"",
                "Run the profile `review` with a task",
            ),
            (
                "npc run fixer --prompt-template fix --var issue=42 --workspace worktree",
                "Run a rendered prompt in a worktree of its own",
            ),
            (
                "npc run review --provider codex --prompt \"explain src/main.rs\"",
                "Run the same profile with another provider",
            ),
        ],
    },
    Doc {
        command: "npc doctor",
        exits: &[(
            Exit::Failed,
            "a problem was found (each comes with its fix)",
        )],
        examples: &[
            ("npc doctor", "Check each declared agent CLI"),
            ("npc doctor --format json", "The same, for a script"),
        ],
    },
    Doc {
        command: "npc acp",
        exits: &[
            (Exit::Ok, "the editor closed stdin, or SIGINT or SIGTERM"),
            (Exit::Failed, "the manifest is invalid"),
            (Exit::Usage, "no such profile, or a usage error"),
        ],
        examples: &[
            (
                "npc acp",
                "Serve the manifest's only profile (or `default`) to an editor",
            ),
            (
                "npc acp --profile review --timeout 600",
                "Serve another profile, each prompt's run stopped after 10 minutes",
            ),
        ],
    },
    Doc {
        command: "npc completions",
        exits: &[],
        examples: &[
            (
                "npc completions bash",
                "Print bash completions (source them from ~/.bashrc)",
            ),
            ("npc completions zsh", "Print zsh completions"),
        ],
    },
    Doc {
        command: "npc man",
        exits: &[],
        examples: &[
            ("npc man", "List the pages"),
            (
                "npc man --out ~/.local/share/man",
                "Install them where man(1) finds them",
            ),
        ],
    },
    Doc {
        command: "npc import",
        exits: &[(
            Exit::Failed,
            "the file cannot be read or is not one npc knows",
        )],
        examples: &[
            (
                "npc import .mcp.json",
                "Print the manifest entries of Claude Code's MCP servers",
            ),
            (
                "npc import .codex/config.toml --write",
                "Merge Codex CLI's MCP servers into the manifest",
            ),
            (
                "npc import .claude/commands/review.md --write --replace",
                "Take a slash command, replacing a differing entry",
            ),
        ],
    },
    Doc {
        command: "npc plan",
        exits: &[
            (Exit::Failed, "the manifest is invalid, or planning failed"),
            (
                Exit::Usage,
                "with `--detailed-exitcode`: there are changes or conflicts; else a usage or I/O error",
            ),
        ],
        examples: &[
            ("npc plan", "Show what `npc apply` would change"),
            (
                "npc plan --detailed-exitcode",
                "In CI: exit 2 when anything would change",
            ),
            (
                "npc plan --out plan.json",
                "Save the plan for `npc apply plan.json`",
            ),
        ],
    },
    Doc {
        command: "npc apply",
        exits: &[(
            Exit::Failed,
            "the manifest is invalid, the plan changed since it was shown, or an agent file is broken (left alone; the rest applies)",
        )],
        examples: &[
            ("npc apply", "Show the plan, ask, apply it"),
            ("npc apply --auto-approve", "Apply without asking"),
            (
                "npc apply plan.json",
                "Apply exactly a plan saved by `npc plan --out`",
            ),
        ],
    },
    Doc {
        command: "npc daemon",
        exits: &[
            (Exit::Ok, "stopped by SIGTERM or SIGINT"),
            (
                Exit::Failed,
                "another daemon holds the repository, or it could not start",
            ),
        ],
        examples: &[
            ("npc daemon", "Apply the manifest and keep it applied"),
            (
                "npc daemon -m services/api/npcagent.toml",
                "The same for another manifest",
            ),
        ],
    },
    Doc {
        command: "npc mcp",
        exits: &[],
        examples: &[("npc mcp serve", "Serve the gateway on stdio")],
    },
    Doc {
        command: "npc mcp serve",
        exits: &[
            (Exit::Ok, "the client went away, or SIGINT or SIGTERM"),
            (
                Exit::Failed,
                "the manifest is invalid, or an unexpected failure",
            ),
        ],
        examples: &[
            (
                "npc mcp serve",
                "Serve every tool on stdio (what the agent files npc writes run)",
            ),
            (
                "npc mcp serve --http 127.0.0.1:8767",
                "Serve streamable HTTP at /mcp on a loopback port",
            ),
            (
                "npc mcp serve --tools search --prefix on_conflict",
                "Offer only `search_tools` and `call_tool`",
            ),
        ],
    },
    Doc {
        command: "npc plugin",
        exits: &[],
        examples: &[
            ("npc plugin init lint-tools", "Write a new package"),
            ("npc plugin validate lint-tools", "Check it statically"),
        ],
    },
    Doc {
        command: "npc plugin validate",
        exits: &[(Exit::Failed, "the package is invalid")],
        examples: &[
            (
                "npc plugin validate",
                "Check the package in the current directory",
            ),
            (
                "npc plugin validate lint-tools --format json",
                "Check another one, for a script",
            ),
        ],
    },
    Doc {
        command: "npc plugin test",
        exits: &[(Exit::Failed, "a server or a hook of the package failed")],
        examples: &[
            (
                "npc plugin test",
                "Probe the package in the current directory",
            ),
            ("npc plugin test lint-tools", "Probe another one"),
        ],
    },
    Doc {
        command: "npc plugin init",
        exits: &[(Exit::Usage, "the target is not empty, or a usage error")],
        examples: &[
            (
                "npc plugin init lint-tools",
                "Write a Python package into ./lint-tools",
            ),
            (
                "npc plugin init lint-tools --typescript --dir plugins/lint",
                "Write a TypeScript one elsewhere",
            ),
        ],
    },
    Doc {
        command: "npc plugin install",
        exits: &[(
            Exit::Failed,
            "the package is invalid, or another package has its name",
        )],
        examples: &[
            (
                "npc plugin install",
                "Register the package in the current directory (disabled)",
            ),
            ("npc plugin install plugins/lint", "Register another one"),
        ],
    },
    Doc {
        command: "npc plugin enable",
        exits: &[(Exit::Failed, "no such plugin, or it is no longer valid")],
        examples: &[("npc plugin enable lint-tools", "Enable a registered plugin")],
    },
    Doc {
        command: "npc plugin disable",
        exits: &[(Exit::Failed, "no such plugin")],
        examples: &[(
            "npc plugin disable lint-tools",
            "Disable it (it stays registered)",
        )],
    },
    Doc {
        command: "npc plugin uninstall",
        exits: &[(Exit::Failed, "no such plugin")],
        examples: &[(
            "npc plugin uninstall lint-tools",
            "Forget it (the package and its data stay)",
        )],
    },
    Doc {
        command: "npc plugin list",
        exits: &[],
        examples: &[
            ("npc plugin list", "Every plugin, in discovery order"),
            (
                "npc plugin list --tools --format json",
                "With their tools, for a script",
            ),
        ],
    },
    Doc {
        command: "npc plugin inspect",
        exits: &[(Exit::Failed, "no such plugin")],
        examples: &[(
            "npc plugin inspect lint-tools",
            "One plugin: where it comes from, what it holds",
        )],
    },
    Doc {
        command: "npc hook",
        exits: &[],
        examples: &[(
            "npc hook run before_tool --agent claude",
            "What Claude Code's settings call before each tool",
        )],
    },
    Doc {
        command: "npc hook run",
        exits: &[
            (
                Exit::Ok,
                "`--agent npc`: continue or rewrite; `--agent gemini`: always, with a JSON decision",
            ),
            (Exit::Failed, "`--agent npc`: a hook denied, or failed"),
            (
                Exit::Usage,
                "`--agent claude` or `--agent codex`: the tool is blocked (their hook protocol)",
            ),
        ],
        examples: &[
            (
                "npc hook run before_tool",
                "Run the `before_tool` hooks once (stdin: the event's input)",
            ),
            (
                "npc hook run after_tool --agent gemini",
                "The same in Gemini CLI's hook protocol",
            ),
        ],
    },
    Doc {
        command: "npc pane",
        exits: &[],
        examples: &[
            ("npc pane list", "The daemon's panes"),
            (
                "npc pane attach claude",
                "Attach this terminal to one (Ctrl-] detaches)",
            ),
        ],
    },
    Doc {
        command: "npc pane list",
        exits: &[(Exit::Failed, "no daemon runs")],
        examples: &[
            ("npc pane list", "Each pane: state, generation, last status"),
            ("npc pane list --format json", "The same, for a script"),
        ],
    },
    Doc {
        command: "npc pane open",
        exits: &[(Exit::Failed, "no daemon runs, or no such pane")],
        examples: &[("npc pane open claude", "Start the pane `claude`")],
    },
    Doc {
        command: "npc pane close",
        exits: &[(Exit::Failed, "no daemon runs, or no such pane")],
        examples: &[("npc pane close claude", "Stop it")],
    },
    Doc {
        command: "npc pane send",
        exits: &[(Exit::Failed, "no daemon runs, or no such pane")],
        examples: &[
            (
                "npc pane send claude \"run the tests\"",
                "Type a line into the pane (Enter follows)",
            ),
            (
                "npc pane send claude /clear --no-enter",
                "Type without Enter",
            ),
        ],
    },
    Doc {
        command: "npc pane attach",
        exits: &[(Exit::Failed, "no daemon runs, or no such pane")],
        examples: &[
            (
                "npc pane attach claude",
                "Attach this terminal (Ctrl-] detaches)",
            ),
            (
                "npc pane attach claude --clipboard",
                "Let the pane write this terminal's clipboard",
            ),
        ],
    },
    Doc {
        command: "npc notify",
        exits: &[],
        examples: &[(
            "npc notify test team",
            "Send the sink `team` a sample message",
        )],
    },
    Doc {
        command: "npc notify test",
        exits: &[(
            Exit::Failed,
            "not delivered, no such sink, or the manifest is invalid",
        )],
        examples: &[(
            "npc notify test team",
            "Send the `[notify.team]` sink a sample message, once",
        )],
    },
    Doc {
        command: "npc status",
        exits: &[],
        examples: &[
            (
                "npc status",
                "Each component: state, pid, restarts, since when",
            ),
            ("npc status --format json", "The same, for a script"),
        ],
    },
    Doc {
        command: "npc dashboard",
        exits: &[(Exit::Failed, "no daemon runs")],
        examples: &[("npc dashboard", "Print a new URL of the daemon's dashboard")],
    },
    Doc {
        command: "npc events",
        exits: &[],
        examples: &[
            ("npc events --limit 20", "The last 20 events"),
            (
                "npc events --since 120 --follow",
                "Every event after id 120, then each new one",
            ),
            (
                "npc events --fleet --format json",
                "The fleet's shared log, for a script",
            ),
        ],
    },
    Doc {
        command: "npc triggers",
        exits: &[(Exit::Failed, "the manifest is invalid")],
        examples: &[
            (
                "npc triggers",
                "Each trigger: next fire times, route, watched paths, recent runs",
            ),
            ("npc triggers --format json", "The same, for a script"),
        ],
    },
    Doc {
        command: "npc trigger",
        exits: &[],
        examples: &[("npc trigger fire nightly", "Fire the trigger `nightly` now")],
    },
    Doc {
        command: "npc trigger fire",
        exits: &[
            (Exit::Failed, "no daemon runs, or no such trigger"),
            (Exit::Usage, "the payload is not JSON, or a usage error"),
        ],
        examples: &[
            (
                "npc trigger fire nightly",
                "Fire the trigger `nightly` through the daemon's run queue",
            ),
            (
                "npc trigger fire triage --payload '{\"issue\": 42}'",
                "Fire one with a payload the action sees",
            ),
        ],
    },
    Doc {
        command: "npc runs",
        exits: &[(
            Exit::Failed,
            "no such run, or the fleet's store does not answer",
        )],
        examples: &[
            ("npc runs", "Every run, newest first"),
            (
                "npc runs --trigger nightly --limit 10",
                "The last 10 runs of one trigger",
            ),
            ("npc runs show run-42", "One run: its outcome and events"),
        ],
    },
    Doc {
        command: "npc runs show",
        exits: &[(Exit::Failed, "no such run")],
        examples: &[
            (
                "npc runs show run-42",
                "One run's row, outcome, denials and events",
            ),
            (
                "npc runs show run-42 --fleet",
                "A run of the fleet, from the shared store",
            ),
        ],
    },
    Doc {
        command: "npc runs diff",
        exits: &[(Exit::Failed, "no such run, or it has no worktree")],
        examples: &[(
            "npc runs diff run-42",
            "The patch a worktree run handed back",
        )],
    },
    Doc {
        command: "npc runs approve",
        exits: &[(
            Exit::Failed,
            "refused: answered already, the run ended or is unknown, or no daemon runs",
        )],
        examples: &[
            (
                "npc runs approve run-42",
                "Allow the tool call the run waits on",
            ),
            (
                "npc runs approve run-42 --always",
                "Also allow its later identical calls",
            ),
        ],
    },
    Doc {
        command: "npc runs deny",
        exits: &[(
            Exit::Failed,
            "refused: answered already, the run ended or is unknown, or no daemon runs",
        )],
        examples: &[(
            "npc runs deny run-42 --reason \"not on main\"",
            "Deny it, with the reason the agent sees",
        )],
    },
    Doc {
        command: "npc workflows",
        exits: &[(Exit::Failed, "the manifest is invalid")],
        examples: &[
            (
                "npc workflows",
                "The declared workflows and the latest workflow runs",
            ),
            (
                "npc workflows --format json",
                "The same as JSON, for scripts",
            ),
        ],
    },
    Doc {
        command: "npc workflow",
        exits: &[],
        examples: &[(
            "npc workflow run ship --input goal=parser",
            "Start workflow `ship` through the daemon",
        )],
    },
    Doc {
        command: "npc workflow run",
        exits: &[(
            Exit::Failed,
            "refused: no daemon runs, no such workflow, an input unknown or missing",
        )],
        examples: &[
            (
                "npc workflow run ship --input goal=parser",
                "Start workflow `ship`; prints the workflow run's id",
            ),
            (
                "npc workflow run ship --input goal=parser --format json",
                "The id as JSON: {\"id\": \"wf-…\"}",
            ),
        ],
    },
    Doc {
        command: "npc workflow plan",
        exits: &[(Exit::Failed, "no such workflow, or the manifest is invalid")],
        examples: &[
            (
                "npc workflow plan ship",
                "What workflow `ship` would run, stage by stage",
            ),
            (
                "npc workflow plan ship --format json",
                "The same as JSON: `stages`, each a list of steps",
            ),
        ],
    },
    Doc {
        command: "npc workflow show",
        exits: &[(Exit::Failed, "no such workflow run")],
        examples: &[
            (
                "npc workflow show wf-20261205t111406158z-8a3694f8",
                "Each step's state, run and branch",
            ),
            (
                "npc workflow show wf-20261205t111406158z-8a3694f8 --format json",
                "The same as JSON: `state`, and each step's under `steps`",
            ),
        ],
    },
    Doc {
        command: "npc workflow cancel",
        exits: &[(
            Exit::Failed,
            "refused: no daemon runs, no such workflow run, or it ended already",
        )],
        examples: &[(
            "npc workflow cancel wf-20261205t111406158z-8a3694f8",
            "Cancel its running steps' runs, deny its gates, end the rest",
        )],
    },
    Doc {
        command: "npc runs clean",
        exits: &[],
        examples: &[
            (
                "npc runs clean",
                "Remove the kept worktrees past the manifest's limits",
            ),
            (
                "npc runs clean --all",
                "Remove every kept worktree now (branches stay)",
            ),
        ],
    },
    Doc {
        command: "npc worker",
        exits: &[
            (Exit::Ok, "stopped by SIGINT or SIGTERM"),
            (
                Exit::Failed,
                "no `[store]`, or the store does not answer or is of another version",
            ),
        ],
        examples: &[
            (
                "npc worker",
                "Join the fleet and carry out the runs it claims",
            ),
            (
                "npc worker --lease-secs 60",
                "The same, a claim lost after 60 s without a heartbeat",
            ),
        ],
    },
    Doc {
        command: "npc workers",
        exits: &[(Exit::Failed, "no `[store]`, or the store does not answer")],
        examples: &[
            (
                "npc workers",
                "The fleet's workers: host, version, heartbeat age, runs",
            ),
            ("npc workers --format json", "The same, for a script"),
        ],
    },
    Doc {
        command: "npc store",
        exits: &[],
        examples: &[(
            "npc store migrate",
            "Bring the fleet's store to this npc's schema",
        )],
    },
    Doc {
        command: "npc store migrate",
        exits: &[(Exit::Failed, "no `[store]`, or the store does not answer")],
        examples: &[(
            "npc store migrate",
            "Bring the store `[store] url` names to this npc's schema version",
        )],
    },
];

/// Text safe in a roff paragraph: backslashes escaped, no line starting
/// with a control character.
fn roff(text: &str) -> String {
    text.replace('\\', "\\e")
        .lines()
        .map(|l| {
            if l.starts_with('.') || l.starts_with('\'') {
                format!("\\&{l}")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The schema a property points at (following one `$ref`).
fn resolve<'a>(schema: &'a Value, node: &'a Value) -> &'a Value {
    let reference = node["$ref"].as_str().or_else(|| {
        node["anyOf"]
            .as_array()
            .and_then(|v| v.iter().find_map(|s| s["$ref"].as_str()))
    });
    match reference.and_then(|r| r.strip_prefix("#/$defs/")) {
        Some(name) => &schema["$defs"][name],
        None => node,
    }
}

fn type_of(schema: &Value, node: &Value) -> String {
    let node = resolve(schema, node);
    if let Some(t) = node["type"].as_str() {
        return t.to_string();
    }
    if let Some(ts) = node["type"].as_array() {
        let names: Vec<&str> = ts.iter().filter_map(Value::as_str).collect();
        return names.join(" or ");
    }
    if node["properties"].is_object() {
        return "table".into();
    }
    "value".into()
}

/// `npcagent.toml(5)`: every top-level section and the keys one level in.
pub fn manifest_page() -> String {
    let schema = crate::model::schema();
    let mut page = String::new();
    page.push_str(&format!(
        ".TH NPCAGENT.TOML 5 \"\" \"npc {}\" \"npc manual\"\n",
        env!("CARGO_PKG_VERSION")
    ));
    page.push_str(".SH NAME\nnpcagent.toml \\- the npc manifest of a repository\n");
    page.push_str(
        ".SH SYNOPSIS\n\\fBnpcagent.toml\\fR or \\fBnpcagent.json\\fR at the repository's root\n",
    );
    page.push_str(".SH DESCRIPTION\n");
    page.push_str(&roff(schema["description"].as_str().unwrap_or_default()));
    page.push_str("\n.PP\nCheck it with \\fBnpc validate\\fR(1); the JSON Schema is printed by \\fBnpc schema\\fR.\n");
    page.push_str(".SH SECTIONS\n");
    let empty = serde_json::Map::new();
    let top = schema["properties"].as_object().unwrap_or(&empty);
    for (key, node) in top {
        if key == "$schema" {
            continue;
        }
        page.push_str(&format!(".SS {}\n", roff(key)));
        if let Some(d) = node["description"].as_str() {
            page.push_str(&roff(d));
            page.push('\n');
        }
        let mut target = resolve(&schema, node);
        // A map of named entries: describe one entry.
        if let Some(entry) = target.get("additionalProperties").filter(|v| v.is_object()) {
            page.push_str(&format!(".PP\nEach \\fB{}.NAME\\fR entry:\n", roff(key)));
            target = resolve(&schema, entry);
        }
        if let Some(props) = target["properties"].as_object() {
            for (name, prop) in props {
                page.push_str(&format!(
                    ".TP\n\\fB{}\\fR (\\fI{}\\fR)\n",
                    roff(name),
                    type_of(&schema, prop)
                ));
                let description = prop["description"]
                    .as_str()
                    .or_else(|| resolve(&schema, prop)["description"].as_str())
                    .unwrap_or("");
                page.push_str(&roff(description));
                page.push('\n');
            }
        }
    }
    page.push_str(".SH SEE ALSO\n\\fBnpc\\fR(1), \\fBnpc-validate\\fR(1), \\fBnpc-schema\\fR(1)\n");
    page
}

/// Write every page under `out` (`man1/`, `man5/`), or list them.
pub fn run(out: Option<&Path>) -> anyhow::Result<Exit> {
    let pages = pages()?;
    match out {
        Some(dir) => {
            for (path, text) in &pages {
                let path = dir.join(path);
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent)
                        .with_context(|| format!("cannot create `{}`", parent.display()))?;
                }
                std::fs::write(&path, text)
                    .with_context(|| format!("cannot write `{}`", path.display()))?;
            }
            errln!(
                "wrote {} pages under `{}`; add it to MANPATH, or copy man1/ and man5/ into ~/.local/share/man",
                pages.len(),
                dir.display()
            );
        }
        None => {
            for (path, _) in &pages {
                outln!("{}", path.display())?;
            }
        }
    }
    Ok(Exit::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The command of every page `npc man` writes (`npc runs approve`).
    fn commands(cmd: &clap::Command, name: &str, into: &mut Vec<String>) {
        into.push(name.to_string());
        for sub in cmd.get_subcommands() {
            if sub.get_name() != "help" && !sub.is_hide_set() {
                commands(sub, &format!("{name} {}", sub.get_name()), into);
            }
        }
    }

    #[test]
    fn every_command_has_one_entry_with_examples_and_every_entry_is_a_command() {
        let mut root = Cli::command();
        root.build();
        let mut names = Vec::new();
        commands(&root, "npc", &mut names);
        let mut documented: Vec<String> = DOCS.iter().map(|d| d.command.to_string()).collect();
        names.sort();
        documented.sort();
        assert_eq!(names, documented, "`DOCS` and the commands differ");
        for doc in DOCS {
            assert!(!doc.examples.is_empty(), "`{}` has no example", doc.command);
            for (line, _) in doc.examples {
                assert!(
                    line == &doc.command || line.starts_with(&format!("{} ", doc.command)),
                    "`{line}` is no example of `{}`",
                    doc.command
                );
            }
        }
    }

    #[test]
    fn a_page_has_exit_status_and_examples_before_its_version() {
        let pages = pages().unwrap();
        let (_, run) = pages
            .iter()
            .find(|(p, _)| p.ends_with("npc-run.1"))
            .unwrap();
        let run = String::from_utf8(run.clone()).unwrap();
        let status = run.find(".SH \"EXIT STATUS\"").unwrap();
        let examples = run.find(".SH EXAMPLES").unwrap();
        let version = run.find(VERSION_HEADING).unwrap();
        assert!(status < examples && examples < version);
        assert!(run.contains(".TP\n\\fB124\\fR\nthe run timed out"), "{run}");
        assert!(run.contains("npc run review \\-\\-prompt"), "{run}");
    }
}
