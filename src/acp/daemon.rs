//! `npc acp`'s prompts as runs of the daemon. When a daemon holds the
//! repository, a prompt does not run in the `npc acp` process: it asks the
//! daemon over the control channel ([`crate::surfaces::control::Request::AcpRun`])
//! to queue an [`AcpRun`] — a manual run (`@manual` queue, origin `acp`)
//! plus what only `npc acp` knows — so the run appears in `npc events`, the
//! API and the dashboard as the daemon's, with `source: "acp"`. The extras
//! are typed, not free-form: the working directory, the timeout, a
//! [`Resume`] of the provider's conversation (the daemon turns it into the
//! CLI's arguments with [`super::resume_args`], the same function the
//! in-process path uses) and an [`ApprovalRoute`] (the approval socket and
//! the ACP session, set as exactly [`APPROVAL_SOCKET_ENV`] and
//! [`APPROVAL_SESSION_ENV`], nothing else). [`AcpRun::check`] bounds and
//! validates each of them in the daemon, before the run is queued and again
//! when the queued row is read back (the store is a file in the
//! repository). `npc acp` then tails the run's events from the store and
//! maps them like its own; `session/cancel` asks the daemon to cancel the
//! run ([`crate::surfaces::control::Request::CancelRun`]).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{SESSION_ID_PREFIX, resume_args};
use crate::model::ProviderKind;
use crate::runs::PreparedRun;
use crate::surfaces::approval::{self, APPROVAL_SESSION_ENV, APPROVAL_SOCKET_ENV};
use crate::triggers::ManualRun;

/// Longest prompt text a prompt sends to the daemon (the control channel
/// reads request lines of at most `control::MAX_REQUEST_BYTES`; JSON
/// escaping and the rest of the request need room). A longer prompt runs in
/// the `npc acp` process, as without a daemon.
pub const MAX_DAEMON_PROMPT_BYTES: usize = 32 * 1024;
/// Longest provider conversation id a [`Resume`] carries.
pub const MAX_PROVIDER_SESSION_CHARS: usize = 200;
/// Longest ACP session id an [`ApprovalRoute`] carries.
pub const MAX_SESSION_ID_CHARS: usize = 64;
/// Longest working directory an [`AcpRun`] names, in bytes.
pub const MAX_CWD_BYTES: usize = 4096;
/// Longest timeout an [`AcpRun`] asks for (the `npc acp --timeout` range).
pub const MAX_TIMEOUT_SECS: u64 = u32::MAX as u64;

/// What `npc acp` asks the daemon to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcpRun {
    /// The profile and the prompt (checked like `POST /api/v1/runs`).
    pub run: ManualRun,
    /// Where the agent runs (the session's `cwd`); the repository root when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    /// The run's timeout in seconds (the daemon's default when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    /// Continue (or fork) the provider's conversation of an earlier prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<Resume>,
    /// Where the agent's hooks ask the user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalRoute>,
}

/// The provider conversation a prompt continues.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resume {
    /// The provider's own session id (its `agent.started` event).
    pub session: String,
    /// Branch off it as a new conversation (a forked session's first prompt).
    pub fork: bool,
}

/// The `npc acp` a run's hooks ask on `ask`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRoute {
    /// The approval socket's abstract name (`surfaces::approval::bind`).
    pub socket: String,
    /// The ACP session the run is a prompt of.
    pub session: String,
}

impl ApprovalRoute {
    /// The route of `npc acp`'s approval variables in this process's
    /// environment, if both are set.
    pub fn from_env() -> Option<Self> {
        Some(Self {
            socket: std::env::var(APPROVAL_SOCKET_ENV).ok()?,
            session: std::env::var(APPROVAL_SESSION_ENV).ok()?,
        })
    }

    /// Whether the socket is one `npc acp` makes and the session an ACP
    /// session id.
    pub fn check(&self) -> Result<(), AcpRunError> {
        if !approval::valid_name(&self.socket) {
            return Err(AcpRunError::BadSocket);
        }
        if !valid_session_id(&self.session) {
            return Err(AcpRunError::BadSession);
        }
        Ok(())
    }
}

/// Why an [`AcpRun`] is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AcpRunError {
    #[error(
        "the prompt is longer than {MAX_DAEMON_PROMPT_BYTES} bytes; send it to `npc acp` without a daemon"
    )]
    PromptTooLong,
    #[error(
        "`resume.session` is not a provider session id (at most {MAX_PROVIDER_SESSION_CHARS} letters, digits, `-`, `_`, `.`, `:`, not starting with `-`)"
    )]
    BadProviderSession,
    #[error("`approval.socket` is not an approval socket name `npc acp` makes")]
    BadSocket,
    #[error(
        "`approval.session` is not an ACP session id (`{SESSION_ID_PREFIX}…`, at most {MAX_SESSION_ID_CHARS} lowercase letters, digits and `-`)"
    )]
    BadSession,
    #[error("`cwd` must be an absolute path of at most {MAX_CWD_BYTES} bytes")]
    BadCwd,
    #[error("`timeout_secs` must be between 1 and {MAX_TIMEOUT_SECS}")]
    BadTimeout,
}

/// Whether `id` can be a provider's conversation id passed on a command
/// line: bounded, a safe alphabet, never an option.
pub fn valid_provider_session(id: &str) -> bool {
    !id.is_empty()
        && id.chars().count() <= MAX_PROVIDER_SESSION_CHARS
        && !id.starts_with('-')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c))
}

/// Whether `id` has the shape of the ACP session ids `npc acp` makes.
pub fn valid_session_id(id: &str) -> bool {
    id.len() <= MAX_SESSION_ID_CHARS
        && id.strip_prefix(SESSION_ID_PREFIX).is_some_and(|rest| {
            !rest.is_empty()
                && rest
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

impl AcpRun {
    /// Check every extra against its bound and shape.
    pub fn check(&self) -> Result<(), AcpRunError> {
        if self
            .run
            .prompt
            .as_ref()
            .is_some_and(|p| p.len() > MAX_DAEMON_PROMPT_BYTES)
        {
            return Err(AcpRunError::PromptTooLong);
        }
        if let Some(r) = &self.resume
            && !valid_provider_session(&r.session)
        {
            return Err(AcpRunError::BadProviderSession);
        }
        if let Some(a) = &self.approval {
            a.check()?;
        }
        if let Some(cwd) = &self.cwd
            && (!cwd.is_absolute() || cwd.as_os_str().len() > MAX_CWD_BYTES)
        {
            return Err(AcpRunError::BadCwd);
        }
        if let Some(t) = self.timeout_secs
            && !(1..=MAX_TIMEOUT_SECS).contains(&t)
        {
            return Err(AcpRunError::BadTimeout);
        }
        Ok(())
    }

    /// The run's timeout, `default` when none was asked for.
    pub fn timeout(&self, default: Duration) -> Duration {
        self.timeout_secs.map_or(default, Duration::from_secs)
    }
}

/// Give a prepared run what a prompt of `npc acp` adds: the provider's
/// resume arguments in their place and the approval route's two variables.
/// The one place both paths (in process and in the daemon) do it.
pub fn apply(prepared: &mut PreparedRun, resume: Option<&Resume>, route: Option<&ApprovalRoute>) {
    if let Some(r) = resume {
        let extra = resume_args(prepared.kind, &r.session, r.fork);
        let at = resume_position(prepared.kind, &prepared.spec.args);
        prepared.spec.args.splice(at..at, extra);
    }
    if let Some(route) = route {
        prepared
            .spec
            .env
            .insert(APPROVAL_SOCKET_ENV.to_string(), route.socket.clone());
        prepared
            .spec
            .env
            .insert(APPROVAL_SESSION_ENV.to_string(), route.session.clone());
    }
}

/// Where [`resume_args`] go in a launch's arguments: first for Claude Code,
/// after the `run` subcommand for OpenCode.
pub fn resume_position(kind: ProviderKind, args: &[String]) -> usize {
    match kind {
        ProviderKind::Opencode => usize::from(args.first().is_some_and(|a| a == "run")),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> AcpRun {
        AcpRun {
            run: ManualRun {
                profile: "dev".into(),
                prompt: Some("hi".into()),
                prompt_template: None,
                vars: Default::default(),
            },
            cwd: Some("/tmp".into()),
            timeout_secs: Some(60),
            resume: Some(Resume {
                session: "5f0c-aa".into(),
                fork: false,
            }),
            approval: Some(ApprovalRoute {
                socket: format!("{}{}", approval::SOCKET_NAME_PREFIX, "a".repeat(32)),
                session: "acp-20261201t002404123z-0a1b2c3d".into(),
            }),
        }
    }

    #[test]
    fn a_well_formed_run_passes_and_each_bad_extra_is_refused() {
        assert_eq!(run().check(), Ok(()));
        let refused = |edit: &dyn Fn(&mut AcpRun)| {
            let mut r = run();
            edit(&mut r);
            r.check().unwrap_err()
        };
        assert_eq!(
            refused(&|r| r.run.prompt = Some("x".repeat(MAX_DAEMON_PROMPT_BYTES + 1))),
            AcpRunError::PromptTooLong
        );
        for bad in [
            "",
            "--dangerously-skip-permissions",
            "a b",
            "a;rm",
            &"a".repeat(201),
        ] {
            let bad = bad.to_string();
            assert_eq!(
                refused(&|r| r.resume.as_mut().unwrap().session = bad.clone()),
                AcpRunError::BadProviderSession,
                "{bad}"
            );
        }
        assert_eq!(
            refused(&|r| r.approval.as_mut().unwrap().socket = "npc-acp-approval-zz".into()),
            AcpRunError::BadSocket
        );
        for bad in [
            "run-1",
            "acp-",
            "acp-A",
            "acp-x;y",
            &format!("acp-{}", "a".repeat(64)),
        ] {
            let bad = bad.to_string();
            assert_eq!(
                refused(&|r| r.approval.as_mut().unwrap().session = bad.clone()),
                AcpRunError::BadSession,
                "{bad}"
            );
        }
        assert_eq!(
            refused(&|r| r.cwd = Some("rel".into())),
            AcpRunError::BadCwd
        );
        assert_eq!(
            refused(&|r| r.timeout_secs = Some(0)),
            AcpRunError::BadTimeout
        );
    }

    #[test]
    fn no_field_beyond_the_typed_ones_is_accepted() {
        let mut v = serde_json::to_value(run()).unwrap();
        v["env"] = serde_json::json!({"LD_PRELOAD": "/x.so"});
        assert!(serde_json::from_value::<AcpRun>(v).is_err());
        let mut v = serde_json::to_value(run()).unwrap();
        v["approval"]["env"] = serde_json::json!("PATH");
        assert!(serde_json::from_value::<AcpRun>(v).is_err());
    }

    #[test]
    fn apply_puts_resume_arguments_in_place_and_sets_only_the_two_variables() {
        let spec = crate::supervisor::ChildSpec::new("opencode".to_string(), PathBuf::from("/"))
            .args(["run".to_string(), "--format".to_string()]);
        let mut prepared = PreparedRun {
            id: "run-1".into(),
            profile: "dev".into(),
            provider: "p".into(),
            kind: ProviderKind::Opencode,
            prompt: "hi".into(),
            spec,
            tool_cwd: PathBuf::from("/"),
            mcp_config: None,
            timeout: Duration::from_secs(1),
            probe_after: Duration::from_secs(1),
            warnings: Vec::new(),
            source: None,
        };
        let before = prepared.spec.env.len();
        let r = run();
        apply(&mut prepared, r.resume.as_ref(), r.approval.as_ref());
        assert_eq!(
            prepared.spec.args,
            ["run", "--session", "5f0c-aa", "--format"]
        );
        assert_eq!(prepared.spec.env.len(), before + 2);
        assert_eq!(
            prepared.spec.env[APPROVAL_SESSION_ENV],
            "acp-20261201t002404123z-0a1b2c3d"
        );
    }
}
