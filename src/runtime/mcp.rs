//! The daemon's MCP driver: the daemon owns one upstream [`Pool`]
//! (`Launch::Supervised`) and this driver keeps its membership equal to the
//! applied MCP servers. A stdio server stays the supervised process it was
//! (its `restart` policy, backoff and log are the supervisor's), started with
//! its stdout piped so the pool's session rides on its stdin/stdout; an HTTP
//! server has no process and only joins the pool. Sessions connect in the
//! background; a server that fails is an `mcp.server_failed` event and a
//! `failed` state in `npc status`, never a failed reload or another
//! server's problem. Editing a server touches only it; removing it
//! disconnects it. The gateway every `npc mcp serve` fronts ([`McpDriver::gateway`])
//! records each call in the daemon's store.

use std::sync::{Arc, Mutex};

use super::RepoPaths;

use super::npc_tools::{NpcContext, NpcGroup};
use crate::bus::EventBus;
use crate::driver::{DriverContext, DriverError, TypedDriver, start_child, stop_child};
use crate::hooks::stage::HookStage;
use crate::hooks::{HookRunner, HookSet};
use crate::mcp::builtin::Builtins;
use crate::mcp::client::catalog::CatalogChange;
use crate::mcp::client::pool::{IDLE_SWEEP_INTERVAL, Launch, stdio_spec};
use crate::mcp::server::catalog::{Catalog, ManifestPrompts};
use crate::mcp::{CallPath, Gateway, Pool};
use crate::model::{Manifest, McpBuiltins, McpServer, McpTransport};
use crate::plan::ComponentId;

/// The MCP servers' driver, holding the daemon's pool, the built-in tools
/// and the catalog every gateway client shares.
#[derive(Debug)]
pub struct McpDriver {
    path: Arc<CallPath>,
    /// The hooks around every `tools/call`; their set follows the manifest.
    hooks: Arc<HookRunner>,
    catalog: Arc<Catalog>,
    npc: NpcContext,
    /// The `[mcp.builtins]` settings the served built-ins were made with.
    builtins: Mutex<Option<McpBuiltins>>,
}

impl McpDriver {
    /// A driver with an empty pool running stdio servers through `cx`'s
    /// supervisor and recording on `bus`. Starts the idle sweeper (it ends
    /// with the last reference to the pool).
    pub fn new(cx: DriverContext, paths: &RepoPaths, bus: EventBus) -> Self {
        let supervisor = cx.supervisor.clone();
        let pool = Arc::new(Pool::empty(cx, Launch::Supervised, Some(bus.clone())));
        let weak = Arc::downgrade(&pool);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(IDLE_SWEEP_INTERVAL);
            loop {
                tick.tick().await;
                let Some(pool) = weak.upgrade() else { return };
                pool.sweep_idle().await;
            }
        });
        let npc = NpcContext::new(paths.clone());
        let builtins = Arc::new(Builtins::standard(
            &npc.paths.root,
            &McpBuiltins::default(),
            Arc::new(NpcGroup::new(npc.clone())),
        ));
        let hooks = Arc::new(HookRunner::new(
            HookSet::default(),
            supervisor,
            Some(bus.clone()),
        ));
        Self {
            catalog: Arc::new(Catalog::new(pool.clone())),
            path: Arc::new(
                CallPath::new(pool, Some(bus))
                    .with_builtins(builtins)
                    .with_stage(Arc::new(HookStage::new(hooks.clone()))),
            ),
            hooks,
            npc,
            builtins: Mutex::new(None),
        }
    }

    /// A manifest was applied: run its hooks around tool calls, serve its
    /// `[mcp.builtins]` settings and its `prompts` from now on (connected
    /// clients are told when the prompts changed).
    pub fn manifest_applied(&self, manifest: &Manifest) {
        self.hooks
            .replace(HookSet::for_repository(&self.npc.paths.root, manifest));
        self.pool().set_prefix(manifest.mcp.prefix);
        self.path.set_listing(manifest.mcp.tools);
        {
            let mut current = crate::stdx::lock(&self.builtins);
            if current.as_ref() != Some(&manifest.mcp_builtins) {
                self.path.set_builtins(Arc::new(Builtins::standard(
                    &self.npc.paths.root,
                    &manifest.mcp_builtins,
                    Arc::new(NpcGroup::new(self.npc.clone())),
                )));
                *current = Some(manifest.mcp_builtins.clone());
            }
        }
        let changed = self.catalog.set_manifest_prompts(ManifestPrompts {
            manifest: Arc::new(manifest.clone()),
            root: self.npc.paths.root.clone(),
        });
        if changed {
            self.pool().catalog_changed(CatalogChange::Prompts);
        }
    }

    /// The daemon's run service, which `npc_delegate` starts runs through.
    pub fn set_runs(&self, runs: Arc<crate::runs::Runs>) {
        let _ = self.npc.runs.set(runs);
    }

    pub fn pool(&self) -> &Arc<Pool> {
        self.path.pool()
    }

    /// The MCP server the daemon serves on upgraded control connections.
    pub fn gateway(&self) -> Gateway {
        Gateway::with_catalog(self.path.clone(), self.catalog.clone())
    }
}

impl TypedDriver for McpDriver {
    type Config = McpServer;

    async fn start(
        &self,
        cx: &DriverContext,
        id: &ComponentId,
        server: &McpServer,
    ) -> Result<Option<u32>, DriverError> {
        // Never started with an empty value for a variable it names.
        server
            .check_start()
            .map_err(|e| DriverError::Component(Box::new(e)))?;
        let mut pid = None;
        if let McpTransport::Stdio(command) = &server.transport {
            let spec = stdio_spec(cx, &id.name, command, server.restart);
            pid = Some(start_child(cx, id, spec).await?);
        }
        self.pool().upsert(&id.name, server);
        Ok(pid)
    }

    async fn update(
        &self,
        _cx: &DriverContext,
        id: &ComponentId,
        _old: &McpServer,
        new: &McpServer,
    ) -> Result<(), DriverError> {
        self.pool().upsert(&id.name, new);
        Ok(())
    }

    async fn stop(&self, cx: &DriverContext, id: &ComponentId) -> Result<(), DriverError> {
        self.pool().remove(&id.name).await;
        stop_child(cx, id).await
    }
}
