//! npc as an MCP server, the gateway agents connect to: [`gateway`] (the
//! `ServerHandler` of `npc mcp serve`), [`session`] (one session over a byte
//! stream, `tools/call` answered in its own task), [`shortcut`] (the same for
//! `npc mcp serve --http`), [`relay`] (the HTTP front of the daemon's
//! gateway) and [`catalog`] (the resources and prompts the gateway serves,
//! under their gateway names). It reaches upstreams only through the call
//! path (`mcp::call`), the pool and the bridge (`mcp::passthrough`).

pub mod catalog;
pub mod gateway;
pub mod relay;
pub mod session;
pub mod shortcut;
