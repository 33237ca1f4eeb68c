//! The JSON-RPC agent: [`serve`] reads the client's frames (bounded,
//! classified by `frame`), answers its requests with at most
//! `MAX_INFLIGHT_REQUESTS` in flight, routes its answers to npc's own
//! requests, and writes every frame through one writer task; `initialize`
//! and the session's slash commands are answered here.

use super::*;

/// After the client is gone: how long the requests still in flight (beyond
/// a run's own `POST_EXIT_DRAIN`) and then the writer get to finish.
const CLOSING_GRACE: Duration = Duration::from_secs(5);
/// How often the closing session looks whether its requests finished.
const CLOSING_POLL: Duration = Duration::from_millis(20);

/// Serve ACP on `input`/`output` until the client closes `input` or `stop`
/// resolves; either way running prompts are cancelled first (in-process
/// agents' groups killed, the daemon's runs cancelled through it).
pub async fn serve<R, W>(
    config: Config,
    input: R,
    output: W,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), AcpError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    tokio::pin!(stop);
    let listener = approval::bind().map_err(AcpError::Approval)?;
    let (out, mut frames) = mpsc::unbounded_channel::<Value>();
    let writer = tokio::spawn(async move {
        let mut output = output;
        while let Some(frame) = frames.recv().await {
            let line = crate::stdx::lines::encode(&frame).unwrap_or_default();
            if output.write_all(&line).await.is_err() || output.flush().await.is_err() {
                break;
            }
        }
    });
    let agent = Arc::new(Agent {
        config,
        out,
        next_id: AtomicI64::new(1),
        pending: Mutex::new(HashMap::new()),
        sessions: Mutex::new(VecDeque::new()),
        approval_name: listener.name().to_string(),
    });
    let (asked_tx, mut asked) = mpsc::channel::<Asked>(APPROVAL_QUEUE);
    let approvals = tokio::spawn(listener.serve(asked_tx));
    let asker = {
        let agent = agent.clone();
        tokio::spawn(async move {
            while let Some((question, reply)) = asked.recv().await {
                let agent = agent.clone();
                tokio::spawn(async move {
                    let answer = agent
                        .ask_permission(&question.session, question.request)
                        .await;
                    let _ = reply.send(answer);
                });
            }
        })
    };
    let inflight = Arc::new(Semaphore::new(MAX_INFLIGHT_REQUESTS));
    let mut lines = LineReader::new(input, Splitter::new(frame::MAX_LINE_BYTES, Overlong::Skip));
    let result = loop {
        let next = tokio::select! {
            next = lines.next() => next,
            () = &mut stop => break Ok(()),
        };
        let line = match next {
            Ok(Some(line)) => line,
            Ok(None) => break Ok(()),
            Err(e) => break Err(AcpError::Io(e)),
        };
        let incoming = match line {
            Line::TooLong { bytes } => Incoming::Invalid {
                id: Value::Null,
                error: frame::error(
                    frame::INVALID_REQUEST,
                    &format!(
                        "the frame is {bytes} bytes, more than the {} npc reads; send smaller frames",
                        frame::MAX_LINE_BYTES
                    ),
                ),
            },
            Line::Line(bytes) | Line::Truncated(bytes) => frame::classify(&bytes),
        };
        match incoming {
            Incoming::Empty => {}
            Incoming::Invalid { id, error } => agent.send(frame::response(id, Err(error))),
            Incoming::Response { id, outcome } => {
                let waiting = id
                    .as_i64()
                    .and_then(|id| agent.pending.lock().ok()?.remove(&id));
                match waiting {
                    Some(tx) => {
                        let _ = tx.send(outcome);
                    }
                    None => tracing::warn!("acp: a response to no request of npc's (id {id})"),
                }
            }
            Incoming::Notification { method, params } => agent.notification(&method, params),
            Incoming::Request { id, method, params } => {
                let Ok(permit) = inflight.clone().try_acquire_owned() else {
                    agent.send(frame::response(
                        id,
                        Err(frame::error(
                            BUSY,
                            &format!(
                                "more than {MAX_INFLIGHT_REQUESTS} requests are in flight; wait for answers before sending more"
                            ),
                        )),
                    ));
                    continue;
                };
                let agent = agent.clone();
                tokio::spawn(async move {
                    let mut announce = None;
                    let outcome = agent.request(&method, params, &mut announce).await;
                    agent.send(frame::response(id, outcome));
                    // A session's commands follow the response that named it.
                    if let Some(session) = announce {
                        agent.announce_commands(&session);
                    }
                    drop(permit);
                });
            }
        }
    };
    // The client is gone: stop every running prompt (their agents' groups
    // are killed), then let the writer drain.
    let sessions: Vec<Arc<Session>> = agent
        .sessions
        .lock()
        .map(|s| s.iter().cloned().collect())
        .unwrap_or_default();
    for s in sessions {
        cancel(&s);
    }
    approvals.abort();
    asker.abort();
    let deadline = runs::POST_EXIT_DRAIN + CLOSING_GRACE;
    let _ = tokio::time::timeout(deadline, async {
        while inflight.available_permits() < MAX_INFLIGHT_REQUESTS {
            tokio::time::sleep(CLOSING_POLL).await;
        }
    })
    .await;
    drop(agent);
    let _ = tokio::time::timeout(CLOSING_GRACE, writer).await;
    result
}

pub(super) fn cancel(session: &Session) {
    if let Ok(mut active) = session.active.lock()
        && let Some(active) = active.as_mut()
        && let Some(cancel) = active.cancel.take()
    {
        let _ = cancel.send(());
    }
}

impl Agent {
    pub(super) fn send(&self, frame: Value) {
        let _ = self.out.send(frame);
    }

    pub(super) fn update(&self, session: &str, update: SessionUpdate) {
        let note = SessionNotification::new(session.to_string(), update);
        if let Ok(params) = serde_json::to_value(note) {
            self.send(frame::message(None, "session/update", params));
        }
    }

    pub(super) fn notification(self: &Arc<Self>, method: &str, params: Value) {
        if method == "session/cancel" {
            match serde_json::from_value::<CancelNotification>(params) {
                Ok(c) => {
                    if let Some(s) = self.session(&c.session_id.0) {
                        cancel(&s);
                    }
                }
                Err(e) => tracing::warn!("acp: a `session/cancel` with invalid params: {e}"),
            }
        }
        // Other notifications (`$/…` extensions) are ignored, as JSON-RPC asks.
    }

    /// Answer one request; `announce` names a session whose available
    /// commands go out after the response.
    pub(super) async fn request(
        self: &Arc<Self>,
        method: &str,
        p: Value,
        announce: &mut Option<String>,
    ) -> Result<Value, Value> {
        let (result, session) = match method {
            "session/new" => self.new_session(params(p)?).await?,
            "session/load" => self.load(params(p)?).await?,
            "session/resume" => self.resume(params(p)?).await?,
            "session/fork" => self.fork(params(p)?).await?,
            _ => return self.plain_request(method, p).await,
        };
        *announce = Some(session);
        Ok(result)
    }

    pub(super) async fn plain_request(
        self: &Arc<Self>,
        method: &str,
        p: Value,
    ) -> Result<Value, Value> {
        match method {
            "initialize" => self.initialize(),
            "authenticate" => Ok(json!({})),
            "session/prompt" => self.prompt(params(p)?).await,
            "session/list" => self.list(params(p)?).await,
            "session/cancel" => {
                self.notification(method, p);
                Ok(Value::Null)
            }
            other => Err(frame::method_not_found(other)),
        }
    }

    pub(super) fn initialize(&self) -> Result<Value, Value> {
        let m = &self.config.manifest;
        let profiles: Vec<Value> = m
            .profiles
            .iter()
            .map(|(name, p)| {
                json!({
                    "name": name,
                    "provider": p.provider,
                    "description": p.description,
                    "mcpServers": p.mcp_servers,
                })
            })
            .collect();
        let caps = AgentCapabilities::new()
            .load_session(true)
            .prompt_capabilities(PromptCapabilities::new().embedded_context(true))
            .mcp_capabilities(McpCapabilities::new())
            .session_capabilities(
                SessionCapabilities::new()
                    .list(SessionListCapabilities::new())
                    .resume(SessionResumeCapabilities::new())
                    .fork(SessionForkCapabilities::new()),
            )
            .meta(meta(json!({
                "profile": self.config.profile,
                "profiles": profiles,
                "mcpServers": self.profile_servers(&self.config.profile),
                "commands": self.commands().iter().map(|c| c.name.clone()).collect::<Vec<_>>(),
            })));
        to_value(
            InitializeResponse::new(ProtocolVersion::V1)
                .agent_capabilities(caps)
                .agent_info(Implementation::new("npc", env!("CARGO_PKG_VERSION")).title("npc")),
        )
    }

    /// The MCP servers `profile` gives its agent.
    pub(super) fn profile_servers(&self, profile: &str) -> Vec<String> {
        self.config
            .manifest
            .profiles
            .get(profile)
            .map(|p| p.mcp_servers.clone())
            .unwrap_or_default()
    }

    /// The manifest's prompts as slash commands.
    pub(super) fn commands(&self) -> Vec<Slash> {
        self.config
            .manifest
            .prompts
            .iter()
            .map(|(name, p)| {
                let first = p
                    .template
                    .lines()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("");
                let description: String = first.trim().chars().take(MAX_TITLE_CHARS).collect();
                let mut c = Slash::new(name.clone(), description);
                if !p.variables.is_empty() {
                    let hint = p
                        .variables
                        .keys()
                        .map(|k| format!("{k}=…"))
                        .collect::<Vec<_>>()
                        .join(" ");
                    c = c.input(AvailableCommandInput::Unstructured(
                        UnstructuredCommandInput::new(hint),
                    ));
                }
                c
            })
            .collect()
    }

    pub(super) fn announce_commands(&self, session: &str) {
        self.update(
            session,
            SessionUpdate::AvailableCommandsUpdate(AvailableCommandsUpdate::new(self.commands())),
        );
    }
}
