//! An upstream server's resources, resource templates and prompts, as the
//! pool's session with it knows them: fetched at connect into its
//! [`ServerCatalog`] (only what the server's capabilities offer, at most
//! [`MAX_LIST_PAGES`] pages and [`MAX_ITEMS_PER_LIST`] items a list) and
//! refetched on `notifications/resources/list_changed` /
//! `notifications/prompts/list_changed` (coalesced, like tool lists), each
//! change announced as a [`CatalogChange`]. What the gateway's clients see of
//! them, under which names, is `server::catalog`'s.

use std::future::Future;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, RwLock};

use rmcp::model::{PaginatedRequestParams, Prompt, Resource, ResourceTemplate};
use rmcp::{Peer, RoleClient};
use tokio::sync::broadcast;

use crate::mcp::expands;
use crate::mcp::passthrough::LIST_CHANGED_DEBOUNCE;
use crate::stdx::{read, write};

/// Most pages fetched of one list (resources, templates, prompts) of one server.
pub const MAX_LIST_PAGES: usize = 64;
/// Most items kept of one list of one server; the rest are left out (logged).
pub const MAX_ITEMS_PER_LIST: usize = 1024;

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

    pub fn lists_resource(&self, uri: &str) -> bool {
        read(&self.resources).iter().any(|r| r.uri == uri)
    }

    pub fn lists_template(&self, uri_template: &str) -> bool {
        read(&self.templates)
            .iter()
            .any(|t| t.uri_template == uri_template)
    }

    pub fn expands_template(&self, uri: &str) -> bool {
        read(&self.templates)
            .iter()
            .any(|t| expands(&t.uri_template, uri))
    }

    pub fn lists_prompt(&self, name: &str) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

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
