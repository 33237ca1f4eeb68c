//! Resources and prompts behind the gateway. Each upstream session's
//! resources, resource templates and prompts are fetched at connect into its
//! [`ServerCatalog`] (only what the server's capabilities offer, at most
//! [`MAX_LIST_PAGES`] pages and [`MAX_ITEMS_PER_LIST`] items a list) and
//! refetched on `notifications/resources/list_changed` /
//! `notifications/prompts/list_changed` (coalesced, like tool lists); the
//! gateway's clients are then told in turn.
//!
//! Names, as the gateway's clients see them ([`Catalog`]):
//! - a resource `URI` of server `S` is `npc://S/URI` (the upstream URI kept
//!   verbatim after the server, so a template `file:///{path}` becomes
//!   `npc://S/file:///{path}` and its expansions route back unchanged), or
//!   with `mcp.prefix = "on_conflict"` just `URI` unless another server
//!   lists it too (a resource, the same template, or a template it expands);
//!   a bare upstream URI is read (and subscribed) when exactly one server
//!   lists it or has a template it expands;
//! - a prompt `P` of server `S` is `S__P`, spelled like tools
//!   ([`super::namespaced`]), or with `mcp.prefix = "on_conflict"` just `P`
//!   unless another server or a manifest prompt has it ([`super::expose`]);
//! - a prompt `NAME` of the manifest's `prompts` section keeps its name and
//!   is rendered by [`crate::render::prompt`] (fuel- and size-bounded, off
//!   the executor, within [`PROMPT_RENDER_DEADLINE`]); its variables are the
//!   prompt's arguments, required when they have no default. A manifest
//!   prompt wins a name collision with a server's prompt.

use super::passthrough::LIST_CHANGED_DEBOUNCE;
use crate::stdx::{read, write};
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use rmcp::model::{
    CompleteRequestParams, CompleteResult, CompletionInfo, GetPromptRequestParams, GetPromptResult,
    JsonObject, PaginatedRequestParams, Prompt, PromptArgument, PromptMessage,
    ReadResourceRequestParams, ReadResourceResult, Reference, Resource, ResourceContents,
    ResourceTemplate, Role,
};
use rmcp::{ErrorData, Peer, RoleClient};
use tokio::sync::broadcast;

use super::pool::{CallError, Pool};
use crate::model::Manifest;

/// Scheme and prefix of the gateway's resource URIs: `npc://SERVER/URI`.
pub const RESOURCE_URI_PREFIX: &str = "npc://";
/// Most pages fetched of one list (resources, templates, prompts) of one server.
pub const MAX_LIST_PAGES: usize = super::pool::MAX_TOOL_PAGES;
/// Most items kept of one list of one server; the rest are left out (logged).
pub const MAX_ITEMS_PER_LIST: usize = 1024;
/// Longest a manifest prompt may take to render for `prompts/get`.
pub const PROMPT_RENDER_DEADLINE: Duration = Duration::from_secs(10);

/// Which of a server's lists changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatalogChange {
    /// Resources or resource templates.
    Resources,
    Prompts,
}

/// Refresh states of one list: none running, one running, one running with
/// another notification since it started.
const REFRESH_IDLE: u8 = 0;
const REFRESH_RUNNING: u8 = 1;
const REFRESH_AGAIN: u8 = 2;

/// Mark a refresh wanted; true when the caller must start it (none ran).
pub(super) fn refresh_begins(state: &AtomicU8) -> bool {
    state
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |s| {
            Some(if s == REFRESH_IDLE {
                REFRESH_RUNNING
            } else {
                REFRESH_AGAIN
            })
        })
        .unwrap_or(REFRESH_AGAIN)
        == REFRESH_IDLE
}

/// After one refresh: true when done, false when another is due.
pub(super) fn refresh_done(state: &AtomicU8) -> bool {
    let done = state
        .compare_exchange(
            REFRESH_RUNNING,
            REFRESH_IDLE,
            Ordering::SeqCst,
            Ordering::SeqCst,
        )
        .is_ok();
    if !done {
        state.store(REFRESH_RUNNING, Ordering::SeqCst);
    }
    done
}

/// A paged list, at most [`MAX_LIST_PAGES`] pages and [`MAX_ITEMS_PER_LIST`]
/// items, so a server paging forever or listing without end cannot grow
/// npc's memory. `page` fetches one page after the given cursor.
async fn fetch_paged<T, F, Fut>(
    server: &str,
    what: &str,
    mut page: F,
) -> Result<Vec<T>, rmcp::ServiceError>
where
    F: FnMut(Option<PaginatedRequestParams>) -> Fut,
    Fut: Future<Output = Result<(Vec<T>, Option<String>), rmcp::ServiceError>>,
{
    let mut items = Vec::new();
    let mut cursor = None;
    for _ in 0..MAX_LIST_PAGES {
        let params = cursor.map(|c| PaginatedRequestParams::default().with_cursor(Some(c)));
        let (more, next) = page(params).await?;
        items.extend(more);
        if items.len() > MAX_ITEMS_PER_LIST {
            tracing::warn!(
                server,
                what,
                limit = MAX_ITEMS_PER_LIST,
                "mcp: server lists too many; the rest are left out"
            );
            items.truncate(MAX_ITEMS_PER_LIST);
            return Ok(items);
        }
        match next {
            Some(next) => cursor = Some(next),
            None => return Ok(items),
        }
    }
    tracing::warn!(
        server,
        what,
        pages = MAX_LIST_PAGES,
        "mcp: server pages without end; the rest are left out"
    );
    Ok(items)
}

/// One upstream server's cached resources, resource templates and prompts.
/// The cache survives a closed session, so listing never waits on a server.
#[derive(Debug)]
pub struct ServerCatalog {
    resources: RwLock<Vec<Resource>>,
    templates: RwLock<Vec<ResourceTemplate>>,
    prompts: RwLock<Vec<Prompt>>,
    resources_refresh: AtomicU8,
    prompts_refresh: AtomicU8,
    changed: broadcast::Sender<CatalogChange>,
}

impl ServerCatalog {
    /// An empty catalog announcing its changes on `changed`.
    pub fn new(changed: broadcast::Sender<CatalogChange>) -> Self {
        Self {
            resources: RwLock::default(),
            templates: RwLock::default(),
            prompts: RwLock::default(),
            resources_refresh: AtomicU8::new(REFRESH_IDLE),
            prompts_refresh: AtomicU8::new(REFRESH_IDLE),
            changed,
        }
    }

    /// Fetch every list the server's capabilities offer (at connect). A list
    /// the server fails to give is logged and left empty; the session stays.
    pub async fn fetch(&self, peer: &Peer<RoleClient>, server: &str) {
        self.refetch(CatalogChange::Resources, peer, server).await;
        self.refetch(CatalogChange::Prompts, peer, server).await;
    }

    async fn refetch(&self, what: CatalogChange, peer: &Peer<RoleClient>, server: &str) {
        let capabilities = peer.peer_info().map(|i| i.capabilities.clone());
        let offered = capabilities.as_ref().is_some_and(|c| match what {
            CatalogChange::Resources => c.resources.is_some(),
            CatalogChange::Prompts => c.prompts.is_some(),
        });
        if !offered {
            return;
        }
        match what {
            CatalogChange::Resources => {
                let resources = fetch_paged(server, "resources", |p| async move {
                    peer.list_resources(p)
                        .await
                        .map(|r| (r.resources, r.next_cursor))
                })
                .await;
                let templates = fetch_paged(server, "resource templates", |p| async move {
                    peer.list_resource_templates(p)
                        .await
                        .map(|r| (r.resource_templates, r.next_cursor))
                })
                .await;
                store(&self.resources, resources, server, "resources/list");
                store(
                    &self.templates,
                    templates,
                    server,
                    "resources/templates/list",
                );
            }
            CatalogChange::Prompts => {
                let prompts = fetch_paged(server, "prompts", |p| async move {
                    peer.list_prompts(p)
                        .await
                        .map(|r| (r.prompts, r.next_cursor))
                })
                .await;
                store(&self.prompts, prompts, server, "prompts/list");
            }
        }
        let _ = self.changed.send(what);
    }

    /// `notifications/*/list_changed` arrived: refetch that list after
    /// [`LIST_CHANGED_DEBOUNCE`]. Notifications while one waits or runs
    /// coalesce into one more, so a server flooding them costs at most one
    /// task and one fetch per window.
    pub fn list_changed(
        self: &Arc<Self>,
        what: CatalogChange,
        peer: Peer<RoleClient>,
        server: String,
    ) {
        if !refresh_begins(self.refresh_state(what)) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(LIST_CHANGED_DEBOUNCE).await;
                this.refetch(what, &peer, &server).await;
                if refresh_done(this.refresh_state(what)) {
                    break;
                }
            }
        });
    }

    fn refresh_state(&self, what: CatalogChange) -> &AtomicU8 {
        match what {
            CatalogChange::Resources => &self.resources_refresh,
            CatalogChange::Prompts => &self.prompts_refresh,
        }
    }

    pub fn resources(&self) -> Vec<Resource> {
        read(&self.resources).clone()
    }

    pub fn templates(&self) -> Vec<ResourceTemplate> {
        read(&self.templates).clone()
    }

    pub fn prompts(&self) -> Vec<Prompt> {
        read(&self.prompts).clone()
    }

    fn lists_resource(&self, uri: &str) -> bool {
        read(&self.resources).iter().any(|r| r.uri == uri)
    }

    fn lists_template(&self, uri_template: &str) -> bool {
        read(&self.templates)
            .iter()
            .any(|t| t.uri_template == uri_template)
    }

    fn expands_template(&self, uri: &str) -> bool {
        read(&self.templates)
            .iter()
            .any(|t| expands(&t.uri_template, uri))
    }

    fn lists_prompt(&self, name: &str) -> bool {
        read(&self.prompts).iter().any(|p| p.name == name)
    }
}

fn store<T>(
    slot: &RwLock<Vec<T>>,
    fetched: Result<Vec<T>, rmcp::ServiceError>,
    server: &str,
    method: &str,
) {
    match fetched {
        Ok(items) => *write(slot) = items,
        Err(e) => {
            tracing::warn!(server, method, error = %e, "mcp: fetching a list failed; keeping the last one")
        }
    }
}

/// `npc://SERVER/URI`: how the gateway names resource `uri` of `server`.
pub fn resource_uri(server: &str, uri: &str) -> String {
    format!("{RESOURCE_URI_PREFIX}{server}/{uri}")
}

/// Whether `uri` is an expansion of the RFC 6570 `template`: its literal
/// parts in order, each `{…}` expression standing for at least one character.
pub fn expands(template: &str, uri: &str) -> bool {
    let mut literals = Vec::new();
    let mut rest = template;
    while let Some((literal, after)) = rest.split_once('{') {
        literals.push(literal);
        let Some((_, after)) = after.split_once('}') else {
            return false;
        };
        rest = after;
    }
    if literals.is_empty() {
        return template == uri;
    }
    let Some(mut at) = uri.strip_prefix(literals[0]).map(|_| literals[0].len()) else {
        return false;
    };
    for literal in literals[1..].iter().filter(|l| !l.is_empty()) {
        let Some(found) = uri.get(at + 1..).and_then(|u| u.find(literal)) else {
            return false;
        };
        at += 1 + found + literal.len();
    }
    uri.ends_with(rest) && uri.len() - rest.len() > at
}

/// The (server, upstream URI) a gateway resource URI stands for.
pub fn split_resource_uri(uri: &str) -> Option<(&str, &str)> {
    uri.strip_prefix(RESOURCE_URI_PREFIX)?
        .split_once('/')
        .filter(|(server, rest)| !server.is_empty() && !rest.is_empty())
}

/// The resource URIs and templates every server lists, to name them under
/// `mcp.prefix = "on_conflict"` (gathered once a list, not once a URI).
#[derive(Debug, Default)]
struct UriClaims {
    on_conflict: bool,
    /// A resource URI or template → the servers listing it.
    listed: std::collections::HashMap<String, std::collections::BTreeSet<String>>,
    /// (server, template) of every server.
    templates: Vec<(String, String)>,
}

impl UriClaims {
    /// The name the gateway gives `uri` (a resource or template URI) of
    /// `server`: `npc://SERVER/URI`, or with `mcp.prefix = "on_conflict"`
    /// `uri` itself unless another server lists it too or has a template it
    /// expands (or it looks like a gateway URI).
    fn gateway_uri(&self, server: &str, uri: &str) -> String {
        let clash = || {
            self.listed
                .get(uri)
                .is_some_and(|s| s.iter().any(|other| other != server))
                || self
                    .templates
                    .iter()
                    .any(|(other, t)| other != server && expands(t, uri))
        };
        if self.on_conflict && !uri.starts_with(RESOURCE_URI_PREFIX) && !clash() {
            uri.to_string()
        } else {
            resource_uri(server, uri)
        }
    }
}

/// The manifest whose `prompts` the gateway serves, and the repository
/// they render in.
#[derive(Debug, Clone)]
pub struct ManifestPrompts {
    pub manifest: Arc<Manifest>,
    pub root: PathBuf,
}

/// What the gateway lists and serves of resources and prompts: every
/// server's catalog in the pool, plus the manifest's prompts.
#[derive(Debug)]
pub struct Catalog {
    pool: Arc<Pool>,
    /// Replaced when the daemon applies a new manifest.
    manifest: ArcSwapOption<ManifestPrompts>,
}

fn unavailable(e: CallError) -> ErrorData {
    ErrorData::internal_error(e.to_string(), None)
}

impl Catalog {
    pub fn new(pool: Arc<Pool>) -> Self {
        Self {
            pool,
            manifest: ArcSwapOption::empty(),
        }
    }

    /// Serve the manifest's `prompts` too.
    pub fn with_manifest_prompts(self, prompts: ManifestPrompts) -> Self {
        self.set_manifest_prompts(prompts);
        self
    }

    /// Serve these manifest prompts from now on. Returns whether the
    /// prompts differ from the ones served before.
    pub fn set_manifest_prompts(&self, prompts: ManifestPrompts) -> bool {
        let old = self.manifest.swap(Some(Arc::new(prompts)));
        let new = self.manifest.load();
        match (old.as_deref(), new.as_deref()) {
            (Some(old), Some(new)) => old.manifest.prompts != new.manifest.prompts,
            _ => true,
        }
    }

    /// Every server's resources under their gateway URIs, servers in name order.
    pub fn resources(&self) -> Vec<Resource> {
        let claims = self.claims();
        let mut out = Vec::new();
        for (server, catalog) in self.pool.catalogs() {
            out.extend(catalog.resources().into_iter().map(|mut r| {
                r.uri = claims.gateway_uri(&server, &r.uri);
                r
            }));
        }
        out
    }

    /// Every server's resource templates under their gateway URIs.
    pub fn resource_templates(&self) -> Vec<ResourceTemplate> {
        let claims = self.claims();
        let mut out = Vec::new();
        for (server, catalog) in self.pool.catalogs() {
            out.extend(catalog.templates().into_iter().map(|mut t| {
                t.uri_template = claims.gateway_uri(&server, &t.uri_template);
                t
            }));
        }
        out
    }

    /// Which servers list which resource URIs and templates (nothing under
    /// `mcp.prefix = "always"`, where every URI is `npc://SERVER/URI`).
    fn claims(&self) -> UriClaims {
        let mut claims = UriClaims::default();
        if self.pool.prefix() != super::Prefix::OnConflict {
            return claims;
        }
        claims.on_conflict = true;
        for (server, catalog) in self.pool.catalogs() {
            for r in catalog.resources() {
                claims
                    .listed
                    .entry(r.uri)
                    .or_default()
                    .insert(server.clone());
            }
            for t in catalog.templates() {
                claims
                    .listed
                    .entry(t.uri_template.clone())
                    .or_default()
                    .insert(server.clone());
                claims.templates.push((server.clone(), t.uri_template));
            }
        }
        claims
    }

    /// The (server, upstream URI) `uri` reads or subscribes: a gateway URI
    /// of a pool server, or an upstream URI exactly one server lists (or,
    /// when none lists it, exactly one has a template it expands).
    pub fn route_resource(&self, uri: &str) -> Option<(String, String)> {
        if let Some((server, rest)) = split_resource_uri(uri)
            && self.pool.catalog_of(server).is_some()
        {
            return Some((server.to_string(), rest.to_string()));
        }
        let catalogs: Vec<_> = self.pool.catalogs().collect();
        let only = |of: &dyn Fn(&ServerCatalog) -> bool| {
            let mut matching = catalogs.iter().filter(|(_, c)| of(c));
            match (matching.next(), matching.next()) {
                (Some((server, _)), None) => Some((server.clone(), uri.to_string())),
                _ => None,
            }
        };
        if catalogs.iter().any(|(_, c)| c.lists_resource(uri)) {
            return only(&|c| c.lists_resource(uri));
        }
        only(&|c| c.expands_template(uri))
    }

    /// Read `uri` from its server within the server's `tool_timeout_ms`;
    /// the contents come back under gateway URIs.
    pub async fn read_resource(&self, uri: &str) -> Result<ReadResourceResult, ErrorData> {
        let Some((server, upstream_uri)) = self.route_resource(uri) else {
            return Err(ErrorData::resource_not_found(
                format!(
                    "no resource `{uri}`; resources are named `{RESOURCE_URI_PREFIX}SERVER/URI` (or their own URI where it does not clash, with `mcp.prefix = \"on_conflict\"`), see `resources/list`"
                ),
                None,
            ));
        };
        let params = ReadResourceRequestParams::new(upstream_uri);
        let mut result = self
            .pool
            .request(
                &server,
                |peer| async move { peer.read_resource(params).await },
            )
            .await
            .map_err(unavailable)?
            .map_err(|e| answered(&server, e))?;
        let claims = self.claims();
        for content in &mut result.contents {
            if let ResourceContents::TextResourceContents { uri, .. }
            | ResourceContents::BlobResourceContents { uri, .. } = content
            {
                *uri = claims.gateway_uri(&server, uri);
            }
        }
        Ok(result)
    }

    /// The manifest's prompts, then every server's under `SERVER__PROMPT`;
    /// a name that is not portable or collides with an earlier one is left out.
    pub fn prompts(&self) -> Vec<Prompt> {
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        if let Some(m) = self.manifest.load_full() {
            for (name, prompt) in &m.manifest.prompts {
                let arguments = prompt
                    .variables
                    .iter()
                    .map(|(var, decl)| {
                        let mut arg =
                            PromptArgument::new(var).with_required(decl.default.is_none());
                        if let Some(d) = &decl.description {
                            arg = arg.with_description(d);
                        }
                        arg
                    })
                    .collect();
                seen.insert(name.clone());
                out.push(Prompt::new(name, None::<String>, Some(arguments)));
            }
        }
        let catalogs: Vec<_> = self
            .pool
            .catalogs()
            .map(|(server, c)| (server, c.prompts()))
            .collect();
        let items = catalogs
            .iter()
            .flat_map(|(server, ps)| ps.iter().map(move |p| (server.as_str(), p.name.as_str())));
        for e in super::expose(self.pool.prefix(), items, |n| seen.contains(n)) {
            let Some(prompt) = catalogs
                .iter()
                .filter(|(server, _)| *server == e.server)
                .find_map(|(_, ps)| ps.iter().find(|p| p.name == e.own))
            else {
                continue;
            };
            let mut prompt = prompt.clone();
            prompt.name = e.name;
            out.push(prompt);
        }
        out
    }

    /// Get prompt `name`: a manifest prompt rendered here, or a server's
    /// prompt fetched within its `tool_timeout_ms`.
    pub async fn get_prompt(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
    ) -> Result<GetPromptResult, ErrorData> {
        if let Some(m) = self.manifest.load_full()
            && m.manifest.prompts.contains_key(name)
        {
            return render(&m, name, arguments).await;
        }
        let Some((server, prompt)) = self.route_prompt(name) else {
            return Err(ErrorData::invalid_params(
                format!("no prompt `{name}`; see `prompts/list`"),
                None,
            ));
        };
        let mut params = GetPromptRequestParams::new(prompt);
        params.arguments = arguments;
        self.pool
            .request(&server, |peer| async move { peer.get_prompt(params).await })
            .await
            .map_err(unavailable)?
            .map_err(|e| answered(&server, e))
    }
}

impl Catalog {
    /// The (server, upstream prompt) a gateway prompt name stands for.
    fn route_prompt(&self, name: &str) -> Option<(String, String)> {
        if self.pool.prefix() == super::Prefix::OnConflict {
            let manifest = self.manifest.load_full();
            let ours = |n: &str| {
                manifest
                    .as_ref()
                    .is_some_and(|m| m.manifest.prompts.contains_key(n))
            };
            let catalogs: Vec<_> = self
                .pool
                .catalogs()
                .map(|(server, c)| (server, c.prompts()))
                .collect();
            let items = catalogs.iter().flat_map(|(server, ps)| {
                ps.iter().map(move |p| (server.as_str(), p.name.as_str()))
            });
            return super::expose(super::Prefix::OnConflict, items, ours)
                .into_iter()
                .find(|e| e.name == name)
                .map(|e| (e.server, e.own));
        }
        self.pool.catalogs().find_map(|(server, catalog)| {
            let prompt = name
                .strip_prefix(server.as_str())?
                .strip_prefix(super::NAMESPACE_SEPARATOR)?;
            catalog
                .lists_prompt(prompt)
                .then(|| (server.to_string(), prompt.to_string()))
        })
    }

    /// The (server, upstream template) a gateway template URI stands for:
    /// `npc://SERVER/TEMPLATE` of a server listing it, or a template exactly
    /// one server lists.
    fn route_template(&self, uri: &str) -> Option<(String, String)> {
        if let Some((server, template)) = split_resource_uri(uri)
            && self
                .pool
                .catalog_of(server)
                .is_some_and(|c| c.lists_template(template))
        {
            return Some((server.to_string(), template.to_string()));
        }
        let mut listing = self
            .pool
            .catalogs()
            .filter(|(_, c)| c.lists_template(uri))
            .map(|(s, _)| s);
        match (listing.next(), listing.next()) {
            (Some(server), None) => Some((server, uri.to_string())),
            _ => None,
        }
    }

    /// `completion/complete`: an argument of a server's prompt or resource
    /// template is completed by that server (within its `tool_timeout_ms`);
    /// anything else (manifest prompts, unknown references, servers without
    /// completions) completes to no values.
    pub async fn complete(
        &self,
        mut params: CompleteRequestParams,
    ) -> Result<CompleteResult, ErrorData> {
        let none = || CompleteResult::new(CompletionInfo::default());
        let server = match &mut params.r#ref {
            Reference::Prompt(p) => match self.route_prompt(&p.name) {
                Some((server, prompt)) => {
                    p.name = prompt;
                    server
                }
                None => return Ok(none()),
            },
            Reference::Resource(r) => match self.route_template(&r.uri) {
                Some((server, template)) => {
                    r.uri = template;
                    server
                }
                None => return Ok(none()),
            },
            _ => return Ok(none()),
        };
        let answer = self
            .pool
            .request(&server, |peer| async move {
                let offered = peer
                    .peer_info()
                    .is_some_and(|i| i.capabilities.completions.is_some());
                if !offered {
                    return Ok(None);
                }
                peer.complete(params).await.map(Some)
            })
            .await
            .map_err(unavailable)?
            .map_err(|e| answered(&server, e))?;
        Ok(answer.unwrap_or_else(none))
    }
}

/// A server's error answer, passed on with its code and the server named.
fn answered(server: &str, e: ErrorData) -> ErrorData {
    ErrorData::new(
        e.code,
        format!("MCP server `{server}` answered: {}", e.message),
        e.data,
    )
}

/// Render manifest prompt `name` with `arguments` (strings) as its variables.
async fn render(
    m: &ManifestPrompts,
    name: &str,
    arguments: Option<JsonObject>,
) -> Result<GetPromptResult, ErrorData> {
    let mut vars = std::collections::BTreeMap::new();
    for (key, value) in arguments.unwrap_or_default() {
        let serde_json::Value::String(value) = value else {
            return Err(ErrorData::invalid_params(
                format!("argument `{key}` of prompt `{name}` must be a string"),
                None,
            ));
        };
        vars.insert(key, value);
    }
    let (manifest, root, prompt) = (m.manifest.clone(), m.root.clone(), name.to_string());
    let work = tokio::task::spawn_blocking(move || {
        let ctx = crate::render::RenderContext::new(&root, &manifest);
        crate::render::prompt(&manifest, &prompt, &vars, &ctx)
    });
    match tokio::time::timeout(PROMPT_RENDER_DEADLINE, work).await {
        Ok(Ok(Ok(text))) => Ok(GetPromptResult::new(vec![PromptMessage::new_text(
            Role::User,
            text,
        )])),
        Ok(Ok(Err(e))) => Err(ErrorData::invalid_params(e.to_string(), None)),
        Ok(Err(e)) => Err(ErrorData::internal_error(
            format!("rendering prompt `{name}` failed: {e}"),
            None,
        )),
        Err(_) => Err(ErrorData::internal_error(
            format!(
                "prompt `{name}` did not render within {} s; simplify its template",
                PROMPT_RENDER_DEADLINE.as_secs()
            ),
            None,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_uris_round_trip_verbatim() {
        let uri = resource_uri("fs", "file:///tmp/a b.txt");
        assert_eq!(uri, "npc://fs/file:///tmp/a b.txt");
        assert_eq!(
            split_resource_uri(&uri),
            Some(("fs", "file:///tmp/a b.txt"))
        );
        let template = resource_uri("every", "demo://resource/{id}");
        assert_eq!(
            split_resource_uri(&template.replace("{id}", "7")),
            Some(("every", "demo://resource/7"))
        );
        assert_eq!(split_resource_uri("npc://fs"), None);
        assert_eq!(split_resource_uri("npc:///x"), None);
        assert_eq!(split_resource_uri("file:///x"), None);
    }

    #[test]
    fn template_expansions_are_recognised() {
        let t = "test://template/{id}/data";
        assert!(expands(t, "test://template/123/data"));
        assert!(expands(t, "test://template/a/b/data"));
        assert!(
            !expands(t, "test://template//data"),
            "an expression is not empty"
        );
        assert!(!expands(t, "test://template/123/date"));
        assert!(!expands(t, "test://other/123/data"));
        assert!(expands("file:///{+path}", "file:///tmp/x"));
        assert!(!expands("file:///{+path}", "file:///"));
        assert!(expands("a://{x}{y}-z", "a://12-z"));
        assert!(expands("a://plain", "a://plain"));
        assert!(!expands("a://plain", "a://plainer"));
        assert!(!expands("a://{broken", "a://broken"));
    }

    #[test]
    fn refreshes_coalesce() {
        let state = AtomicU8::new(REFRESH_IDLE);
        assert!(refresh_begins(&state), "the first notification starts one");
        assert!(!refresh_begins(&state), "the next ones only mark it again");
        assert!(!refresh_begins(&state));
        assert!(!refresh_done(&state), "one more refresh is due");
        assert!(refresh_done(&state), "then it is done");
        assert!(refresh_begins(&state));
    }

    #[tokio::test]
    async fn paging_is_bounded() {
        let pages = std::sync::atomic::AtomicUsize::new(0);
        let got = fetch_paged("s", "things", |_| {
            pages.fetch_add(1, Ordering::SeqCst);
            async { Ok((vec![1u8], Some("more".to_string()))) }
        })
        .await
        .unwrap();
        assert_eq!(got.len(), MAX_LIST_PAGES);
        assert_eq!(pages.load(Ordering::SeqCst), MAX_LIST_PAGES);
        let got = fetch_paged("s", "things", |_| async {
            Ok((vec![0u8; MAX_ITEMS_PER_LIST + 5], Some("more".to_string())))
        })
        .await
        .unwrap();
        assert_eq!(got.len(), MAX_ITEMS_PER_LIST);
    }
}
