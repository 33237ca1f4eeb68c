//! Surfaces: every socket npc binds or connects to lives here, and so do the
//! wire types spoken on them. Today that is the daemon's control channel (a
//! Unix socket, owner-only) and the MCP gateway's loopback HTTP listener
//! (`mcp_http`), the webhook listener (`webhook`), `npc acp`'s approval socket
//! (`approval`), the REST API
//! (`api`), and the standard streams stdio protocols are spoken on
//! (`stdio`); `listings` builds the JSON objects the CLI and the REST API
//! both answer with.

pub mod api;
pub mod approval;
pub mod control;
pub mod listings;
pub mod mcp_http;
pub mod stdio;
pub mod webhook;
