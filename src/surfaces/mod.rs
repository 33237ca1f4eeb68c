//! Surfaces: every socket npc binds or connects to lives here, and so do the
//! wire types spoken on them. Today that is the daemon's control channel (a
//! Unix socket, owner-only); the REST API and webhooks join it later.

pub mod control;
pub mod mcp_http;
