//! A run carried out in the process that asks for it, when no daemon holds
//! the repository (`npc run`, a prompt of `npc acp`): still one row of the
//! run queue, recorded `running` at once and owned by this process (no
//! executor ever claims it; a daemon that starts meanwhile leaves it alone
//! while this process lives), then executed through [`super::agent`] and
//! ended like the executor's runs ([`super::ending_of`]). A process killed
//! mid-run leaves its row `running`; the next daemon or in-process run marks
//! it `interrupted`.

use std::future::Future;
use std::sync::Arc;

use super::{
    MANUAL_QUEUE, Origin, PreparedRun, RunError, RunReport, ending_of, interrupt_orphans,
    this_process,
};
use crate::bus::EventBus;
use crate::event::Event;
use crate::hooks::HookRunner;
use crate::providers::AgentEvent;
use crate::store::Store;
use crate::store::queue::NewRun;
use crate::supervisor::Supervisor;
use crate::surfaces::runs::{LocalRun, MAX_DAEMON_PROMPT_BYTES};

/// What a run in this process records to and spawns through.
#[derive(Debug, Clone)]
pub struct Here {
    pub store: Arc<Store>,
    pub bus: EventBus,
    pub supervisor: Supervisor,
}

impl Here {
    /// Record `prepared` as a running row of `origin` (with `request`, what
    /// was asked, as its payload), execute it through `hooks` — every
    /// parsed event to `sink`, stopped when `cancel` resolves with a signal
    /// number — and record its end.
    pub async fn run<F>(
        &self,
        origin: Origin,
        request: &LocalRun,
        prepared: &PreparedRun,
        hooks: &HookRunner,
        sink: F,
        cancel: impl Future<Output = i32>,
    ) -> Result<RunReport, RunError>
    where
        F: FnMut(&AgentEvent),
    {
        self.interrupt_orphans().await;
        self.store
            .enqueue_run(NewRun {
                claimed_by: Some(this_process().unwrap_or_default()),
                ..NewRun::new(
                    &prepared.id,
                    MANUAL_QUEUE,
                    origin,
                    recorded(request).to_string(),
                )
            })
            .await?;
        let result =
            super::execute(prepared, &self.supervisor, &self.bus, hooks, sink, cancel).await;
        let (end, detail) = ending_of(&result);
        if let Err(e) = self.store.mark_run(&prepared.id, end, detail).await {
            tracing::error!("cannot record the end of run `{}`: {e}", prepared.id);
        }
        result
    }

    /// Rows a killed process left `running` end as `interrupted`.
    async fn interrupt_orphans(&self) {
        match interrupt_orphans(&self.store).await {
            Ok(ids) => {
                for id in ids {
                    let event = Event::run_interrupted(&id, super::executor::INTERRUPTED_DETAIL)
                        .for_component(super::component(&id));
                    let _ = self.bus.publish(event).await;
                }
            }
            Err(e) => tracing::warn!("cannot mark interrupted runs: {e}"),
        }
    }
}

/// `request` as its row records it: a prompt text longer than a daemon's
/// run takes is cut to [`MAX_DAEMON_PROMPT_BYTES`] (the row is a record
/// here; nothing runs from it).
fn recorded(request: &LocalRun) -> serde_json::Value {
    let mut request = request.clone();
    if let Some(text) = &mut request.run.prompt
        && text.len() > MAX_DAEMON_PROMPT_BYTES
    {
        let cut = crate::model::source::floor_char_boundary(text, MAX_DAEMON_PROMPT_BYTES);
        text.truncate(cut);
    }
    serde_json::to_value(&request).unwrap_or_default()
}
