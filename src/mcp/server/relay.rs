//! A relay: an MCP server whose every message goes to another MCP server
//! and back. `npc mcp serve --http` in front of a daemon serves one [`Relay`]
//! per HTTP session, each riding its own upgraded control connection to the
//! daemon's gateway, so the daemon's pool serves every call (no second copy
//! of any server) and records it. The relay is generic: requests and
//! tools, resources and prompts pass through, the daemon's requests and
//! notifications (`tools/list_changed`, …) reach the HTTP client unchanged,
//! and the HTTP client's `initialize` parameters become the relay's own. A
//! call's progress comes back under the HTTP client's own token (the
//! relay's session numbers its own), a call the client cancels is
//! cancelled behind, and subscriptions and `roots/list_changed` pass too.
//! The connection comes from a [`Connect`] the caller provides; nothing
//! here binds or connects sockets.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientConfig, ClientResult, CompleteRequestParams,
    CompleteResult, GetPromptRequestParams, GetPromptResponse, ListPromptsResult,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ProgressToken, ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities,
    ServerConfig, ServerNotification, ServerRequest,
};
// Logging and subscriptions are deprecated (SEP-2577) but clients still use them.
#[allow(deprecated)]
use rmcp::model::{SetLevelRequestParams, SubscribeRequestParams, UnsubscribeRequestParams};

use crate::mcp::passthrough::call_tracked;

/// The HTTP client's progress tokens, by the token the relay's session gave
/// the call behind.
type Progress = Arc<Mutex<HashMap<ProgressToken, ProgressToken>>>;
use rmcp::service::{NotificationContext, RequestContext, RunningService, ServiceRole};
use rmcp::{ErrorData, Peer, RoleClient, RoleServer, ServerHandler, Service, ServiceExt};

/// The daemon side of one relayed session: a reader and a writer of MCP frames.
pub type Stream = (
    Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
);
/// Opens a new connection to the server behind the relay.
pub type Connect =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<Stream, String>> + Send>> + Send + Sync>;

/// The front of one relayed session (an MCP server to its client).
#[derive(Clone)]
pub struct Relay {
    connect: Connect,
    progress: Progress,
    back: Arc<Mutex<Option<Peer<RoleClient>>>>,
    session: Arc<tokio::sync::Mutex<Option<RunningService<RoleClient, Back>>>>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay").finish_non_exhaustive()
    }
}

/// The back of one relayed session (an MCP client to the server behind),
/// passing the server's requests and notifications to the front's client.
#[derive(Clone)]
struct Back {
    info: ClientConfig,
    front: Peer<RoleServer>,
}

fn unreachable_back(reason: impl std::fmt::Display) -> ErrorData {
    ErrorData::internal_error(
        format!("the npc daemon's gateway cannot be reached ({reason}); check `npc status`"),
        None,
    )
}

fn service_error(e: rmcp::ServiceError) -> ErrorData {
    match e {
        rmcp::ServiceError::McpError(e) => e,
        other => unreachable_back(other),
    }
}

impl Relay {
    pub fn new(connect: Connect) -> Self {
        Self {
            connect,
            progress: Arc::default(),
            back: Arc::default(),
            session: Arc::default(),
        }
    }

    fn back(&self) -> Result<Peer<RoleClient>, ErrorData> {
        crate::stdx::lock(&self.back)
            .clone()
            .ok_or_else(|| unreachable_back("the session is not initialized"))
    }
}

impl ServerHandler for Relay {
    async fn initialize(
        &self,
        request: ClientConfig,
        context: RequestContext<RoleServer>,
    ) -> Result<ServerConfig, ErrorData> {
        context.peer.set_peer_info(request.clone());
        let (read, write) = (self.connect)().await.map_err(unreachable_back)?;
        let read = intercept_progress(read, self.progress.clone(), context.peer.clone());
        let back = Back {
            info: request,
            front: context.peer.clone(),
        };
        let running = back.serve((read, write)).await.map_err(unreachable_back)?;
        let info = running
            .peer_info()
            .ok_or_else(|| unreachable_back("it sent no server info"))?;
        let mut answer = ServerConfig::new(info.capabilities.clone());
        answer.protocol_version = info.protocol_version.clone();
        answer.instructions = info.instructions.clone();
        if let Some(server) = &info.server_info {
            answer.server_info = server.clone();
        }
        *crate::stdx::lock(&self.back) = Some(running.peer().clone());
        *self.session.lock().await = Some(running);
        Ok(answer)
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.back()?
            .list_tools(request)
            .await
            .map_err(service_error)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let back = self.back()?;
        let front_token = context.meta.get_progress_token();
        let mut behind = None;
        let call = call_tracked(&back, request, |_, token| {
            if let Some(front) = front_token {
                crate::stdx::lock(&self.progress).insert(token.clone(), front);
                behind = Some(token.clone());
            }
        });
        // Dropping the call on a cancel cancels it behind.
        let answer = tokio::select! {
            answer = call => answer.map(Into::into).map_err(service_error),
            () = context.ct.cancelled() => Err(ErrorData::internal_error("the call was cancelled", None)),
        };
        if let Some(token) = behind {
            crate::stdx::lock(&self.progress).remove(&token);
        }
        answer
    }

    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.back()?.subscribe(request).await.map_err(service_error)
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.back()?
            .unsubscribe(request)
            .await
            .map_err(service_error)
    }

    async fn on_roots_list_changed(&self, _context: NotificationContext<RoleServer>) {
        if let Ok(back) = self.back() {
            let _ = back.notify_roots_list_changed().await;
        }
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        self.back()?
            .list_resources(request)
            .await
            .map_err(service_error)
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        self.back()?
            .list_resource_templates(request)
            .await
            .map_err(service_error)
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        self.back()?
            .read_resource_once(request)
            .await
            .map_err(service_error)
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        self.back()?
            .list_prompts(request)
            .await
            .map_err(service_error)
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        self.back()?
            .get_prompt_once(request)
            .await
            .map_err(service_error)
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        self.back()?.complete(request).await.map_err(service_error)
    }

    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.back()?.set_level(request).await.map_err(service_error)
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
    }
}

/// Buffer of the in-process pipe between the daemon's stream and rmcp.
const PIPE_BYTES: usize = 256 * 1024;

/// The daemon's frames, with the progress of the client's calls sent to
/// `front` (under the client's tokens) as they are read, so it comes before
/// the call's answer and in order (rmcp handles each notification in a task
/// of its own); everything else goes on to rmcp.
fn intercept_progress(
    read: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    progress: Progress,
    front: Peer<RoleServer>,
) -> Box<dyn tokio::io::AsyncRead + Send + Unpin> {
    use crate::stdx::lines::{Line, LineReader, Overlong, Splitter};
    use tokio::io::AsyncWriteExt as _;
    let (mut to_rmcp, from_pump) = tokio::io::duplex(PIPE_BYTES);
    tokio::spawn(async move {
        let splitter = Splitter::new(crate::mcp::MAX_FRAME_BYTES, Overlong::Stop).skip_blank();
        let mut reader = LineReader::new(read, splitter);
        while let Ok(Some(Line::Line(mut line))) = reader.next().await {
            if let Some(notification) = relayed_progress(&line, &progress) {
                let _ = front.send_notification(notification).await;
                continue;
            }
            line.push(b'\n');
            if to_rmcp.write_all(&line).await.is_err() {
                break;
            }
        }
        // Dropping `to_rmcp` ends rmcp's input.
    });
    Box::new(from_pump)
}

/// If `line` is progress of one of the client's calls: the notification
/// under the client's token.
fn relayed_progress(line: &[u8], progress: &Progress) -> Option<ServerNotification> {
    #[derive(serde::Deserialize)]
    struct Frame {
        method: String,
        params: rmcp::model::ProgressNotificationParam,
    }
    let Frame { method, mut params } = serde_json::from_slice(line).ok()?;
    if method != "notifications/progress" {
        return None;
    }
    let front = crate::stdx::lock(progress)
        .get(&params.progress_token)
        .cloned()?;
    params.progress_token = front;
    Some(rmcp::model::ProgressNotification::new(params).into())
}

impl Service<RoleClient> for Back {
    async fn handle_request(
        &self,
        request: ServerRequest,
        _context: RequestContext<RoleClient>,
    ) -> Result<ClientResult, ErrorData> {
        self.front.send_request(request).await.map_err(|e| match e {
            rmcp::ServiceError::McpError(e) => e,
            other => ErrorData::internal_error(
                format!("the relayed MCP client did not answer: {other}"),
                None,
            ),
        })
    }

    async fn handle_notification(
        &self,
        notification: ServerNotification,
        _context: NotificationContext<RoleClient>,
    ) -> Result<(), ErrorData> {
        // The client's calls' progress went straight to it
        // ([`intercept_progress`]); any other is of no call of the client's.
        if let ServerNotification::ProgressNotification(_) = &notification {
            return Ok(());
        }
        let _ = self.front.send_notification(notification).await;
        Ok(())
    }

    fn get_info(&self) -> <RoleClient as ServiceRole>::Info {
        self.info.clone()
    }
}
