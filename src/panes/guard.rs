//! The guard: [`Guard::judge`] is the one function that decides whether a
//! plugin's command may act on a pane. Nothing reaches a PTY from a plugin
//! but an [`Approved`] it returned, and only this module can make one (its
//! [`Seal`] cannot be built elsewhere; a test in `tests/integration/panes.rs`
//! checks it mechanically).
//!
//! Rules (seed 002): a plugin watches the panes whose entry names it, and
//! others only through `watch_pane` when its `watch_on_signal` is on, the
//! pane is live and nobody else watches it (the token identifies a pane; it
//! never authorises by itself). Pane-scoped commands need the token and the
//! pane's current generation. `send_input` needs a live, idle pane;
//! `relaunch` an exited pane still held for relaunch, with a reproducible
//! launch command (never a bare shell), and resume arguments whose first
//! argument and every flag are in `allowed_resume_flags`, with no shell
//! metacharacters. Approvals of input and relaunch count against a budget
//! per token and time window, which survives relaunches and reloads.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use super::protocol::{LogLevel, PluginCommand};

/// Approvals of input and relaunch per pane token within [`BUDGET_WINDOW`].
pub const BUDGET_APPROVALS: usize = 8;
/// The window of [`BUDGET_APPROVALS`].
pub const BUDGET_WINDOW: Duration = Duration::from_secs(60);
/// Tokens whose budgets are remembered (the oldest are forgotten first).
pub const MAX_BUDGETS: usize = 4096;
/// Characters a shell would interpret: a resume argument holding one is refused.
pub const SHELL_METACHARACTERS: &[char] = &[
    ';', '&', '|', '`', '$', '(', ')', '<', '>', '\\', '"', '\'', '*', '?', '[', ']', '{', '}',
    '~', '!', '#', '\n', '\r', '\0', '\t', ' ',
];
/// Programs that are shells: a pane running one has no reproducible launch
/// command, so it is never relaunched.
pub const SHELLS: &[&str] = &[
    "sh", "bash", "zsh", "fish", "dash", "ksh", "mksh", "tcsh", "csh", "nu", "pwsh", "xonsh",
    "elvish", "ash", "busybox",
];

/// Proof that [`Guard::judge`] made an [`Approved`]; only this module builds one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seal(());

/// What the guard allowed. Carries a [`Seal`], so only the guard makes one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Approved {
    /// Type `data` into the pane (live, idle, current generation).
    Input {
        token: String,
        generation: u64,
        data: String,
        seal: Seal,
    },
    /// Start the exited pane's launch command again with these arguments added.
    Relaunch {
        token: String,
        generation: u64,
        resume_args: Vec<String>,
        seal: Seal,
    },
    /// Add the pane to the plugin's watched panes.
    Watch { token: String, seal: Seal },
    /// Broadcast a status report of a watched pane.
    Status {
        token: String,
        state: String,
        detail: Option<String>,
        deadline_epoch: Option<i64>,
        attempt: u32,
        seal: Seal,
    },
    /// Broadcast that a watched pane needs a person.
    Attention { token: String, seal: Seal },
    /// Write to npc's log.
    Log {
        level: LogLevel,
        message: String,
        seal: Seal,
    },
}

/// Why the guard refused a command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no pane with this token")]
    UnknownPane,
    #[error("generation {got} is stale; the pane is at generation {current}")]
    StaleGeneration { got: u64, current: u64 },
    #[error("the plugin does not watch this pane")]
    NotWatching,
    #[error("the pane is not live")]
    NotLive,
    #[error("the pane is busy (not idle)")]
    Busy,
    #[error("the pane has not exited")]
    NotExited,
    #[error("the pane is no longer held for relaunch")]
    NotHeld,
    #[error("the pane's launch command is a shell, which is never relaunched")]
    BareShell,
    #[error("resume argument `{0}` is not in `allowed_resume_flags`")]
    FlagNotAllowed(String),
    #[error("resume argument `{0}` holds a shell metacharacter")]
    Metacharacter(String),
    #[error("the pane's budget of {BUDGET_APPROVALS} approvals per {BUDGET_WINDOW:?} is spent")]
    BudgetExhausted,
    #[error("the plugin has `watch_on_signal = false`")]
    WatchNotAllowed,
    #[error("another plugin watches this pane")]
    AlreadyWatched,
}

/// What the guard knows of a pane when it decides.
#[derive(Debug, Clone)]
pub struct PaneFacts<'a> {
    pub generation: u64,
    /// The process runs.
    pub live: bool,
    pub idle: bool,
    /// Exited and held for relaunch.
    pub held: bool,
    /// The launch program (first word of the command).
    pub program: &'a str,
}

/// What the guard knows of the plugin asking, read from its current config.
#[derive(Debug, Clone)]
pub struct PluginFacts<'a> {
    pub name: &'a str,
    pub watch_on_signal: bool,
    pub allowed_resume_flags: &'a [String],
}

/// Watchers and budgets; one per host, kept across reloads.
#[derive(Debug, Default)]
pub struct Guard {
    /// Pane token → the plugin watching it.
    watchers: BTreeMap<String, String>,
    /// Pane token → times of recent approvals.
    budgets: BTreeMap<String, VecDeque<Instant>>,
}

impl Guard {
    /// The plugin watching the pane with `token`.
    pub fn watcher(&self, token: &str) -> Option<&str> {
        self.watchers.get(token).map(String::as_str)
    }

    /// A pane was opened whose entry names `plugin` (the operator's opt-in).
    pub fn opt_in(&mut self, token: &str, plugin: &str) {
        self.watchers.insert(token.to_string(), plugin.to_string());
    }

    /// The pane is gone: nobody watches it any more (its budget stays, so
    /// closing and relaunching cannot reset it).
    pub fn forget(&mut self, token: &str) {
        self.watchers.remove(token);
    }

    /// `plugin` was disabled or removed: it watches nothing any more.
    /// Returns the tokens it watched.
    pub fn release(&mut self, plugin: &str) -> Vec<String> {
        let tokens: Vec<String> = self
            .watchers
            .iter()
            .filter(|(_, p)| p.as_str() == plugin)
            .map(|(t, _)| t.clone())
            .collect();
        for t in &tokens {
            self.watchers.remove(t);
        }
        tokens
    }

    /// Every token `plugin` watches.
    pub fn watched_by(&self, plugin: &str) -> Vec<String> {
        self.watchers
            .iter()
            .filter(|(_, p)| p.as_str() == plugin)
            .map(|(t, _)| t.clone())
            .collect()
    }

    /// Decide `command` from `plugin`; `pane` looks a pane up by token.
    /// The only place any authorisation decision is made.
    pub fn judge<'p>(
        &mut self,
        plugin: &PluginFacts<'_>,
        command: PluginCommand,
        pane: impl Fn(&str) -> Option<PaneFacts<'p>>,
        now: Instant,
    ) -> Result<Approved, Refusal> {
        let seal = || Seal(());
        match command {
            PluginCommand::Log { level, message, .. } => Ok(Approved::Log {
                level,
                message,
                seal: seal(),
            }),
            PluginCommand::WatchPane { token, .. } => {
                let facts = pane(&token).ok_or(Refusal::UnknownPane)?;
                if !plugin.watch_on_signal {
                    return Err(Refusal::WatchNotAllowed);
                }
                if !facts.live {
                    return Err(Refusal::NotLive);
                }
                match self.watcher(&token) {
                    Some(p) if p == plugin.name => {}
                    Some(_) => return Err(Refusal::AlreadyWatched),
                    None => {}
                }
                self.watchers.insert(token.clone(), plugin.name.to_string());
                Ok(Approved::Watch {
                    token,
                    seal: seal(),
                })
            }
            PluginCommand::SendInput {
                token,
                generation,
                data,
                ..
            } => {
                let facts = self.scoped(plugin, &token, generation, &pane)?;
                if !facts.live {
                    return Err(Refusal::NotLive);
                }
                if !facts.idle {
                    return Err(Refusal::Busy);
                }
                self.spend(&token, now)?;
                Ok(Approved::Input {
                    token,
                    generation,
                    data,
                    seal: seal(),
                })
            }
            PluginCommand::Relaunch {
                token,
                generation,
                resume_args,
                ..
            } => {
                let facts = self.scoped(plugin, &token, generation, &pane)?;
                if facts.live {
                    return Err(Refusal::NotExited);
                }
                if is_shell(facts.program) {
                    return Err(Refusal::BareShell);
                }
                if !facts.held {
                    return Err(Refusal::NotHeld);
                }
                check_resume_args(&resume_args, plugin.allowed_resume_flags)?;
                self.spend(&token, now)?;
                Ok(Approved::Relaunch {
                    token,
                    generation,
                    resume_args,
                    seal: seal(),
                })
            }
            PluginCommand::Status {
                token,
                generation,
                state,
                detail,
                deadline_epoch,
                attempt,
                ..
            } => {
                self.scoped(plugin, &token, generation, &pane)?;
                Ok(Approved::Status {
                    token,
                    state,
                    detail,
                    deadline_epoch,
                    attempt,
                    seal: seal(),
                })
            }
            PluginCommand::Attention {
                token, generation, ..
            } => {
                self.scoped(plugin, &token, generation, &pane)?;
                Ok(Approved::Attention {
                    token,
                    seal: seal(),
                })
            }
        }
    }

    /// A pane-scoped command: the pane exists, the plugin watches it, and
    /// the generation is current.
    fn scoped<'p>(
        &self,
        plugin: &PluginFacts<'_>,
        token: &str,
        generation: u64,
        pane: &impl Fn(&str) -> Option<PaneFacts<'p>>,
    ) -> Result<PaneFacts<'p>, Refusal> {
        let facts = pane(token).ok_or(Refusal::UnknownPane)?;
        if self.watcher(token) != Some(plugin.name) {
            return Err(Refusal::NotWatching);
        }
        if facts.generation != generation {
            return Err(Refusal::StaleGeneration {
                got: generation,
                current: facts.generation,
            });
        }
        Ok(facts)
    }

    /// Count one approval against the token's window budget.
    fn spend(&mut self, token: &str, now: Instant) -> Result<(), Refusal> {
        if !self.budgets.contains_key(token) && self.budgets.len() >= MAX_BUDGETS {
            // Forget the budget used longest ago.
            let oldest = self
                .budgets
                .iter()
                .min_by_key(|(_, times)| times.back().copied())
                .map(|(t, _)| t.clone());
            if let Some(t) = oldest {
                self.budgets.remove(&t);
            }
        }
        let times = self.budgets.entry(token.to_string()).or_default();
        while times
            .front()
            .is_some_and(|t| now.duration_since(*t) >= BUDGET_WINDOW)
        {
            times.pop_front();
        }
        if times.len() >= BUDGET_APPROVALS {
            return Err(Refusal::BudgetExhausted);
        }
        times.push_back(now);
        Ok(())
    }
}

/// Whether `program` (a path or a name) is a shell.
pub fn is_shell(program: &str) -> bool {
    let base = program.rsplit('/').next().unwrap_or(program);
    let base = base.strip_prefix('-').unwrap_or(base);
    SHELLS.contains(&base)
}

/// The first argument and every argument that looks like a flag or a path
/// (`-…`, `/…`) must be allowed; no argument may hold a shell metacharacter.
fn check_resume_args(args: &[String], allowed: &[String]) -> Result<(), Refusal> {
    for (i, arg) in args.iter().enumerate() {
        if arg.is_empty() || arg.contains(SHELL_METACHARACTERS) {
            return Err(Refusal::Metacharacter(arg.chars().take(40).collect()));
        }
        let flag = arg.split_once('=').map_or(arg.as_str(), |(f, _)| f);
        let must_be_allowed = i == 0 || arg.starts_with('-') || arg.starts_with('/');
        if must_be_allowed && !allowed.iter().any(|a| a == flag) {
            return Err(Refusal::FlagNotAllowed(arg.chars().take(40).collect()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLAGS: &[&str] = &["resume", "--session"];

    fn plugin(flags: &[String], watch: bool) -> PluginFacts<'_> {
        PluginFacts {
            name: "rec",
            watch_on_signal: watch,
            allowed_resume_flags: flags,
        }
    }

    fn facts(live: bool, idle: bool, held: bool, program: &str) -> PaneFacts<'_> {
        PaneFacts {
            generation: 2,
            live,
            idle,
            held,
            program,
        }
    }

    fn input(generation: u64) -> PluginCommand {
        PluginCommand::SendInput {
            v: 3,
            token: "t".into(),
            generation,
            data: "y\r".into(),
        }
    }

    fn relaunch(args: &[&str]) -> PluginCommand {
        PluginCommand::Relaunch {
            v: 3,
            token: "t".into(),
            generation: 2,
            resume_args: args.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn every_rule_refuses_its_case() {
        let flags: Vec<String> = FLAGS.iter().map(|s| s.to_string()).collect();
        let p = plugin(&flags, false);
        let now = Instant::now();
        let mut g = Guard::default();
        let live_idle = |_: &str| Some(facts(true, true, false, "codex"));
        assert_eq!(
            g.judge(&p, input(2), live_idle, now),
            Err(Refusal::NotWatching)
        );
        g.opt_in("t", "rec");
        assert_eq!(
            g.judge(&p, input(2), |_| None, now),
            Err(Refusal::UnknownPane)
        );
        assert_eq!(
            g.judge(&p, input(1), live_idle, now),
            Err(Refusal::StaleGeneration { got: 1, current: 2 })
        );
        assert_eq!(
            g.judge(
                &p,
                input(2),
                |_| Some(facts(true, false, false, "codex")),
                now
            ),
            Err(Refusal::Busy)
        );
        assert!(matches!(
            g.judge(&p, input(2), live_idle, now),
            Ok(Approved::Input { .. })
        ));
        let exited = |_: &str| Some(facts(false, false, true, "codex"));
        assert_eq!(
            g.judge(&p, relaunch(&["--yolo"]), exited, now),
            Err(Refusal::FlagNotAllowed("--yolo".into()))
        );
        assert_eq!(
            g.judge(&p, relaunch(&["resume", "a;b"]), exited, now),
            Err(Refusal::Metacharacter("a;b".into()))
        );
        assert_eq!(
            g.judge(
                &p,
                relaunch(&["resume", "x"]),
                |_| Some(facts(false, false, true, "/bin/bash")),
                now
            ),
            Err(Refusal::BareShell)
        );
        assert_eq!(
            g.judge(
                &p,
                relaunch(&["resume", "x"]),
                |_| Some(facts(false, false, false, "codex")),
                now
            ),
            Err(Refusal::NotHeld)
        );
        assert_eq!(
            g.judge(&p, relaunch(&["resume", "x"]), live_idle, now),
            Err(Refusal::NotExited)
        );
        assert!(matches!(
            g.judge(&p, relaunch(&["resume", "x"]), exited, now),
            Ok(Approved::Relaunch { .. })
        ));
        let watch = PluginCommand::WatchPane {
            v: 3,
            token: "u".into(),
        };
        assert_eq!(
            g.judge(&p, watch.clone(), live_idle, now),
            Err(Refusal::WatchNotAllowed)
        );
        let other = PluginFacts {
            name: "other",
            watch_on_signal: true,
            allowed_resume_flags: &[],
        };
        assert_eq!(
            g.judge(
                &other,
                PluginCommand::WatchPane {
                    v: 3,
                    token: "t".into()
                },
                live_idle,
                now
            ),
            Err(Refusal::AlreadyWatched)
        );
        assert!(matches!(
            g.judge(&other, watch, live_idle, now),
            Ok(Approved::Watch { .. })
        ));
    }

    #[test]
    fn the_budget_spans_the_window_and_refills_after_it() {
        let p = plugin(&[], false);
        let mut g = Guard::default();
        g.opt_in("t", "rec");
        let live_idle = |_: &str| Some(facts(true, true, false, "codex"));
        let start = Instant::now();
        for _ in 0..BUDGET_APPROVALS {
            assert!(g.judge(&p, input(2), live_idle, start).is_ok());
        }
        assert_eq!(
            g.judge(&p, input(2), live_idle, start),
            Err(Refusal::BudgetExhausted)
        );
        // Forgetting the pane (close, relaunch) keeps its budget.
        g.forget("t");
        g.opt_in("t", "rec");
        assert_eq!(
            g.judge(&p, input(2), live_idle, start),
            Err(Refusal::BudgetExhausted)
        );
        assert!(
            g.judge(&p, input(2), live_idle, start + BUDGET_WINDOW)
                .is_ok()
        );
    }
}
