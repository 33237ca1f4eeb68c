//! The owner's end of a sandboxed run's channel (`surfaces::channel`):
//! inside its sandbox a run cannot write npc's state, so its `npc hook run`
//! (and its `npc mcp serve` with no daemon to front) sends what it records
//! and asks here. A run records only its own events of the kinds a hook
//! bridge or gateway makes (`hook.call`, and `tool.denied` and
//! `mcp.tool_call` naming the run); an `ask` parks the run as `hooks::park` does in the owner's
//! store. What the channel answers cannot name another run, answer an
//! approval or queue anything.

use std::sync::Arc;

use crate::bus::EventBus;
use crate::event::Event;
use crate::hooks::park::{ParkApprover, Reach};
use crate::hooks::{Approval, Approve as _};
use crate::model::{HookEvent, Manifest};
use crate::surfaces::approval::{Answer, ApprovalRequest};
use crate::surfaces::channel::ChannelHandler;

/// The owner's handler of one run's channel.
#[derive(Debug)]
pub struct RunChannel {
    bus: EventBus,
    run: String,
    manifest: Arc<Manifest>,
    park: ParkApprover,
}

impl RunChannel {
    /// The channel of run `run` of `profile`, recording on `bus` and
    /// parking its asks in `bus`'s store; `reach` says whether anybody can
    /// answer them.
    pub fn new(
        bus: &EventBus,
        run: &str,
        profile: &str,
        manifest: Arc<Manifest>,
        reach: Reach,
    ) -> Self {
        Self {
            bus: bus.clone(),
            run: run.to_string(),
            manifest: manifest.clone(),
            park: ParkApprover::new(
                bus.store().clone(),
                Some(bus.clone()),
                run.to_string(),
                Some(profile.to_string()),
                manifest,
                reach,
            ),
        }
    }

    /// The component `event` is recorded under, when the run may record it.
    fn component(&self, event: &Event) -> Result<String, String> {
        match event {
            Event::HookCall(call) if HookEvent::parse(&call.event).is_some() => Ok(
                crate::plan::ComponentId::new(crate::plan::Kind::Hooks, &call.event).to_string(),
            ),
            Event::ToolDenied(denied) if denied.run_id.as_deref() == Some(&self.run) => {
                Ok(crate::store::queue::run_component(&self.run))
            }
            // A call of its gateway: under its server when the manifest
            // has one of that name, as the gateway itself records it.
            Event::McpToolCall(call) if call.run_id.as_deref() == Some(&self.run) => Ok(match call
                .server
                .as_deref()
            {
                Some(server) if !call.builtin && self.manifest.mcp_servers.contains_key(server) => {
                    crate::plan::ComponentId::new(crate::plan::Kind::McpServer, server).to_string()
                }
                _ => crate::store::queue::run_component(&self.run),
            }),
            other => Err(format!(
                "a run records only its own `hook.call`, `tool.denied` and `mcp.tool_call` events, not this `{}`",
                other.kind()
            )),
        }
    }
}

impl ChannelHandler for RunChannel {
    fn record(
        &self,
        events: Vec<Event>,
    ) -> futures_util::future::BoxFuture<'_, Result<usize, String>> {
        Box::pin(async move {
            // All or nothing: one forged event refuses the batch.
            let components = events
                .iter()
                .map(|e| self.component(e))
                .collect::<Result<Vec<_>, _>>()?;
            let count = events.len();
            for (event, component) in events.into_iter().zip(components) {
                self.bus
                    .publish(event.for_component(component))
                    .await
                    .map_err(|e| format!("cannot record the event: {e}"))?;
            }
            Ok(count)
        })
    }

    fn ask(&self, request: ApprovalRequest) -> futures_util::future::BoxFuture<'_, Answer> {
        Box::pin(async move {
            match self.park.approve(request).await {
                Approval::Allow => Answer::Allow,
                Approval::Deny { reason } => Answer::Deny { reason },
            }
        })
    }
}
