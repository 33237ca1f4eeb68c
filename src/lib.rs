//! npc: one validated manifest (`npcagent.toml`) for every CLI coding agent
//! in a repository, and the tools around it. See ARCHITECTURE.md for the map.

pub mod acp;
pub mod api;
pub mod bus;
pub mod cli;
pub mod disk;
pub mod driver;
pub mod event;
pub mod hooks;
pub mod mcp;
pub mod model;
pub mod native;
pub mod notify;
pub mod panes;
pub mod plan;
pub mod plugins;
pub mod providers;
pub mod render;
pub mod repofs;
pub mod runs;
pub mod runtime;
pub mod stdx;
pub mod store;
pub mod supervisor;
pub mod surfaces;
pub mod triggers;
pub mod workflows;
