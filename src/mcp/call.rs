//! The one call path of every `tools/call` the gateway serves:
//! resolve the namespaced name, run the [`CallStage`]s' `before` (each may
//! continue, rewrite the arguments, or deny), dispatch to the pool, run the
//! stages' `after` (each may replace the result), then record the call as an
//! `mcp.tool_call` event (tool, server, duration, outcome, arguments with
//! sensitive ones redacted; queued in order, not awaited, so the answer
//! never waits for a commit). [`CallPath::call_unrecorded`] hands the record
//! back instead, so the gateway's session writes the answer first and
//! [`CallPath::publish`]es it after. Nothing here fails the connection: every
//! problem becomes an `isError: true` result with a message saying what
//! happened and what to do. The hooks runner plugs in as a stage.

use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use rmcp::ErrorData;
use rmcp::model::{CallToolResult, ContentBlock, JsonObject, Tool};
use serde_json::{Value, json};

use super::builtin::{BUILTIN_SERVER, Builtins};
use super::client::pool::{CallError, Pool};
use super::toolsearch::{CALL_TOOL, SEARCH_TOOLS};
use crate::bus::EventBus;
use crate::event::{Event, McpClientConnected, McpPromptGet, McpResourceRead, McpToolCall};
use crate::model::ToolListing;
use crate::plan::{ComponentId, Kind};
use crate::store::NewEvent;

/// What the gateway served besides a tool call, recorded by
/// [`CallPath::record_request`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// A `resources/read` (`mcp.resource_read`; the target is the URI).
    ResourceRead,
    /// A `prompts/get` (`mcp.prompt_get`; the target is the prompt's
    /// name, its arguments are not recorded).
    PromptGet,
}

/// Largest serialized arguments recorded in an event; larger ones are
/// replaced by their size.
pub const MAX_RECORDED_ARGUMENT_BYTES: usize = 4096;
/// Arguments whose values are never recorded, by `(tool, argument)`; `*`
/// matches any tool (seed 000: `fetch_url`'s `url`).
pub const SENSITIVE_ARGUMENTS: [(&str, &str); 1] = [("fetch_url", "url")];
/// Argument names (lowercase substrings) treated as secrets for every tool.
pub const SECRET_ARGUMENT_MARKERS: [&str; 5] =
    ["token", "secret", "password", "api_key", "authorization"];
/// Longest message of an upstream's JSON-RPC error passed to the client.
pub const MAX_PASSED_ERROR_MESSAGE_BYTES: usize = 4096;
/// Largest `data` of an upstream's JSON-RPC error passed to the client, as
/// JSON; larger data is left out (the code and message still pass).
pub const MAX_PASSED_ERROR_DATA_BYTES: usize = 64 * 1024;
/// What a redacted argument is recorded as.
pub const REDACTED: &str = "<redacted>";

use futures_util::future::BoxFuture;

/// One tool call as it travels the path.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// Unique within this process (`call-PID-N`): ties a call's `before`
    /// and `after` together (hooks see it as `tool_call.id`).
    pub id: String,
    /// The tool's gateway-wide name whatever `mcp.prefix` says:
    /// `SERVER__TOOL`, or a built-in's own name (what hooks' matchers and
    /// profile patterns meet).
    pub name: String,
    /// The name the client called (`call_tool`'s `name` in search mode).
    pub called: String,
    pub server: String,
    /// The upstream's own name of the tool.
    pub tool: String,
    pub arguments: Option<JsonObject>,
    /// A stage denied the call: it never reached the server, and the
    /// `after` of every stage sees the denial's error result.
    pub denied: bool,
}

/// What a stage decides before the dispatch (it may also rewrite the
/// call's arguments in place).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Before {
    Continue,
    /// The call does not reach the server; the client gets `reason` as an
    /// `isError` result.
    Deny {
        reason: String,
    },
}

/// A step around the dispatch (the hooks runner is one).
pub trait CallStage: Send + Sync + std::fmt::Debug {
    /// Runs before the dispatch, in stage order.
    fn before<'a>(&'a self, _call: &'a mut ToolCall) -> BoxFuture<'a, Before> {
        Box::pin(async { Before::Continue })
    }

    /// Whether the caller may call `call`'s tool at all (with some
    /// arguments): a tool search lists only tools every stage permits.
    fn permits(&self, _call: &ToolCall) -> bool {
        true
    }

    /// Runs after the dispatch (also after a denial or failure), in stage order.
    fn after<'a>(
        &'a self,
        _call: &'a ToolCall,
        _result: &'a mut CallToolResult,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

/// How a call ended, as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The server answered with a result that is not an error.
    Ok,
    /// The server answered with an `isError` result.
    ToolError,
    /// The server answered with a JSON-RPC error, passed to the client as
    /// that error (its code recorded).
    ProtocolError,
    UnknownTool,
    Denied,
    /// The server could not be connected.
    Unavailable,
    Timeout,
    /// The server's session broke during the call.
    Lost,
    /// The client cancelled the call (`notifications/cancelled`); it was
    /// stopped and its upstream told.
    Cancelled,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::ToolError => "tool_error",
            Self::ProtocolError => "protocol_error",
            Self::UnknownTool => "unknown_tool",
            Self::Denied => "denied",
            Self::Unavailable => "unavailable",
            Self::Timeout => "timeout",
            Self::Lost => "lost",
            Self::Cancelled => "cancelled",
        }
    }
}

/// A served call as it will be recorded (see [`CallPath::publish`]).
#[derive(Debug, Clone, PartialEq)]
#[must_use = "a call's record is lost unless it is published"]
pub struct CallRecord {
    /// The namespaced name the client called.
    pub name: String,
    /// `None` when the name resolved to no tool.
    pub server: Option<String>,
    pub tool: Option<String>,
    /// The arguments as dispatched (after every stage's rewrite).
    pub arguments: Option<JsonObject>,
    pub outcome: Outcome,
    /// From the request to the result, stages included.
    pub duration: std::time::Duration,
    pub error: Option<String>,
    /// The JSON-RPC error code of a [`Outcome::ProtocolError`].
    pub error_code: Option<i32>,
    /// The run whose agent made the call ([`for_run`]), if one is known.
    pub run: Option<String>,
}

tokio::task_local! {
    /// The run whose agent the current gateway session serves.
    static SESSION_RUN: String;
}

/// Run `work` (a gateway session) with its tool calls recorded as run
/// `run`'s: the `npc mcp serve` in front of the daemon names it when an npc
/// run started the agent (`NPC_RUN_ID`), a worktree run's included.
pub async fn for_run<F: std::future::Future>(run: Option<String>, work: F) -> F::Output {
    match run {
        Some(run) => SESSION_RUN.scope(run, work).await,
        None => work.await,
    }
}

/// The run the current gateway session serves ([`for_run`]), if any.
pub fn current_run() -> Option<String> {
    SESSION_RUN.try_with(Clone::clone).ok()
}

/// The gateway's call path: the pool, the stages around it, the event log.
#[derive(Debug)]
pub struct CallPath {
    pool: Arc<Pool>,
    /// npc's own tools, served before the pool's (see [`super::builtin`]);
    /// replaced when the daemon applies new `[mcp.builtins]` settings.
    builtins: ArcSwap<Builtins>,
    stages: Vec<Arc<dyn CallStage>>,
    bus: Option<EventBus>,
    /// `mcp.tools`: every tool, or only the tool search's two.
    listing: std::sync::RwLock<ToolListing>,
    /// The names `on_conflict` prefixed, as last logged.
    reported_clashes: std::sync::Mutex<Vec<String>>,
    /// `on_conflict`'s gateway names → (server, tool), until the next
    /// change of a tool list (the receiver hears of it) or of the built-ins
    /// or listing (they clear it).
    names: std::sync::Mutex<Option<NameCache>>,
}

/// See [`CallPath::names`].
#[derive(Debug)]
struct NameCache {
    changes: tokio::sync::broadcast::Receiver<()>,
    routes: Arc<std::collections::HashMap<String, (String, String)>>,
}

/// A fresh [`ToolCall::id`].
fn next_call_id() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    static PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // One `getpid` per process, not one per call.
    format!("call-{}-{n}", PID.get_or_init(std::process::id))
}

/// A tool's gateway-wide name: `SERVER__TOOL` for an upstream's (however
/// `mcp.prefix` lists it), a built-in's own name (`called`) otherwise.
fn canonical(server: &str, tool: &str, called: &str) -> String {
    if server == BUILTIN_SERVER {
        return called.to_string();
    }
    super::namespaced(server, tool).unwrap_or_else(|| called.to_string())
}

pub(crate) fn error_result(message: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message)])
}

impl CallPath {
    /// A path dispatching to `pool`, recording on `bus` (when given).
    pub fn new(pool: Arc<Pool>, bus: Option<EventBus>) -> Self {
        Self {
            pool,
            builtins: ArcSwap::default(),
            stages: Vec::new(),
            bus,
            listing: Default::default(),
            reported_clashes: Default::default(),
            names: Default::default(),
        }
    }

    /// List `listing`'s tools ([`ToolListing::Search`]: only
    /// [`SEARCH_TOOLS`] and [`CALL_TOOL`]).
    pub fn with_listing(self, listing: ToolListing) -> Self {
        self.set_listing(listing);
        self
    }

    /// List `listing`'s tools from now on; clients are told when it changed.
    pub fn set_listing(&self, listing: ToolListing) {
        let old = std::mem::replace(&mut *crate::stdx::write(&self.listing), listing);
        if old != listing {
            *super::lock(&self.names) = None;
            self.pool.tools_changed();
        }
    }

    /// What `tools/list` offers now.
    pub fn listing(&self) -> ToolListing {
        *crate::stdx::read(&self.listing)
    }

    /// Whether `name` is taken before any upstream tool: a built-in's, or
    /// in search mode one of the search's two.
    fn reserved(&self, builtins: &Builtins, name: &str) -> bool {
        builtins.contains(name)
            || (self.listing() == ToolListing::Search && [SEARCH_TOOLS, CALL_TOOL].contains(&name))
    }

    /// Every tool callable through this path under its gateway name:
    /// built-ins first, then every upstream tool ([`Pool::tools_beside`]).
    pub fn every_tool(&self) -> Vec<Tool> {
        let builtins = self.builtins();
        let mut tools = builtins.tools().to_vec();
        let upstream = self.pool.tools_beside(|n| self.reserved(&builtins, n));
        if self.pool.prefix() == crate::model::Prefix::OnConflict {
            self.report_clashes(&upstream);
        }
        tools.extend(upstream.into_iter().map(|t| t.definition));
        tools
    }

    /// Log the tools `on_conflict` prefixed, whenever that set changes.
    fn report_clashes(&self, tools: &[super::client::pool::ListedTool]) {
        let prefixed: Vec<String> = tools
            .iter()
            .filter(|t| t.definition.name != t.tool)
            .map(|t| t.definition.name.to_string())
            .collect();
        let mut reported = super::lock(&self.reported_clashes);
        if *reported != prefixed {
            if !prefixed.is_empty() {
                tracing::warn!(
                    prefixed = %prefixed.join(", "),
                    "mcp: tool names clash between servers or with a built-in; the clashing ones are listed as SERVER__TOOL"
                );
            }
            *reported = prefixed;
        }
    }

    /// What `tools/list` offers: [`CallPath::every_tool`], or in search
    /// mode the search's two tools.
    pub fn listed_tools(&self) -> Vec<Tool> {
        match self.listing() {
            ToolListing::All => self.every_tool(),
            ToolListing::Search => super::toolsearch::tools(),
        }
    }

    /// The (server, tool) gateway name `name` stands for.
    fn resolve(&self, builtins: &Builtins, name: &str) -> Option<(String, String)> {
        if builtins.contains(name)
            || (self.listing() == ToolListing::Search && name == SEARCH_TOOLS)
        {
            return Some((BUILTIN_SERVER.to_string(), name.to_string()));
        }
        if self.pool.prefix() == crate::model::Prefix::OnConflict {
            return self.routes(builtins).get(name).cloned();
        }
        self.pool
            .resolve_beside(name, |n| self.reserved(builtins, n))
    }

    /// `on_conflict`'s names → (server, tool), from the cache while no
    /// tool list changed.
    fn routes(
        &self,
        builtins: &Builtins,
    ) -> Arc<std::collections::HashMap<String, (String, String)>> {
        use tokio::sync::broadcast::error::TryRecvError;
        let mut cache = super::lock(&self.names);
        if let Some(c) = cache.as_mut() {
            let mut fresh = true;
            loop {
                match c.changes.try_recv() {
                    Err(TryRecvError::Empty | TryRecvError::Closed) => break,
                    Ok(()) | Err(TryRecvError::Lagged(_)) => fresh = false,
                }
            }
            if fresh {
                return c.routes.clone();
            }
        }
        // Subscribed before reading, so a change during the read is heard.
        let changes = self.pool.subscribe_changes();
        let routes: Arc<std::collections::HashMap<_, _>> = Arc::new(
            self.pool
                .names_beside(|n| self.reserved(builtins, n))
                .into_iter()
                .map(|e| (e.name, (e.server, e.own)))
                .collect(),
        );
        *cache = Some(NameCache {
            changes,
            routes: routes.clone(),
        });
        routes
    }

    /// `search_tools`: the tools every stage permits, ranked for the query.
    fn search(&self, arguments: Option<JsonObject>) -> Result<CallToolResult, String> {
        let args: super::toolsearch::SearchArgs =
            serde_json::from_value(Value::Object(arguments.unwrap_or_default())).map_err(|e| {
                format!("invalid arguments for `{SEARCH_TOOLS}`: {e}; it takes `query` and an optional `limit`")
            })?;
        if args.query.len() > super::toolsearch::MAX_QUERY_BYTES {
            return Err(format!(
                "`query` is {} bytes; the most allowed is {}",
                args.query.len(),
                super::toolsearch::MAX_QUERY_BYTES
            ));
        }
        let limit = args
            .limit
            .unwrap_or(super::toolsearch::DEFAULT_SEARCH_LIMIT)
            .min(super::toolsearch::MAX_SEARCH_LIMIT);
        let builtins = self.builtins();
        let tools: Vec<Tool> = self
            .every_tool()
            .into_iter()
            .filter(|t| {
                let Some((server, tool)) = self.resolve(&builtins, &t.name) else {
                    return false;
                };
                let call = ToolCall {
                    id: String::new(),
                    name: canonical(&server, &tool, &t.name),
                    called: t.name.to_string(),
                    server,
                    tool,
                    arguments: None,
                    denied: false,
                };
                self.stages.iter().all(|s| s.permits(&call))
            })
            .collect();
        let found = super::toolsearch::rank(&tools, &args.query, limit);
        let answer = super::toolsearch::answer(&tools, &found, tools.len());
        Ok(CallToolResult::success(vec![ContentBlock::text(
            answer.to_string(),
        )]))
    }

    /// Serve `builtins` too (listed first; dispatched with
    /// [`BUILTIN_SERVER`] as the call's server).
    pub fn with_builtins(self, builtins: Arc<Builtins>) -> Self {
        self.set_builtins(builtins);
        self
    }

    /// Serve `builtins` from now on (calls in flight finish with the old ones).
    pub fn set_builtins(&self, builtins: Arc<Builtins>) {
        self.builtins.store(builtins);
        *super::lock(&self.names) = None;
    }

    /// The built-ins served now.
    pub fn builtins(&self) -> Arc<Builtins> {
        self.builtins.load_full()
    }

    /// Add a stage after the existing ones.
    pub fn with_stage(mut self, stage: Arc<dyn CallStage>) -> Self {
        self.stages.push(stage);
        self
    }

    /// The event log the path records on, if any.
    pub fn bus(&self) -> Option<&EventBus> {
        self.bus.as_ref()
    }

    /// Why the server a gateway name `SERVER__TOOL` names failed (its
    /// last connection's error, which names it), when it did.
    fn failed_server_of(&self, name: &str) -> Option<String> {
        let (server, _) = name.split_once(super::NAMESPACE_SEPARATOR)?;
        match self.pool.states().remove(server)? {
            super::client::pool::UpstreamState::Failed { reason } => Some(reason),
            _ => None,
        }
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// Record that a client (`clientInfo` name and version, as it says)
    /// finished its handshake with the gateway.
    pub async fn record_client(&self, name: &str, version: &str) {
        let Some(bus) = &self.bus else { return };
        let payload = McpClientConnected {
            client: name.to_string(),
            version: version.to_string(),
        };
        if let Err(e) = bus
            .publish(NewEvent::from(Event::McpClientConnected(payload)))
            .await
        {
            tracing::warn!(error = %e, "mcp: recording a client connection failed");
        }
    }

    /// Record one `resources/read` (`target` the URI) or `prompts/get`
    /// (`target` the prompt's name) the gateway served: its outcome and
    /// duration.
    pub async fn record_request(
        &self,
        kind: Served,
        target: &str,
        error: Option<&str>,
        started: Instant,
    ) {
        let Some(bus) = &self.bus else { return };
        let outcome = if error.is_some() { "error" } else { "ok" }.to_string();
        let error = error.map(str::to_string);
        let duration_ms = started.elapsed().as_secs_f64() * 1000.0;
        let event = match kind {
            Served::ResourceRead => Event::McpResourceRead(McpResourceRead {
                uri: target.to_string(),
                outcome,
                error,
                duration_ms,
            }),
            Served::PromptGet => Event::McpPromptGet(McpPromptGet {
                name: target.to_string(),
                outcome,
                error,
                duration_ms,
            }),
        };
        if let Err(e) = bus.publish(NewEvent::from(event)).await {
            tracing::warn!(error = %e, "mcp: recording a request failed");
        }
    }

    /// Serve one `tools/call` of the namespaced tool `name`, recorded: a
    /// result, or the JSON-RPC error the server answered with.
    pub async fn call(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
    ) -> Result<CallToolResult, ErrorData> {
        let (result, record) = self.call_unrecorded(name, arguments).await;
        self.publish(record).await;
        result
    }

    /// Serve one `tools/call` like [`CallPath::call`], but hand back its
    /// record instead of publishing it, so a caller can answer first and
    /// [`CallPath::publish`] after (the gateway's session loop does).
    pub async fn call_unrecorded(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
    ) -> (Result<CallToolResult, ErrorData>, CallRecord) {
        let started = Instant::now();
        // One set of built-ins for the whole call, even across a reload.
        let builtins = self.builtins();
        // Search mode's `call_tool` is a call of the tool it names.
        let (name, arguments) = if self.listing() == ToolListing::Search && name == CALL_TOOL {
            match serde_json::from_value::<super::toolsearch::CallArgs>(Value::Object(
                arguments.clone().unwrap_or_default(),
            )) {
                Ok(call) => (call.name, call.arguments),
                Err(e) => {
                    let message = format!(
                        "invalid arguments for `{CALL_TOOL}`: {e}; it takes the tool's `name` (see `{SEARCH_TOOLS}`) and its `arguments`"
                    );
                    let record = CallRecord {
                        run: SESSION_RUN.try_with(Clone::clone).ok(),
                        name: name.to_string(),
                        server: None,
                        tool: None,
                        arguments,
                        outcome: Outcome::UnknownTool,
                        duration: started.elapsed(),
                        error: Some(message.clone()),
                        error_code: None,
                    };
                    return (Ok(error_result(message)), record);
                }
            }
        } else {
            (name.to_string(), arguments)
        };
        let name = name.as_str();
        let resolved = self.resolve(&builtins, name);
        let Some((server, tool)) = resolved else {
            let message = match self.listing() {
                // A server that did not start has no tools: say why.
                _ if let Some(reason) = self.failed_server_of(name) => {
                    format!("no tool `{name}`: {reason}")
                }
                ToolListing::All => {
                    format!("no tool `{name}`; see `tools/list` for the tools' names")
                }
                ToolListing::Search => {
                    format!("no tool `{name}`; find tools' names with `{SEARCH_TOOLS}`")
                }
            };
            let record = CallRecord {
                run: SESSION_RUN.try_with(Clone::clone).ok(),
                name: name.to_string(),
                server: None,
                tool: None,
                arguments,
                outcome: Outcome::UnknownTool,
                duration: started.elapsed(),
                error: Some(message.clone()),
                error_code: None,
            };
            return (Ok(error_result(message)), record);
        };
        let mut call = ToolCall {
            id: next_call_id(),
            name: canonical(&server, &tool, name),
            called: name.to_string(),
            server,
            tool,
            arguments,
            denied: false,
        };
        let mut denied = None;
        for stage in &self.stages {
            if let Before::Deny { reason } = stage.before(&mut call).await {
                denied = Some(reason);
                call.denied = true;
                break;
            }
        }
        // The server's JSON-RPC error answer, passed on as that error.
        let mut answered = None;
        let (mut result, mut outcome, mut error) = match denied {
            Some(reason) => {
                let message = format!("the call of `{}` was denied: {reason}", call.name);
                (
                    error_result(message.clone()),
                    Outcome::Denied,
                    Some(message),
                )
            }
            None if call.server == BUILTIN_SERVER
                && call.tool == SEARCH_TOOLS
                && !builtins.contains(SEARCH_TOOLS) =>
            {
                match self.search(call.arguments.clone()) {
                    Ok(result) => (result, Outcome::Ok, None),
                    Err(message) => (
                        error_result(message.clone()),
                        Outcome::ToolError,
                        Some(message),
                    ),
                }
            }
            // A built-in's name is reserved before any upstream's.
            None if builtins.contains(&call.name) => {
                // Tool-call events are written behind the answers; a
                // built-in (`npc_events`, the memory tools) sees them all.
                if let Some(bus) = &self.bus {
                    let _ = bus.store().flush().await;
                }
                match builtins.call(&call.tool, call.arguments.clone()).await {
                    Ok(result) => (result, Outcome::Ok, None),
                    Err(e) => {
                        let outcome = if e.is_unavailable() {
                            Outcome::Unavailable
                        } else {
                            Outcome::ToolError
                        };
                        let message = e.to_string();
                        (error_result(message.clone()), outcome, Some(message))
                    }
                }
            }
            None => match self
                .pool
                .call(&call.server, &call.tool, call.arguments.as_ref())
                .await
            {
                Ok(result) if result.is_error == Some(true) => (result, Outcome::ToolError, None),
                Ok(result) => (result, Outcome::Ok, None),
                Err(CallError::Answered { error, .. }) => {
                    let error = passed_error(error);
                    let message = error.message.to_string();
                    answered = Some(error);
                    (
                        error_result(message.clone()),
                        Outcome::ProtocolError,
                        Some(message),
                    )
                }
                Err(e) => {
                    let outcome = match e {
                        CallError::Unavailable(_) => Outcome::Unavailable,
                        CallError::Timeout { .. } => Outcome::Timeout,
                        CallError::Lost { .. } => Outcome::Lost,
                        CallError::Answered { .. } => Outcome::ProtocolError,
                    };
                    let message = e.to_string();
                    (error_result(message.clone()), outcome, Some(message))
                }
            },
        };
        for stage in &self.stages {
            stage.after(&call, &mut result).await;
        }
        if outcome == Outcome::Ok && result.is_error == Some(true) {
            outcome = Outcome::ToolError;
            error = None;
        }
        let record = CallRecord {
            run: SESSION_RUN.try_with(Clone::clone).ok(),
            name: call.called,
            server: Some(call.server),
            tool: Some(call.tool),
            arguments: call.arguments,
            outcome,
            duration: started.elapsed(),
            error,
            error_code: answered.as_ref().map(|e| e.code.0),
        };
        // The stages saw the error as an `isError` result; the client gets
        // the server's error itself.
        match answered {
            Some(e) => (Err(e), record),
            None => (Ok(result), record),
        }
    }

    /// The record of a call of `name` the client cancelled after it began at
    /// `started` (its arguments are not kept for it).
    pub fn cancelled(&self, name: &str, started: Instant) -> CallRecord {
        let (server, tool) = self.resolve(&self.builtins(), name).unzip();
        CallRecord {
            run: SESSION_RUN.try_with(Clone::clone).ok(),
            name: name.to_string(),
            server,
            tool,
            arguments: None,
            outcome: Outcome::Cancelled,
            duration: started.elapsed(),
            error: Some("the client cancelled the call".into()),
            error_code: None,
        }
    }

    /// Record a call served by [`CallPath::call_unrecorded`] as an
    /// `mcp.tool_call` event.
    pub async fn publish(&self, record: CallRecord) {
        let Some(bus) = &self.bus else { return };
        let CallRecord {
            name,
            server,
            tool,
            arguments,
            outcome,
            duration,
            error,
            error_code,
            run,
        } = record;
        let (name, server, tool) = (name.as_str(), server.as_deref(), tool.as_deref());
        let builtin = server == Some(BUILTIN_SERVER)
            && (self.builtins.load().contains(name) || tool == Some(SEARCH_TOOLS));
        let payload = McpToolCall {
            name: name.to_string(),
            server: server.map(str::to_string),
            tool: tool.map(str::to_string),
            outcome: outcome.as_str().to_string(),
            duration_ms: duration.as_secs_f64() * 1000.0,
            error,
            error_code,
            builtin,
            arguments: recorded_arguments(tool.unwrap_or(name), &arguments),
            run_id: run,
        };
        let mut event = NewEvent::from(Event::McpToolCall(payload));
        if let Some(server) = server.filter(|_| !builtin) {
            event = event.for_component(ComponentId::new(Kind::McpServer, server).to_string());
        }
        // Queued in order but not awaited: the answer does not wait for the
        // commit (a built-in reading the log flushes first, see `call`).
        if let Err(e) = bus.publish_detached(event).await {
            tracing::warn!(error = %e, "mcp: recording a tool call failed");
        }
    }
}

/// An upstream's JSON-RPC error as passed to the client: its message cut at
/// [`MAX_PASSED_ERROR_MESSAGE_BYTES`], its data left out when larger than
/// [`MAX_PASSED_ERROR_DATA_BYTES`] as JSON (the code always kept).
pub fn passed_error(mut error: ErrorData) -> ErrorData {
    if error.message.len() > MAX_PASSED_ERROR_MESSAGE_BYTES {
        let mut end = MAX_PASSED_ERROR_MESSAGE_BYTES;
        while !error.message.is_char_boundary(end) {
            end -= 1;
        }
        error.message = error.message[..end].to_string().into();
    }
    let data_bytes = error
        .data
        .as_ref()
        .map_or(0, |d| serde_json::to_vec(d).map_or(usize::MAX, |v| v.len()));
    if data_bytes > MAX_PASSED_ERROR_DATA_BYTES {
        tracing::warn!(
            data_bytes,
            "mcp: an upstream's error data was over the bound and left out"
        );
        error.data = None;
    }
    error
}

/// The arguments as recorded: sensitive ones replaced by [`REDACTED`], the
/// whole replaced by its size when larger than [`MAX_RECORDED_ARGUMENT_BYTES`].
pub fn recorded_arguments(tool: &str, arguments: &Option<JsonObject>) -> Value {
    let Some(arguments) = arguments else {
        return Value::Null;
    };
    let redacted: JsonObject = arguments
        .iter()
        .map(|(k, v)| {
            let key = k.to_ascii_lowercase();
            let sensitive = SENSITIVE_ARGUMENTS
                .iter()
                .any(|(t, a)| (*t == "*" || *t == tool) && *a == key)
                || SECRET_ARGUMENT_MARKERS.iter().any(|m| key.contains(m));
            let value = if sensitive {
                Value::String(REDACTED.into())
            } else {
                v.clone()
            };
            (k.clone(), value)
        })
        .collect();
    let size = serde_json::to_string(&redacted).map_or(0, |s| s.len());
    if size > MAX_RECORDED_ARGUMENT_BYTES {
        json!({ "omitted_bytes": size })
    } else {
        Value::Object(redacted)
    }
}
