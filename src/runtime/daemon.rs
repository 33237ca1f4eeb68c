//! `npc daemon`: start the runtime, apply the manifest, then keep what runs
//! equal to it — reload on file changes (debounced) and on SIGHUP, answer
//! the control channel, and on SIGTERM/SIGINT stop every child and exit.

use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};

use super::watch::{DEBOUNCE, ManifestWatcher, next_burst};
use super::{ReloadOutcome, RepoPaths, Runtime, RuntimeError};
use crate::event::{DaemonStarted, Event, ReloadDamped};
use crate::surfaces::control::{self, Handler, Reply, Request};

/// Events replayed per page when a client asks for history.
pub const EVENTS_PAGE: usize = 1000;
/// Longest a follower waits on the store before looking again whether its
/// client is still there.
pub const FOLLOW_WAIT: Duration = Duration::from_secs(1);

/// Raise this process's soft limit of open files to its hard limit (a
/// flood of connections then meets the listeners' own caps long before the
/// descriptors run out). Returns the limit now in force.
pub fn raise_open_files_limit() -> Option<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return Some(hard);
    }
    Some(soft)
}

/// Put `/dev/null` on every standard descriptor (0, 1, 2) that is closed,
/// before the daemon opens anything: otherwise the first file it opens
/// (the lock, the database) becomes its stderr under `npc daemon 2>&-` and
/// receives its log lines. Writes to stderr then go nowhere, never panic.
pub fn fill_closed_std_fds() {
    use std::os::fd::{AsRawFd as _, IntoRawFd as _};
    const LAST_STD_FD: i32 = 2;
    while let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        if null.as_raw_fd() > LAST_STD_FD {
            break; // every standard descriptor is open; this one is closed on drop
        }
        // The lowest free descriptor was a standard one: keep it open.
        let _ = null.into_raw_fd();
    }
}

/// Run the daemon for the manifest at `manifest` until a stop signal.
/// `ready` is called once the first apply finished and the control socket
/// is up, with the REST API's URL when it listens and a URL that opens the
/// dashboard (a one-time code in it).
pub async fn run(
    manifest: &std::path::Path,
    ready: impl FnOnce(&RepoPaths, &ReloadOutcome, Option<&str>, Option<&str>),
) -> Result<(), RuntimeError> {
    raise_open_files_limit();
    let loaded = super::load_manifest(manifest)?;
    let Some(model) = loaded.manifest else {
        // Never `eprint!`: it panics when stderr is closed (`2>&-`).
        let mut err = std::io::stderr().lock();
        for d in &loaded.diagnostics {
            let _ = write!(err, "{d}");
        }
        return Err(RuntimeError::Invalid(manifest.to_path_buf()));
    };
    let paths = RepoPaths::resolve(manifest, &model.project.state_dir)?;
    let runtime = Runtime::for_repo(paths.clone(), crate::supervisor::BackoffPolicy::default())?;
    let mut hup = signal(SignalKind::hangup()).map_err(|source| RuntimeError::Repo {
        path: paths.root.clone(),
        source,
    })?;
    let mut term = signal(SignalKind::terminate()).map_err(|source| RuntimeError::Repo {
        path: paths.root.clone(),
        source,
    })?;
    let mut int = signal(SignalKind::interrupt()).map_err(|source| RuntimeError::Repo {
        path: paths.root.clone(),
        source,
    })?;

    runtime
        .emit(
            Event::DaemonStarted(DaemonStarted {
                pid: std::process::id(),
                repo: paths.root.clone(),
            }),
            None,
        )
        .await;
    // Bind before the first apply so a socket problem stops the start at
    // once; connections wait in the backlog until the first apply is done.
    let bound = control::bind(&control::socket_path(&paths.runtime_dir()))?;
    let (outcome, current) = runtime.reload("startup").await;

    let (changes_tx, mut changes_rx) = mpsc::unbounded_channel();
    let mut watcher = match ManifestWatcher::new(
        runtime.watch_set(current.as_ref()),
        runtime.written().clone(),
        changes_tx,
    ) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::error!("file watching is off: {e}");
            None
        }
    };
    // Answer only once the watcher is up: a client that saw the first
    // apply can edit the manifest and be sure the edit is seen.
    let (stop_tx, stop_rx) = watch::channel(false);
    let bound = bound
        .with_mcp(mcp_upgrade(runtime.clone()))
        .with_attach(attach_upgrade(runtime.panes().clone()));
    let server = tokio::spawn(bound.serve(handler(runtime.clone()), stop_rx.clone()));
    let services_stop = tokio_util::sync::CancellationToken::new();
    let api = super::api::start(&runtime, &model.daemon, services_stop.clone()).await;
    match crate::store::notices::default_dir() {
        Ok(dir) => super::notices::start(&runtime, dir, services_stop.clone()).await,
        Err(e) => tracing::warn!("notices of other repositories are off: {e}"),
    }
    let dashboard = runtime.dashboard_url();
    ready(&paths, &outcome, api.as_deref(), dashboard.as_deref());

    // After an operational failure the reload runs again by itself.
    let mut retry = Retry::after(&outcome);
    let mut damper = Damper::default();
    loop {
        let reason = tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = hup.recv() => "SIGHUP".to_string(),
            () = runtime.reload_failed() => {
                // A reload a control request started failed: retry it too.
                retry = retry.or_else(|| Some(Retry::first()));
                continue;
            }
            () = Retry::wait(&retry) => "retry after an operational failure".to_string(),
            burst = next_burst(&mut changes_rx, DEBOUNCE) => match burst {
                Some(paths) => {
                    let changed = paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
                    let (at, started) = damper.admit(tokio::time::Instant::now());
                    if started {
                        tracing::warn!("file changes start reloads in a loop ({changed}); at most one every {}s now", DAMPED_RELOAD_INTERVAL.as_secs());
                        runtime
                            .emit(
                                Event::ReloadDamped(ReloadDamped {
                                    reloads: RELOAD_LOOP_LIMIT,
                                    window_secs: RELOAD_LOOP_WINDOW.as_secs(),
                                    interval_secs: DAMPED_RELOAD_INTERVAL.as_secs(),
                                    changed: changed.clone(),
                                }),
                                None,
                            )
                            .await;
                    }
                    // Damped: wait, and take what changed meanwhile along.
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => {}
                        _ = term.recv() => break,
                        _ = int.recv() => break,
                    }
                    while changes_rx.try_recv().is_ok() {}
                    format!("changed: {changed}")
                }
                None => break,
            },
        };
        // A stop signal ends a reload in progress: nothing a manifest holds
        // can keep the daemon from stopping.
        let (outcome, manifest) = tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            done = runtime.reload(&reason) => done,
        };
        retry = match (&outcome, retry) {
            (ReloadOutcome::Failed { .. }, Some(r)) => Some(r.next()),
            (outcome, _) => Retry::after(outcome),
        };
        if let (Some(w), Some(m)) = (watcher.as_mut(), manifest.as_ref())
            && let Err(e) = w.update(runtime.watch_set(Some(m)))
        {
            tracing::warn!("{e}");
        }
    }
    let _ = stop_tx.send(true);
    services_stop.cancel();
    let _ = server.await;
    drop(watcher);
    runtime.shutdown().await;
    Ok(())
}

/// Reloads file changes may start within [`RELOAD_LOOP_WINDOW`] before the
/// watcher's reloads are damped (a loop: something that changes with every
/// reload, whatever its cause).
pub const RELOAD_LOOP_LIMIT: usize = 10;
/// The window [`RELOAD_LOOP_LIMIT`] counts in; quiet this long ends damping.
pub const RELOAD_LOOP_WINDOW: Duration = Duration::from_secs(10);
/// While damped, at most one reload from file changes this often.
pub const DAMPED_RELOAD_INTERVAL: Duration = Duration::from_secs(10);

/// Counts the reloads file changes start and damps a loop of them.
#[derive(Debug, Default)]
struct Damper {
    recent: std::collections::VecDeque<tokio::time::Instant>,
    /// Damping now (one `reload.damped` event per episode).
    damped: bool,
}

impl Damper {
    /// A reload from file changes is due now: when it may run, and whether
    /// damping just started.
    fn admit(&mut self, now: tokio::time::Instant) -> (tokio::time::Instant, bool) {
        let quiet_since = self.recent.back().copied();
        if quiet_since.is_some_and(|t| now.duration_since(t) >= RELOAD_LOOP_WINDOW) {
            self.recent.clear();
            self.damped = false;
        }
        while self
            .recent
            .front()
            .is_some_and(|t| now.duration_since(*t) >= RELOAD_LOOP_WINDOW)
        {
            self.recent.pop_front();
        }
        let started = !self.damped && self.recent.len() >= RELOAD_LOOP_LIMIT;
        self.damped |= started;
        let at = match (self.damped, self.recent.back()) {
            (true, Some(last)) => (*last + DAMPED_RELOAD_INTERVAL).max(now),
            _ => now,
        };
        self.recent.push_back(at);
        (at, started)
    }
}

/// First wait before a reload that failed for an operational reason runs again.
pub const RETRY_INITIAL: Duration = Duration::from_millis(250);
/// Longest wait between retries of a failing reload.
pub const RETRY_MAX: Duration = Duration::from_secs(30);

/// When the next retry of a failed reload runs.
#[derive(Debug, Clone, Copy)]
struct Retry {
    at: tokio::time::Instant,
    pause: Duration,
}

impl Retry {
    /// The first retry after `outcome`, if it was an operational failure.
    fn after(outcome: &ReloadOutcome) -> Option<Self> {
        matches!(outcome, ReloadOutcome::Failed { .. }).then(Self::first)
    }

    /// The first retry, [`RETRY_INITIAL`] from now.
    fn first() -> Self {
        Self {
            at: tokio::time::Instant::now() + RETRY_INITIAL,
            pause: RETRY_INITIAL,
        }
    }

    /// The retry after this one failed too: twice the pause, up to [`RETRY_MAX`].
    fn next(self) -> Self {
        let pause = (self.pause * 2).min(RETRY_MAX);
        Self {
            at: tokio::time::Instant::now() + pause,
            pause,
        }
    }

    /// Resolves when the retry is due; never without one.
    async fn wait(retry: &Option<Self>) {
        match retry {
            Some(r) => tokio::time::sleep_until(r.at).await,
            None => std::future::pending().await,
        }
    }
}

/// Serve the daemon's gateway on an upgraded control connection: every
/// `npc mcp serve` in front of this daemon is one such session.
fn mcp_upgrade(runtime: Arc<Runtime>) -> control::Upgrade {
    let gateway = runtime.mcp().gateway();
    Arc::new(move |request, read, write| {
        let gateway = gateway.clone();
        let run = match &request {
            // A sandboxed run's gateway speaks for its run only with the
            // run's secret (else another run's id would be a forgery).
            Request::Mcp {
                run,
                secret,
                confined,
                ..
            } => run.clone().filter(|r| {
                crate::runs::workspace::is_run_id(r)
                    && (!confined
                        || secret.as_ref().is_some_and(|s| {
                            crate::runs::sandbox::secret_is_the_runs(
                                &runtime.paths().state_dir,
                                r,
                                s,
                            )
                        }))
            }),
            _ => None,
        };
        let asking = session_asking(&runtime, request, run.clone());
        Box::pin(async move {
            let within = Some(control::MCP_INIT_TIMEOUT);
            let session = crate::mcp::server::session::serve(gateway, read, write, within);
            let session = crate::mcp::call::for_run(run, asking.scope(session));
            if let Err(e) = session.await {
                tracing::debug!("an MCP session over the control socket ended: {e}");
            }
        })
    })
}

/// Whom the calls of an MCP session ask, from its upgrading request: the
/// named `npc acp` (a valid route only) and the named profile's
/// `ask_tools` in the applied manifest (an unknown profile has none).
fn session_asking(
    runtime: &Runtime,
    request: Request,
    run: Option<String>,
) -> crate::hooks::SessionAsking {
    let Request::Mcp {
        approval, profile, ..
    } = request
    else {
        return crate::hooks::SessionAsking::default();
    };
    let editor = approval
        .filter(|route| route.check().is_ok())
        .and_then(|route| crate::hooks::approve::SocketApprover::new(route.socket, route.session))
        .map(|a| Arc::new(a) as Arc<dyn crate::hooks::Approve>);
    // Else a run's ask parks the run until a person answers this daemon;
    // outside a run nobody can be asked (a recorded denial).
    let approver = editor.or_else(|| {
        Some(match (run, runtime.runs().manifest()) {
            (Some(run), Some(manifest)) => Arc::new(crate::hooks::park::ParkApprover::new(
                runtime.store().clone(),
                Some(runtime.bus().clone()),
                run,
                profile.clone(),
                manifest,
                Arc::new(|| Ok(())),
            )) as Arc<dyn crate::hooks::Approve>,
            (run, _) => Arc::new(crate::hooks::park::NoOneToAsk {
                bus: Some(runtime.bus().clone()),
                run_id: run,
                profile: profile.clone(),
                why: "this MCP session serves no npc run and no editor, so nobody can be asked; run the agent through `npc run`, a trigger or `npc acp`, or change the rule that asks".to_string(),
            }),
        })
    });
    let policy = profile.and_then(|name| {
        let manifest = runtime.runs().manifest()?;
        crate::hooks::policy::ToolPolicy::for_profile(&manifest, &name).map(Arc::new)
    });
    crate::hooks::SessionAsking { approver, policy }
}

/// The reply to an answer of run `id`'s approval from the command line.
async fn answered(
    runtime: &Runtime,
    id: &str,
    approval: Option<String>,
    answer: crate::store::approvals::Answer,
) -> Reply {
    match runtime.answer_run(id, approval, answer, "cli").await {
        Ok(row) => Reply::Answered {
            run_id: row.run_id,
            approval_id: row.id,
            tool: row.tool,
            state: row.state,
        },
        Err(e) => Reply::error(e.to_string()),
    }
}

/// Serve `npc pane attach` on an upgraded control connection.
fn attach_upgrade(panes: crate::panes::PaneHost) -> control::AttachUpgrade {
    Arc::new(move |request, read, write| {
        let panes = panes.clone();
        Box::pin(async move {
            if let Request::PaneAttach { name, rows, cols } = request {
                crate::panes::attach::serve(panes, name, rows, cols, read, write).await;
            }
        })
    })
}

/// The answer to a pane request: its reply or the error.
fn pane_answer(result: Result<Reply, crate::panes::PaneError>) -> Reply {
    result.unwrap_or_else(|e| Reply::error(e.to_string()))
}

/// Each of `items` as JSON (views an engine owns; the channel carries them).
fn as_json<T: serde::Serialize>(items: &[T]) -> Vec<serde_json::Value> {
    items
        .iter()
        .filter_map(|item| serde_json::to_value(item).ok())
        .collect()
}

/// Queue a run a local front end asked for: its id or the error.
async fn start_local(
    runtime: &Runtime,
    origin: crate::runs::Origin,
    run: crate::surfaces::runs::LocalRun,
) -> Reply {
    match runtime.runs().start_local(origin, run).await {
        Ok(run_id) => Reply::RunQueued { run_id },
        Err(e) => Reply::error(e.to_string()),
    }
}

/// Answer control requests from the runtime.
fn handler(runtime: Arc<Runtime>) -> Handler {
    Arc::new(move |request, tx| {
        let runtime = runtime.clone();
        Box::pin(async move {
            match request {
                Request::Status => {
                    let status = super::api::status_reply(&runtime).await;
                    let _ = tx.send(Reply::Status(Box::new(status))).await;
                }
                Request::State => {
                    let components = runtime.observed().await;
                    let _ = tx.send(Reply::State { components }).await;
                }
                Request::Apply { fingerprint } => {
                    let (outcome, _) = runtime
                        .reload_checked("npc apply", fingerprint.as_deref())
                        .await;
                    let _ = tx.send(Reply::Apply { outcome }).await;
                }
                Request::PaneList => {
                    let panes = as_json(&runtime.panes().list());
                    let _ = tx.send(Reply::Panes { panes }).await;
                }
                Request::PaneOpen { name } => {
                    let answer = runtime
                        .panes()
                        .open(&name)
                        .await
                        .map(|info| Reply::PaneOpened {
                            opened: serde_json::to_value(info).unwrap_or_default(),
                        });
                    let _ = tx.send(pane_answer(answer)).await;
                }
                Request::PaneClose { name } => {
                    let answer = runtime
                        .panes()
                        .close(&name)
                        .await
                        .map(|()| Reply::PaneClosed { closed: name });
                    let _ = tx.send(pane_answer(answer)).await;
                }
                Request::PaneSend { name, text } => {
                    let answer = runtime
                        .panes()
                        .user_input(&name, text.as_bytes())
                        .map(|()| Reply::PaneSent { sent: text.len() });
                    let _ = tx.send(pane_answer(answer)).await;
                }
                Request::PaneAttach { .. } => {
                    // Served by `attach_upgrade` before a handler runs.
                    let _ = tx.send(Reply::error("this connection cannot attach")).await;
                }
                Request::Triggers => {
                    let views = runtime.triggers().views();
                    let triggers = as_json(&views);
                    let _ = tx.send(Reply::Triggers { triggers }).await;
                }
                Request::FireTrigger { name, payload } => {
                    let payload = payload.unwrap_or(serde_json::Value::Null);
                    let answer = match runtime.triggers().fire(&name, payload).await {
                        Ok(accepted) => Reply::Fired {
                            fired: serde_json::to_value(&accepted).unwrap_or_default(),
                        },
                        Err(e) => Reply::error(e.to_string()),
                    };
                    let _ = tx.send(answer).await;
                }
                Request::AcpRun { run } => {
                    let answer = start_local(&runtime, crate::runs::Origin::Acp, run).await;
                    let _ = tx.send(answer).await;
                }
                Request::Run { run } => {
                    let answer = start_local(&runtime, crate::runs::Origin::Cli, run).await;
                    let _ = tx.send(answer).await;
                }
                Request::DashboardUrl => {
                    let answer = match runtime.dashboard_url() {
                        Some(url) => Reply::DashboardUrl { url },
                        None => Reply::error(
                            "the daemon serves no API; see its `api.failed` event (`npc events`) and `daemon.listen`",
                        ),
                    };
                    let _ = tx.send(answer).await;
                }
                Request::WorkflowRun { name, inputs } => {
                    let started = runtime
                        .workflows()
                        .start(
                            &name,
                            inputs,
                            serde_json::Value::Null,
                            crate::model::RunOrigin::Cli,
                        )
                        .await;
                    let answer = match started {
                        Ok(workflow_run) => Reply::WorkflowStarted { workflow_run },
                        Err(e) => Reply::error(e.to_string()),
                    };
                    let _ = tx.send(answer).await;
                }
                Request::WorkflowCancel { id } => {
                    let answer = match runtime.workflows().cancel(&id).await {
                        Ok(state) => Reply::WorkflowCancelled {
                            workflow_run: id,
                            state,
                        },
                        Err(e) => Reply::error(e.to_string()),
                    };
                    let _ = tx.send(answer).await;
                }
                Request::CancelRun { id } => {
                    let answer = match runtime.runs().cancel(&id).await {
                        Ok(state) => Reply::Cancelled { run_id: id, state },
                        Err(e) => Reply::error(e.to_string()),
                    };
                    let _ = tx.send(answer).await;
                }
                Request::ApproveRun {
                    id,
                    always,
                    approval,
                } => {
                    let answer = crate::store::approvals::Answer::Allow { always };
                    let _ = tx
                        .send(answered(&runtime, &id, approval, answer).await)
                        .await;
                }
                Request::DenyRun {
                    id,
                    approval,
                    reason,
                } => {
                    let answer = crate::store::approvals::Answer::Deny { reason };
                    let _ = tx
                        .send(answered(&runtime, &id, approval, answer).await)
                        .await;
                }
                Request::Mcp { .. } => {
                    // Served by `mcp_upgrade` before a handler runs.
                    let _ = tx
                        .send(Reply::error("this connection cannot be upgraded to MCP"))
                        .await;
                }
                Request::Events { since, follow } => {
                    // The store is the one stream of a repository: it holds
                    // the daemon's events and those `npc run` writes itself,
                    // so a follower tails its rows by id.
                    let mut after = since.unwrap_or(0);
                    loop {
                        let store = runtime.store().clone();
                        let page = tokio::task::spawn_blocking(move || {
                            if follow {
                                store.wait_for_events_after(after, EVENTS_PAGE, FOLLOW_WAIT)
                            } else {
                                store.events_since(after, EVENTS_PAGE)
                            }
                        })
                        .await;
                        let Ok(Ok(page)) = page else { return };
                        if page.is_empty() && !follow {
                            return;
                        }
                        for event in &page {
                            after = event.id;
                            let event = serde_json::to_value(event).unwrap_or_default();
                            if tx.send(Reply::Event { event }).await.is_err() {
                                return;
                            }
                        }
                        if tx.is_closed() {
                            return;
                        }
                    }
                }
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loop_of_reloads_is_damped_once_and_quiet_ends_it() {
        let start = tokio::time::Instant::now();
        let mut damper = Damper::default();
        let mut started = 0;
        let mut times = Vec::new();
        for i in 0..RELOAD_LOOP_LIMIT + 3 {
            let now = start + Duration::from_millis(100 * i as u64);
            let (at, new) = damper.admit(now);
            started += usize::from(new);
            times.push(at);
        }
        assert_eq!(started, 1, "one event per episode");
        // Up to the limit the reloads run at once; then one per interval.
        assert!(
            times[..RELOAD_LOOP_LIMIT]
                .iter()
                .enumerate()
                .all(|(i, t)| *t == start + Duration::from_millis(100 * i as u64))
        );
        for pair in times[RELOAD_LOOP_LIMIT..].windows(2) {
            assert_eq!(pair[1] - pair[0], DAMPED_RELOAD_INTERVAL);
        }
        // Quiet for a window after the last: back to normal.
        let later = *times.last().unwrap() + RELOAD_LOOP_WINDOW;
        assert_eq!(damper.admit(later), (later, false));
    }
}
