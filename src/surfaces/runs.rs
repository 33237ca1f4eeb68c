//! The wire types of a run request, shared by the clients that ask for runs
//! (the REST API's `POST /api/v1/runs`, `npc run` and `npc acp` over the
//! control socket) and the daemon that carries them out: pure serde data
//! with its bounds and shape checks, no behaviour. [`ManualRun`] is the
//! profile and the prompt; [`LocalRun`] adds what only a local front end
//! knows — the working directory, the timeout, the probe silence, a
//! [`Resume`] of the provider's conversation and an [`ApprovalRoute`] (the
//! approval socket and the ACP session, set in the agent's environment as
//! exactly `APPROVAL_SOCKET_ENV` and `APPROVAL_SESSION_ENV`, nothing else).
//! [`LocalRun::check`] bounds and validates each extra; the daemon checks
//! before a run is queued and again when the queued row is read back (the
//! store is a file in the repository).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::approval::{APPROVAL_SESSION_ENV, APPROVAL_SOCKET_ENV};

/// Prefix of every ACP session id `npc acp` makes.
pub const SESSION_ID_PREFIX: &str = "acp-";

/// A profile run started by hand (`POST /api/v1/runs`): the request body,
/// and the queue row's payload the executor runs it from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ManualRun {
    /// A `[profiles.NAME]` of the applied manifest.
    pub profile: String,
    /// The task prompt, used as written (instead of the profile's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// A `[prompts.NAME]` to render instead (with `vars`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_template: Option<String>,
    /// Variables for `prompt_template`.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub vars: std::collections::BTreeMap<String, String>,
    /// Where the run works: `worktree` (a git worktree of its own, its
    /// result a branch) or `in_place`; the daemon's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<crate::model::WorkspaceMode>,
    /// Another `[providers.NAME]` than the profile's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
}

/// A run an agent asked for with the gateway's `npc_delegate` (the queue
/// row's payload): the run, the run whose agent asked, and how deep in a
/// chain of delegations it is (1: asked by a run nobody delegated).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DelegatedRun {
    pub run: ManualRun,
    pub parent: String,
    pub depth: u32,
}

/// Longest prompt text a prompt sends to the daemon (the control channel
/// reads request lines of at most `control::MAX_REQUEST_BYTES`; JSON
/// escaping and the rest of the request need room). A longer prompt runs in
/// the `npc acp` process, as without a daemon.
pub const MAX_DAEMON_PROMPT_BYTES: usize = 32 * 1024;
/// Longest provider name a run by hand names (`npc run --provider`).
pub const MAX_PROVIDER_NAME_BYTES: usize = 128;
/// Longest provider conversation id a [`Resume`] carries.
pub const MAX_PROVIDER_SESSION_CHARS: usize = 200;
/// Longest ACP session id an [`ApprovalRoute`] carries.
pub const MAX_SESSION_ID_CHARS: usize = 64;
/// Longest working directory a [`LocalRun`] names, in bytes.
pub const MAX_CWD_BYTES: usize = 4096;
/// Longest timeout (or probe silence) a [`LocalRun`] asks for (the
/// `npc acp --timeout` and `npc run --timeout` range).
pub const MAX_TIMEOUT_SECS: u64 = u32::MAX as u64;

/// What a local front end (`npc run`, a prompt of `npc acp`) asks the
/// daemon to run: a [`ManualRun`] plus what only the front end knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalRun {
    /// The profile and the prompt (checked like `POST /api/v1/runs`).
    pub run: ManualRun,
    /// Where the agent runs (`npc run --cwd`, the ACP session's `cwd`); the
    /// repository root when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    /// The run's timeout in seconds (the daemon's default when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    /// Silence after which a provider with `probe_on_stale` is probed, in
    /// seconds (`npc run --probe-after`; the default when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_after_secs: Option<u64>,
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
    pub fn check(&self) -> Result<(), LocalRunError> {
        if !super::approval::valid_name(&self.socket) {
            return Err(LocalRunError::BadSocket);
        }
        if !valid_session_id(&self.session) {
            return Err(LocalRunError::BadSession);
        }
        Ok(())
    }
}

/// Why a [`LocalRun`] is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LocalRunError {
    #[error(
        "the prompt is longer than {MAX_DAEMON_PROMPT_BYTES} bytes; send it to `npc acp` without a daemon"
    )]
    PromptTooLong,
    #[error(
        "`resume.session` is not a provider session id (at most {MAX_PROVIDER_SESSION_CHARS} letters, digits, `-`, `_`, `.`, `:`, not starting with `-`)"
    )]
    BadProviderSession,
    #[error("`provider` must name a `[providers.NAME]` (1 to {MAX_PROVIDER_NAME_BYTES} bytes)")]
    BadProvider,
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
    #[error("`probe_after_secs` must be between 1 and {MAX_TIMEOUT_SECS}")]
    BadProbeAfter,
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

impl LocalRun {
    /// Check every extra against its bound and shape.
    pub fn check(&self) -> Result<(), LocalRunError> {
        if self
            .run
            .prompt
            .as_ref()
            .is_some_and(|p| p.len() > MAX_DAEMON_PROMPT_BYTES)
        {
            return Err(LocalRunError::PromptTooLong);
        }
        if self
            .run
            .provider
            .as_ref()
            .is_some_and(|p| p.is_empty() || p.len() > MAX_PROVIDER_NAME_BYTES)
        {
            return Err(LocalRunError::BadProvider);
        }
        if let Some(r) = &self.resume
            && !valid_provider_session(&r.session)
        {
            return Err(LocalRunError::BadProviderSession);
        }
        if let Some(a) = &self.approval {
            a.check()?;
        }
        if let Some(cwd) = &self.cwd
            && (!cwd.is_absolute() || cwd.as_os_str().len() > MAX_CWD_BYTES)
        {
            return Err(LocalRunError::BadCwd);
        }
        if let Some(t) = self.timeout_secs
            && !(1..=MAX_TIMEOUT_SECS).contains(&t)
        {
            return Err(LocalRunError::BadTimeout);
        }
        if let Some(t) = self.probe_after_secs
            && !(1..=MAX_TIMEOUT_SECS).contains(&t)
        {
            return Err(LocalRunError::BadProbeAfter);
        }
        Ok(())
    }

    /// The run's timeout, `default` when none was asked for.
    pub fn timeout(&self, default: Duration) -> Duration {
        self.timeout_secs.map_or(default, Duration::from_secs)
    }

    /// The run's probe silence, `default` when none was asked for.
    pub fn probe_after(&self, default: Duration) -> Duration {
        self.probe_after_secs.map_or(default, Duration::from_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> LocalRun {
        LocalRun {
            run: ManualRun {
                profile: "dev".into(),
                prompt: Some("hi".into()),
                prompt_template: None,
                vars: Default::default(),
                workspace: None,
                provider: None,
            },
            cwd: Some("/tmp".into()),
            timeout_secs: Some(60),
            probe_after_secs: Some(30),
            resume: Some(Resume {
                session: "5f0c-aa".into(),
                fork: false,
            }),
            approval: Some(ApprovalRoute {
                socket: format!(
                    "{}{}",
                    super::super::approval::SOCKET_NAME_PREFIX,
                    "a".repeat(32)
                ),
                session: "acp-20261201t002404123z-0a1b2c3d".into(),
            }),
        }
    }

    #[test]
    fn a_well_formed_run_passes_and_each_bad_extra_is_refused() {
        assert_eq!(run().check(), Ok(()));
        let refused = |edit: &dyn Fn(&mut LocalRun)| {
            let mut r = run();
            edit(&mut r);
            r.check().unwrap_err()
        };
        assert_eq!(
            refused(&|r| r.run.prompt = Some("x".repeat(MAX_DAEMON_PROMPT_BYTES + 1))),
            LocalRunError::PromptTooLong
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
                LocalRunError::BadProviderSession,
                "{bad}"
            );
        }
        assert_eq!(
            refused(&|r| r.approval.as_mut().unwrap().socket = "npc-acp-approval-zz".into()),
            LocalRunError::BadSocket
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
                LocalRunError::BadSession,
                "{bad}"
            );
        }
        assert_eq!(
            refused(&|r| r.cwd = Some("rel".into())),
            LocalRunError::BadCwd
        );
        assert_eq!(
            refused(&|r| r.timeout_secs = Some(0)),
            LocalRunError::BadTimeout
        );
        assert_eq!(
            refused(&|r| r.probe_after_secs = Some(0)),
            LocalRunError::BadProbeAfter
        );
    }

    #[test]
    fn no_field_beyond_the_typed_ones_is_accepted() {
        let mut v = serde_json::to_value(run()).unwrap();
        v["env"] = serde_json::json!({"LD_PRELOAD": "/x.so"});
        assert!(serde_json::from_value::<LocalRun>(v).is_err());
        let mut v = serde_json::to_value(run()).unwrap();
        v["approval"]["env"] = serde_json::json!("PATH");
        assert!(serde_json::from_value::<LocalRun>(v).is_err());
    }
}
