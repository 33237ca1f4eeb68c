//! The approvers of unattended runs. [`ParkApprover`]: an `ask` of a run
//! (its `NPC_RUN_ID`) parks the call in the repository's store
//! (`store::approvals`): the run reads `waiting`, a `run.waiting` event
//! carries the question (arguments redacted like every event), and the
//! asker polls the row every [`POLL_INTERVAL`] until a person answers
//! (`npc runs approve` / `deny`, the REST API, the dashboard) or the run's
//! `approval_timeout` passes (then it is denied: `run.approval` with
//! `timeout` and a `tool.denied` by `approval`). It asks only when someone
//! can answer (its `reach` check: a daemon holds the repository); else,
//! and for [`NoOneToAsk`], the call is denied and the denial recorded
//! (`tool.denied`, by `approval`, reason "no one to ask: …"): no ask is
//! ever denied silently. [`ChannelApprover`]: a sandboxed run's ask, which
//! cannot write the store, goes over the run's channel to the process that
//! owns the run, which parks it there (`runs::channel`).

use std::sync::Arc;
use std::time::Duration;

use crate::bus::EventBus;
use crate::event::{ApprovalDecision, DeniedBy, Event, RunApproval, RunWaiting, ToolDenied};
use crate::model::Manifest;
use crate::store::Store;
use crate::store::approvals::{NewApproval, Parked, bounded_arguments, call_fingerprint, state};

use super::{Approval, ApprovalRequest, Approve};

/// How often a parked ask reads its row for an answer (the answer's
/// latency is about half of it on average).
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// Consecutive failed reads of a parked row after which the ask is denied.
pub const MAX_FAILED_POLLS: u32 = 50;
/// Prefix of an approval id (then 16 random hex digits).
pub const APPROVAL_ID_PREFIX: &str = "ap-";

/// Whether someone can answer now: `Err(why)` when nobody can.
pub type Reach = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Parks an `ask` of run `run_id` until a person answers (see the module).
#[derive(Clone)]
pub struct ParkApprover {
    store: Arc<Store>,
    bus: Option<EventBus>,
    run_id: String,
    profile: Option<String>,
    manifest: Arc<Manifest>,
    reach: Reach,
}

impl std::fmt::Debug for ParkApprover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParkApprover")
            .field("run_id", &self.run_id)
            .field("profile", &self.profile)
            .finish_non_exhaustive()
    }
}

impl ParkApprover {
    pub fn new(
        store: Arc<Store>,
        bus: Option<EventBus>,
        run_id: String,
        profile: Option<String>,
        manifest: Arc<Manifest>,
        reach: Reach,
    ) -> Self {
        Self {
            store,
            bus,
            run_id,
            profile,
            manifest,
            reach,
        }
    }

    async fn publish(&self, event: Event) {
        publish(self.bus.as_ref(), Some(&self.run_id), event).await;
    }

    async fn denied(&self, request: &ApprovalRequest, reason: String) -> Approval {
        record_denial(
            self.bus.as_ref(),
            Some(&self.run_id),
            self.profile.as_deref(),
            request,
            &reason,
        )
        .await;
        Approval::Deny { reason }
    }

    async fn park(&self, request: ApprovalRequest) -> Approval {
        if let Err(why) = (self.reach)() {
            return self.denied(&request, format!("no one to ask: {why}")).await;
        }
        let store = self.store.clone();
        let id = self.run_id.clone();
        let row = tokio::task::spawn_blocking(move || store.run_row(&id))
            .await
            .ok()
            .and_then(Result::ok)
            .flatten();
        let Some(row) = row else {
            let why = format!(
                "run `{}` is not in this repository's store, so no answer could reach it",
                self.run_id
            );
            return self.denied(&request, format!("no one to ask: {why}")).await;
        };
        let trigger = (row.trigger != crate::store::queue::MANUAL_QUEUE).then_some(row.trigger);
        let timeout_secs = self
            .manifest
            .approval_timeout_secs(self.profile.as_deref(), trigger.as_deref());
        let timeout = Duration::from_secs(timeout_secs);
        let deadline_ms = crate::store::now_ms()
            .saturating_add(i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX));
        let call = &request.tool_call;
        let mut shown = bounded_arguments(&call.arguments);
        let mut reason = request.reason.clone();
        if let Some(bus) = &self.bus {
            let secrets = bus.secrets();
            crate::bus::redact_json(&mut shown, &secrets);
            if let Some(r) = &reason {
                reason = Some(crate::bus::redact_str(r, &secrets).unwrap_or(r.clone()));
            }
        }
        let approval_id = new_approval_id();
        let new = NewApproval {
            id: approval_id.clone(),
            run_id: self.run_id.clone(),
            profile: self.profile.clone(),
            tool: call.name.clone(),
            rule: request.hook.clone(),
            reason: reason.clone(),
            arguments: shown.clone(),
            fingerprint: call_fingerprint(&call.name, &call.arguments),
            deadline_ms,
        };
        match self.store.park_approval(new).await {
            Ok(Parked::Waiting) => {}
            Ok(Parked::AlwaysAllowed) => {
                self.publish(Event::RunApproval(RunApproval {
                    run_id: self.run_id.clone(),
                    approval_id,
                    tool: call.name.clone(),
                    decision: ApprovalDecision::Always,
                    always: true,
                    by: "always".into(),
                    reason: None,
                }))
                .await;
                return Approval::Allow;
            }
            Ok(Parked::TooMany) => {
                let why = format!(
                    "run `{}` already waits on {} approvals",
                    self.run_id,
                    crate::store::approvals::MAX_PENDING_PER_RUN
                );
                return self.denied(&request, format!("no one to ask: {why}")).await;
            }
            Err(e) => {
                let why = format!("the approval could not be stored: {e}");
                return self.denied(&request, format!("no one to ask: {why}")).await;
            }
        }
        self.publish(Event::RunWaiting(RunWaiting {
            run_id: self.run_id.clone(),
            approval_id: approval_id.clone(),
            profile: self.profile.clone(),
            tool: call.name.clone(),
            rule: request.hook.clone(),
            reason,
            arguments: shown,
            deadline_ms,
        }))
        .await;
        self.wait(&approval_id, &request, timeout, timeout_secs)
            .await
    }

    /// Poll approval `id` until it is answered or `timeout` passes.
    async fn wait(
        &self,
        id: &str,
        request: &ApprovalRequest,
        timeout: Duration,
        timeout_secs: u64,
    ) -> Approval {
        let until = tokio::time::Instant::now() + timeout;
        let mut failures = 0;
        loop {
            let store = self.store.clone();
            let key = id.to_string();
            let row = tokio::task::spawn_blocking(move || store.approval(&key))
                .await
                .ok()
                .and_then(Result::ok)
                .flatten();
            match row {
                Some(row) if row.state == state::ALLOWED => return Approval::Allow,
                Some(row) if row.state != state::PENDING => {
                    // The answerer recorded the denial (`tool.denied`).
                    return Approval::Deny {
                        reason: row
                            .answer
                            .unwrap_or_else(|| format!("the approval is {}", row.state)),
                    };
                }
                Some(_) => failures = 0,
                None => failures += 1,
            }
            if failures >= MAX_FAILED_POLLS {
                let why = format!("approval `{id}` could not be read back from the store");
                return self.denied(request, why).await;
            }
            if tokio::time::Instant::now() >= until {
                let reason = format!(
                    "nobody answered within {timeout_secs}s (`approval_timeout`); answer sooner with `npc runs approve {}`, or raise `approval_timeout`",
                    self.run_id
                );
                match self.store.expire_approval(id, reason.clone()).await {
                    Ok(true) => {
                        self.publish(Event::RunApproval(RunApproval {
                            run_id: self.run_id.clone(),
                            approval_id: id.to_string(),
                            tool: request.tool_call.name.clone(),
                            decision: ApprovalDecision::Timeout,
                            always: false,
                            by: "timeout".into(),
                            reason: Some(reason.clone()),
                        }))
                        .await;
                        return self.denied(request, reason).await;
                    }
                    // An answer came first: read it on the next turn.
                    Ok(false) => {}
                    Err(e) => {
                        return self
                            .denied(request, format!("{reason} (and expiring it failed: {e})"))
                            .await;
                    }
                }
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
}

impl Approve for ParkApprover {
    fn approve(&self, request: ApprovalRequest) -> futures_util::future::BoxFuture<'_, Approval> {
        Box::pin(self.park(request))
    }

    fn records_denials(&self) -> bool {
        true
    }
}

/// The approver of a sandboxed run's hooks: the run's owner parks the ask
/// (and records its denial); when the channel fails, the call is denied
/// and the denial recorded on `bus` (what the hook sends its owner).
#[derive(Debug, Clone)]
pub struct ChannelApprover {
    pub client: crate::surfaces::channel::ChannelClient,
    /// Where its own denial goes (what the hook sends the owner).
    pub collected: super::Collected,
    pub run_id: String,
    pub profile: Option<String>,
}

impl Approve for ChannelApprover {
    fn approve(&self, request: ApprovalRequest) -> futures_util::future::BoxFuture<'_, Approval> {
        Box::pin(async move {
            match self.client.ask(request.clone()).await {
                Ok(crate::surfaces::approval::Answer::Allow) => Approval::Allow,
                Ok(crate::surfaces::approval::Answer::Deny { reason }) => Approval::Deny { reason },
                Err(e) => {
                    let reason = format!("no one to ask: {e}");
                    crate::stdx::lock(&self.collected).push(denial(
                        Some(&self.run_id),
                        self.profile.as_deref(),
                        &request,
                        &reason,
                    ));
                    Approval::Deny { reason }
                }
            }
        })
    }

    fn records_denials(&self) -> bool {
        true
    }
}

/// The approver where nobody can be asked (no daemon, not in a run): every
/// `ask` is denied and the denial recorded as a `tool.denied` by `approval`.
#[derive(Debug, Clone)]
pub struct NoOneToAsk {
    pub bus: Option<EventBus>,
    pub run_id: Option<String>,
    pub profile: Option<String>,
    /// Why nobody can be asked, and what to do.
    pub why: String,
}

impl Approve for NoOneToAsk {
    fn approve(&self, request: ApprovalRequest) -> futures_util::future::BoxFuture<'_, Approval> {
        Box::pin(async move {
            let reason = format!("no one to ask: {}", self.why);
            record_denial(
                self.bus.as_ref(),
                self.run_id.as_deref(),
                self.profile.as_deref(),
                &request,
                &reason,
            )
            .await;
            Approval::Deny { reason }
        })
    }

    fn records_denials(&self) -> bool {
        true
    }
}

/// Record a denial of an asked call: `tool.denied`, by `approval`.
pub async fn record_denial(
    bus: Option<&EventBus>,
    run_id: Option<&str>,
    profile: Option<&str>,
    request: &ApprovalRequest,
    reason: &str,
) {
    publish(bus, run_id, denial(run_id, profile, request, reason)).await;
}

/// The `tool.denied` (by `approval`) of an asked call.
fn denial(
    run_id: Option<&str>,
    profile: Option<&str>,
    request: &ApprovalRequest,
    reason: &str,
) -> Event {
    Event::ToolDenied(ToolDenied {
        run_id: run_id.map(str::to_string),
        profile: profile.map(str::to_string),
        tool: request.tool_call.name.clone(),
        rule: request.hook.clone(),
        by: DeniedBy::Approval,
        reason: Some(reason.to_string()),
    })
}

async fn publish(bus: Option<&EventBus>, run_id: Option<&str>, event: Event) {
    let Some(bus) = bus else { return };
    let mut event: crate::event::NewEvent = event.into();
    if let Some(id) = run_id {
        event = event.for_component(crate::store::queue::run_component(id));
    }
    if let Err(e) = bus.publish(event).await {
        tracing::warn!(error = %e, "approvals: recording an event failed");
    }
}

/// A new approval id: [`APPROVAL_ID_PREFIX`] and 16 random hex digits.
pub fn new_approval_id() -> String {
    let mut random = [0u8; 8];
    let read = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut random));
    if read.is_err() {
        // Unique enough: the row's primary key refuses a repeat.
        random = crate::store::now_ms().to_le_bytes();
    }
    format!("{APPROVAL_ID_PREFIX}{}", hex::encode(random))
}
