//! Resources and prompts behind the gateway: what its clients list and read
//! of every upstream's catalog (`client::catalog`, kept by the pool's
//! sessions) and of the manifest's `prompts`. When an upstream's lists
//! change, the gateway's clients are told in turn.
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
//!   ([`crate::mcp::namespaced`]), or with `mcp.prefix = "on_conflict"` just `P`
//!   unless another server or a manifest prompt has it ([`crate::mcp::expose`]);
//! - a prompt `NAME` of the manifest's `prompts` section keeps its name and
//!   is rendered by [`crate::render::prompt`] (fuel- and size-bounded, off
//!   the executor, within [`PROMPT_RENDER_DEADLINE`]); its variables are the
//!   prompt's arguments, required when they have no default. A manifest
//!   prompt wins a name collision with a server's prompt.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use rmcp::ErrorData;
use rmcp::model::{
    CompleteRequestParams, CompleteResult, CompletionInfo, GetPromptRequestParams, GetPromptResult,
    JsonObject, Prompt, PromptArgument, PromptMessage, ReadResourceRequestParams,
    ReadResourceResult, Reference, Resource, ResourceContents, ResourceTemplate, Role,
};

use crate::mcp::client::catalog::ServerCatalog;
use crate::mcp::client::pool::{CallError, Pool};
use crate::mcp::{RESOURCE_URI_PREFIX, expands, resource_uri, split_resource_uri};
use crate::model::Manifest;

/// Longest a manifest prompt may take to render for `prompts/get`.
pub const PROMPT_RENDER_DEADLINE: Duration = Duration::from_secs(10);

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
        if self.pool.prefix() != crate::mcp::Prefix::OnConflict {
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
        for e in crate::mcp::expose(self.pool.prefix(), items, |n| seen.contains(n)) {
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
        if self.pool.prefix() == crate::mcp::Prefix::OnConflict {
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
            return crate::mcp::expose(crate::mcp::Prefix::OnConflict, items, ours)
                .into_iter()
                .find(|e| e.name == name)
                .map(|e| (e.server, e.own));
        }
        self.pool.catalogs().find_map(|(server, catalog)| {
            let prompt = name
                .strip_prefix(server.as_str())?
                .strip_prefix(crate::mcp::NAMESPACE_SEPARATOR)?;
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
