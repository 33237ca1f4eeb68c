//! `npc daemon`: start the runtime, apply the manifest, then keep what runs
//! equal to it — reload on file changes (debounced) and on SIGHUP, answer
//! the control channel, and on SIGTERM/SIGINT stop every child and exit.

use std::sync::Arc;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};

use super::watch::{DEBOUNCE, ManifestWatcher, next_burst};
use super::{ReloadOutcome, RepoPaths, Runtime, RuntimeError};
use crate::surfaces::control::{self, Handler, Request};

/// Events replayed per page when a client asks for history.
pub const EVENTS_PAGE: usize = 1000;

/// Run the daemon for the manifest at `manifest` until a stop signal.
/// `ready` is called once the first apply finished and the control socket is up.
pub async fn run(
    manifest: &std::path::Path,
    ready: impl FnOnce(&RepoPaths, &ReloadOutcome),
) -> Result<(), RuntimeError> {
    let loaded = super::load_manifest(manifest)?;
    let Some(model) = loaded.manifest else {
        for d in &loaded.diagnostics {
            eprint!("{d}");
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
            "daemon.started",
            None,
            serde_json::json!({ "pid": std::process::id(), "repo": paths.root }),
        )
        .await;
    // Bind before the first apply so a socket problem stops the start at
    // once; connections wait in the backlog until the first apply is done.
    let bound = control::bind(&control::socket_path(&paths.runtime_dir()))?;
    let (outcome, current) = runtime.reload("startup").await;

    let (stop_tx, stop_rx) = watch::channel(false);
    let server = tokio::spawn(bound.serve(handler(runtime.clone()), stop_rx.clone()));

    let (changes_tx, mut changes_rx) = mpsc::unbounded_channel();
    let mut watcher = match ManifestWatcher::new(runtime.watch_set(current.as_ref()), changes_tx) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::error!("file watching is off: {e}");
            None
        }
    };
    ready(&paths, &outcome);

    loop {
        let reason = tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = hup.recv() => "SIGHUP".to_string(),
            burst = next_burst(&mut changes_rx, DEBOUNCE) => match burst {
                Some(paths) => format!("changed: {}", paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")),
                None => break,
            },
        };
        let (_, manifest) = runtime.reload(&reason).await;
        if let (Some(w), Some(m)) = (watcher.as_mut(), manifest.as_ref())
            && let Err(e) = w.update(runtime.watch_set(Some(m)))
        {
            tracing::warn!("{e}");
        }
    }
    let _ = stop_tx.send(true);
    let _ = server.await;
    drop(watcher);
    runtime.shutdown().await;
    Ok(())
}

/// Answer control requests from the runtime.
fn handler(runtime: Arc<Runtime>) -> Handler {
    Arc::new(move |request, tx| {
        let runtime = runtime.clone();
        Box::pin(async move {
            match request {
                Request::Status => {
                    let _ = tx.send(serde_json::json!({ "pid": std::process::id(), "components": runtime.status().await })).await;
                }
                Request::State => {
                    let _ = tx
                        .send(
                            serde_json::to_value(super::encode_state(&runtime.observed().await))
                                .unwrap_or_default(),
                        )
                        .await;
                }
                Request::Apply => {
                    let (outcome, _) = runtime.reload("npc apply").await;
                    let _ = tx
                        .send(serde_json::to_value(&outcome).unwrap_or_default())
                        .await;
                }
                Request::Events { since, follow } => {
                    let since = since.unwrap_or(0);
                    if follow {
                        let Ok(mut rx) = runtime.bus().follow(since) else {
                            return;
                        };
                        while let Some(event) = rx.recv().await {
                            if tx
                                .send(serde_json::to_value(&*event).unwrap_or_default())
                                .await
                                .is_err()
                            {
                                return;
                            }
                        }
                    } else {
                        let mut after = since;
                        loop {
                            let Ok(page) = runtime.store().events_since(after, EVENTS_PAGE) else {
                                return;
                            };
                            let Some(last) = page.last() else { return };
                            after = last.id;
                            for event in &page {
                                if tx
                                    .send(serde_json::to_value(event).unwrap_or_default())
                                    .await
                                    .is_err()
                                {
                                    return;
                                }
                            }
                        }
                    }
                }
            }
        })
    })
}
