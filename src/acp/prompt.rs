//! A prompt is one run: of the daemon when one holds the repository (a
//! `LocalRun` queued over the control socket, followed in the store), else
//! of this process (`runs::here`); its agent events become
//! `session/update`s and its outcome the stop reason. A later prompt of a
//! session resumes the provider's conversation (`providers::resume`).

use super::*;

impl Agent {
    pub(super) async fn prompt(self: &Arc<Self>, req: PromptRequest) -> Result<Value, Value> {
        let session = self.stored(&req.session_id.0).await?;
        let text = prompt_text(&req.prompt)?;
        let choice = self.choice(&text);
        let (cancel_tx, mut cancel_rx) = oneshot::channel::<()>();
        let (ended_tx, ended_rx) = tokio::sync::watch::channel(false);
        {
            let mut active = session.active.lock().map_err(internal)?;
            if active.is_some() {
                return Err(frame::error(
                    BUSY,
                    "this session is already running a prompt; wait for it or send `session/cancel`",
                ));
            }
            *active = Some(Active {
                cancel: Some(cancel_tx),
                ended: ended_rx,
            });
        }
        let result = self
            .run_prompt(&session, text, choice, &mut cancel_rx)
            .await;
        let _ = ended_tx.send(true);
        if let Ok(mut active) = session.active.lock() {
            *active = None;
        }
        result
    }

    /// A slash command `/NAME k=v …` naming a manifest prompt renders it;
    /// anything else is the task as written.
    pub(super) fn choice(&self, text: &str) -> PromptChoice {
        let literal = || PromptChoice::Literal {
            text: text.to_string(),
        };
        let Some(command) = text.trim_start().strip_prefix('/') else {
            return literal();
        };
        let mut words = command.split_whitespace();
        let Some(name) = words.next() else {
            return literal();
        };
        if !self.config.manifest.prompts.contains_key(name) {
            return literal();
        }
        let vars = words
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        PromptChoice::Template {
            name: name.to_string(),
            vars,
        }
    }

    /// Run one prompt: in the daemon when one holds the repository (and
    /// the prompt fits its control channel), else in this process.
    pub(super) async fn run_prompt(
        self: &Arc<Self>,
        session: &Session,
        text: String,
        choice: PromptChoice,
        cancel_rx: &mut oneshot::Receiver<()>,
    ) -> Result<Value, Value> {
        let record = &session.record;
        let resume = self.resume_of(record).await?;
        if text.len() <= MAX_DAEMON_PROMPT_BYTES
            && let Some((socket, _pid)) = self
                .config
                .daemon
                .as_ref()
                .and_then(|paths| paths.running_daemon())
        {
            let ran = self
                .run_in_daemon(&socket, record, &text, &choice, resume.clone(), cancel_rx)
                .await;
            if let Some(result) = ran {
                return result;
            }
        }
        self.run_here(record, text, choice, resume, cancel_rx).await
    }

    /// Where the hooks of `record`'s runs ask: this process's approval
    /// socket, for that session.
    pub(super) fn route(&self, record: &AcpSession) -> ApprovalRoute {
        ApprovalRoute {
            socket: self.approval_name.clone(),
            session: record.id.clone(),
        }
    }

    /// The provider conversation a new prompt of `record` continues: the
    /// one its last run recorded (forked when the session has no run of its
    /// own yet). A run of another machine of the fleet left its
    /// conversation there: the prompt starts a new one, and says so.
    pub(super) async fn resume_of(&self, record: &AcpSession) -> Result<Option<Resume>, Value> {
        let sessions = &self.config.sessions;
        let earlier = sessions.runs(&record.id).await.map_err(internal)?;
        let Some(last) = earlier.last() else {
            return Ok(None);
        };
        if let Some(host) = last.host.as_deref()
            && host != self.config.host
        {
            self.update(
                &record.id,
                SessionUpdate::AgentMessageChunk(ContentChunk::new(ContentBlock::from(format!(
                    "\n[npc] the agent's conversation of the earlier prompts is on host {}; this prompt starts a new one\n",
                    crate::stdx::term::printable(host)
                )))),
            );
            return Ok(None);
        }
        let own_runs = match &record.forked_from {
            Some(parent) => earlier.len() > sessions.runs(parent).await.map_err(internal)?.len(),
            None => true,
        };
        Ok(provider_session(sessions.as_ref(), &last.run_id)
            .await
            .map(|session| Resume {
                session,
                fork: !own_runs,
            }))
    }

    pub(super) async fn record_run(
        &self,
        record: &AcpSession,
        run_id: &str,
        text: &str,
    ) -> Result<(), Value> {
        let title: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
        let title: String = title.chars().take(MAX_TITLE_CHARS).collect();
        let run = NewAcpRun {
            session_id: record.id.clone(),
            run_id: run_id.to_string(),
            prompt: text.to_string(),
            title,
            host: self.config.host.clone(),
        };
        self.config.sessions.add_run(run).await.map_err(internal)
    }

    /// Once run `run_id` ended: where the sessions are shared, copy its
    /// agent events from this machine's store to theirs, for a
    /// `session/load` on any machine. A failure costs the replay only.
    pub(super) async fn keep_events(&self, run_id: &str) {
        if !self.config.sessions.shared() {
            return;
        }
        let kept = match self.config.store.run_agent_events(run_id) {
            Ok(events) => self.config.sessions.keep_agent_events(run_id, events).await,
            Err(e) => Err(e),
        };
        if let Err(e) = kept {
            tracing::warn!("acp: run `{run_id}`'s events are not in the fleet's store: {e}");
        }
    }

    /// Say in the session why run `run_id` did not succeed.
    pub(super) fn say_why(&self, session: &str, run_id: &str, outcome: &str, why: &str) {
        self.update(
            session,
            SessionUpdate::AgentMessageChunk(ContentChunk::new(ContentBlock::from(format!(
                "\n[npc] run {run_id} {outcome}: {why}\n"
            )))),
        );
    }

    /// Queue the prompt as a run of the daemon at `socket` and stream it
    /// from the store until it ended. `None` when the daemon is gone before
    /// it took the run (the caller runs it here instead).
    pub(super) async fn run_in_daemon(
        self: &Arc<Self>,
        socket: &std::path::Path,
        record: &AcpSession,
        text: &str,
        choice: &PromptChoice,
        resume: Option<Resume>,
        cancel_rx: &mut oneshot::Receiver<()>,
    ) -> Option<Result<Value, Value>> {
        let run = choice.manual_run(&record.profile);
        let cwd = self.local_cwd(&record.cwd);
        let request = Request::AcpRun {
            run: LocalRun {
                run,
                cwd: (cwd.is_absolute() && cwd.is_dir()).then_some(cwd),
                timeout_secs: Some(self.config.timeout.as_secs().max(1)),
                probe_after_secs: None,
                resume,
                approval: Some(self.route(record)),
            },
        };
        let run_id = match Client::call(socket, &request).await {
            Ok(Reply::RunQueued { run_id }) => run_id,
            Ok(other) => return Some(Err(internal(ControlError::unexpected(&other)))),
            Err(ControlError::Connect { .. }) => return None,
            Err(ControlError::Refused(e)) => {
                return Some(Err(frame::error(INVALID_PARAMS, &e)));
            }
            Err(e) => return Some(Err(internal(e))),
        };
        if let Err(e) = self.record_run(record, &run_id, text).await {
            return Some(Err(e));
        }
        Some(self.follow(socket, record, &run_id, cancel_rx).await)
    }

    /// Stream run `run_id` of the daemon at `socket` from the store (its
    /// events carry its id) until it ended; a cancel asks the daemon to
    /// cancel it.
    pub(super) async fn follow(
        self: &Arc<Self>,
        socket: &std::path::Path,
        record: &AcpSession,
        run_id: &str,
        cancel_rx: &mut oneshot::Receiver<()>,
    ) -> Result<Value, Value> {
        let mut follower = Follower::new(self.config.store.clone(), run_id);
        let mut mapper = map::Mapper::default();
        let mut max_turns = false;
        let mut cancel_sent = false;
        let daemon_up = || {
            self.config
                .daemon
                .as_ref()
                .is_some_and(|paths| paths.running_daemon().is_some())
        };
        let ended = loop {
            let step = tokio::select! {
                step = follower.next(&daemon_up) => step.map_err(internal)?,
                _ = &mut *cancel_rx, if !cancel_sent => {
                    cancel_sent = true;
                    cancel_in_daemon(socket, run_id);
                    continue;
                }
            };
            match step {
                Step::Events(page) => {
                    for e in page.iter().filter(|e| e.kind.starts_with("agent.")) {
                        max_turns |= map::hit_turn_limit(&e.payload);
                        for u in mapper.updates(&e.payload) {
                            self.update(&record.id, u);
                        }
                    }
                }
                Step::Ended(ended) => break ended,
            }
        };
        self.keep_events(run_id).await;
        let outcome = ended.outcome;
        let stop = match outcome.as_str() {
            "cancelled" => StopReason::Cancelled,
            _ if max_turns => StopReason::MaxTurnRequests,
            _ => StopReason::EndTurn,
        };
        if !matches!(outcome.as_str(), "succeeded" | "cancelled") {
            let why = ended
                .why
                .unwrap_or_else(|| format!("see `npc events` for run {run_id}"));
            self.say_why(&record.id, run_id, &outcome, &why);
        }
        to_value(PromptResponse::new(stop).meta(meta(json!({
            "runId": run_id,
            "outcome": outcome,
            "ranIn": RAN_IN_DAEMON,
        }))))
    }

    /// Run the prompt in this process (no daemon holds the repository).
    pub(super) async fn run_here(
        self: &Arc<Self>,
        record: &AcpSession,
        text: String,
        choice: PromptChoice,
        resume: Option<Resume>,
        cancel_rx: &mut oneshot::Receiver<()>,
    ) -> Result<Value, Value> {
        let cwd = self.local_cwd(&record.cwd);
        let asked = LocalRun {
            run: choice.manual_run(&record.profile),
            cwd: (cwd.is_absolute() && cwd.is_dir()).then(|| cwd.clone()),
            timeout_secs: Some(self.config.timeout.as_secs().max(1)),
            probe_after_secs: None,
            resume: resume.clone(),
            approval: Some(self.route(record)),
        };
        let request = RunRequest {
            profile: record.profile.clone(),
            prompt: choice,
            timeout: self.config.timeout,
            cwd: cwd.is_dir().then_some(cwd),
            probe_after: crate::providers::STALE_AFTER,
            trigger: None,
            provider: None,
        };
        let run_id = runs::new_run_id();
        let preparing = runs::prepare_blocking(
            self.config.manifest.clone(),
            self.config.root.clone(),
            request,
            run_id.clone(),
        );
        let mut prepared = tokio::select! {
            prepared = preparing => prepared.map_err(|e| frame::error(INVALID_PARAMS, &e.to_string()))?,
            _ = &mut *cancel_rx => return to_value(PromptResponse::new(StopReason::Cancelled)),
        };
        for w in &prepared.warnings {
            tracing::warn!("acp: {w}");
        }
        prepared.apply_local(resume.as_ref(), Some(&self.route(record)));
        // Listed like the daemon's runs of a prompt: source `acp`.
        prepared.source = Some(Origin::Acp.as_str());
        self.record_run(record, &run_id, &text).await?;
        let mut mapper = map::Mapper::default();
        let mut max_turns = false;
        let sink = |e: &crate::providers::AgentEvent| {
            let payload = runs::event_payload(&run_id, e);
            max_turns |= map::hit_turn_limit(&payload);
            for u in mapper.updates(&payload) {
                self.update(&record.id, u);
            }
        };
        let cancelled = async {
            let _ = (&mut *cancel_rx).await;
            CANCEL_SIGNAL
        };
        let here = Here {
            store: self.config.store.clone(),
            bus: self.config.bus.clone(),
            supervisor: self.config.supervisor.clone(),
        };
        let report = here
            .run(
                Origin::Acp,
                &asked,
                &prepared,
                &self.config.hooks,
                sink,
                cancelled,
            )
            .await
            .map_err(|e| frame::error(INTERNAL_ERROR, &e.to_string()))?;
        self.keep_events(&prepared.id).await;
        match &report.outcome {
            Outcome::Succeeded | Outcome::Cancelled { .. } => {}
            other => {
                let why = match other {
                    Outcome::TimedOut => format!(
                        "the run outlived its timeout of {}s",
                        prepared.timeout.as_secs()
                    ),
                    Outcome::HookFailed => report.hook_error.clone().unwrap_or_default(),
                    Outcome::Blocked { denials } => format!(
                        "a denial stopped what the agent tried: {}",
                        crate::runs::agent::denials_in_words(denials)
                    ),
                    Outcome::NoChanges => "the run changed no file".to_string(),
                    _ => format!("the agent failed ({})", report.exit),
                };
                self.say_why(&record.id, &prepared.id, other.as_str(), &why);
            }
        }
        to_value(
            PromptResponse::new(map::stop_reason(&report.outcome, max_turns)).meta(meta(json!({
                "runId": prepared.id,
                "outcome": report.outcome.as_str(),
                "ranIn": RAN_IN_ACP,
            }))),
        )
    }
}

/// Ask the daemon at `socket` to cancel run `id` (it kills the agent's
/// process group; the run's `run.finished` then ends the prompt).
pub(super) fn cancel_in_daemon(socket: &std::path::Path, id: &str) {
    let (socket, id) = (socket.to_path_buf(), id.to_string());
    tokio::spawn(async move {
        let request = Request::CancelRun { id: id.clone() };
        if let Err(e) = Client::call(&socket, &request).await {
            tracing::warn!("acp: cannot cancel run `{id}` in the daemon: {e}");
        }
    });
}

/// The text of a prompt's content blocks: text as written, embedded text
/// resources and resource links as their URI and text.
pub(super) fn prompt_text(blocks: &[ContentBlock]) -> Result<String, Value> {
    let mut text = String::new();
    for block in blocks {
        match block {
            ContentBlock::Text(t) => text.push_str(&t.text),
            ContentBlock::ResourceLink(link) => {
                text.push_str(&format!("\n[{}]({})\n", link.name, link.uri));
            }
            ContentBlock::Resource(r) => {
                if let EmbeddedResourceResource::TextResourceContents(t) = &r.resource {
                    text.push_str(&format!(
                        "\n<file uri=\"{}\">\n{}\n</file>\n",
                        t.uri, t.text
                    ));
                }
            }
            _ => {}
        }
        if text.len() > MAX_PROMPT_BYTES {
            return Err(invalid_params(format!(
                "the prompt is longer than {MAX_PROMPT_BYTES} bytes"
            )));
        }
    }
    if text.trim().is_empty() {
        return Err(invalid_params("the prompt has no text"));
    }
    Ok(text)
}

/// The provider's own session id recorded by run `run_id` (its `agent.started`).
pub(super) async fn provider_session(sessions: &dyn AcpSessions, run_id: &str) -> Option<String> {
    sessions
        .agent_events(run_id)
        .await
        .ok()?
        .into_iter()
        .find(|e| e.kind == "agent.started")
        .and_then(|e| e.payload["session_id"].as_str().map(str::to_string))
        .filter(|s| crate::surfaces::runs::valid_provider_session(s))
}
