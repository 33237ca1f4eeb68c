//! The one integration test binary: every test here drives the real `npc`
//! binary or real peers (processes, files, sockets on 127.0.0.1). Each
//! capability has its own module.

mod acp;
mod agent_config;
mod agents;
mod api;
mod approvals;
mod architecture;
mod contain;
mod daemon;
mod doctor;
mod events;
mod fleet;
mod fleet_code;
mod fleet_faults;
mod fleet_hostile;
mod fleet_sessions;
mod fleet_tls;
mod fleet_view;
mod git_trust;
mod hints;
mod hooks;
mod hostile;
mod manifest;
mod mcp;
mod mcp_builtin;
mod mcp_daemon;
mod mcp_interop;
mod mcp_names;
mod mcp_passthrough;
mod panes;
mod peers;
mod pg;
mod plan_apply;
mod plugins;
mod providers;
mod real_clis;
mod render;
mod runs;
mod security;
mod supervisor;
mod support;
mod triggers;
mod trust;
mod validate;
mod worktrees;
