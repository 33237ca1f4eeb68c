//! The MCP gateway's and pool's events (`mcp.*`) and hooks' (`hook.call`).

