//! Surfaces: the sockets npc binds or connects to, and the wire types
//! spoken on them: the daemon's control channel (a Unix socket,
//! owner-only), the MCP gateway's HTTP listener and the pool's HTTP client
//! transport (`mcp_http`), the pool's lean posts on an HTTP upstream's
//! session (`mcp_link`), the notification sinks' bounded POST (`post`),
//! the webhook listener's socket (`webhook`),
//! `npc acp`'s approval socket (`approval`), newline-delimited JSON-RPC
//! framing (`jsonrpc`, both sides of ACP), a sandboxed run's channel to
//! its owner (`channel`), the one guarded TCP bind and
//! constant-time compare (`tcp`), the run requests front ends send (`runs`)
//! and the standard streams stdio protocols are spoken on (`stdio`). The
//! REST API's routes and handlers are the `api` room's; its listener binds
//! through `tcp`.
//!
//! Architecture invariant: this room knows no engine, no API, no runtime:
//! it carries bytes and wire types it does not interpret.

pub mod approval;
pub mod channel;
pub mod control;
pub mod egress;
pub mod http;
pub mod jsonrpc;
pub mod mcp_http;
pub mod mcp_link;
pub mod post;
pub mod runs;
pub mod stdio;
pub mod tcp;
pub mod webhook;
