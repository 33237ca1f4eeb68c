//! npc as an MCP client: the pool's one session per upstream server of the
//! manifest ([`pool`], with `pool::upstream` for a session's life and
//! `pool::http_wire` for an HTTP upstream's calls), the lean stdio call path
//! onto a server's pipes ([`wire`]), and each server's resources and prompts
//! ([`catalog`]). Architecture invariant: nothing here knows the gateway's
//! side (`mcp::server`); what an upstream sends for the gateway's clients
//! goes through the bridge, `mcp::passthrough`.

pub mod catalog;
pub mod pool;
pub mod wire;
