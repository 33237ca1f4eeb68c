//! npc: one validated manifest (`npcagent.toml`) for every CLI coding agent
//! in a repository, and the tools around it. See ARCHITECTURE.md for the map.

pub mod cli;
pub mod model;
pub mod render;
