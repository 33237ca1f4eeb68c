//! The daemon's side of `npc pane attach`: after the upgrade answer, the
//! pane's scrollback and then its raw output go to the client as they come;
//! the client's lines (`AttachInput`: typed bytes, terminal size) go to the
//! pane through the host's user-input path. Several clients may attach to
//! one pane; a client that falls [`super::pane::ATTACH_QUEUE`] chunks behind
//! is told how many it missed instead of holding memory. The pane's status
//! reports (cached at attach, then live) reach the client in band as the
//! terminal's title (OSC 2), which adds no row and no overlay, so the PTY's
//! geometry never changes; the text is the plugin's, so every control
//! character is dropped and its length bounded.

use tokio::io::{AsyncBufRead, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::broadcast::error::RecvError;

use super::PaneHost;
use crate::surfaces::control::{AttachInput, Reply, write_line};

/// Longest client line: hex of the largest input plus the JSON around it.
pub const MAX_ATTACH_LINE: usize = 2 * super::MAX_USER_INPUT_BYTES + 64;
/// Longest terminal title a status report becomes, in characters.
pub const MAX_TITLE_CHARS: usize = 200;

/// The OSC 2 sequence that shows pane `name`'s status `report` as the
/// terminal title (just the pane's name once the report is cancelled).
pub fn status_title(name: &str, report: Option<&serde_json::Value>) -> Vec<u8> {
    let state = report
        .and_then(|r| r["state"].as_str())
        .unwrap_or("cancelled");
    let mut title = format!("npc: {name}");
    if state != "cancelled" {
        title.push_str(&format!(" [{state}"));
        if let Some(detail) = report.and_then(|r| r["detail"].as_str()) {
            title.push_str(&format!(": {detail}"));
        }
        title.push(']');
    }
    let clean: String = title
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_TITLE_CHARS)
        .collect();
    format!("\x1b]2;{clean}\x07").into_bytes()
}

/// Serve one attached client of pane `name` until either side ends.
pub async fn serve(
    host: PaneHost,
    name: String,
    rows: u16,
    cols: u16,
    mut read: impl AsyncBufRead + Unpin,
    mut write: impl AsyncWrite + Unpin,
) {
    let super::host::Attached {
        scrollback: snapshot,
        mut output,
        pane,
        status,
        statuses,
    } = match host.attach(&name) {
        Ok(attached) => attached,
        Err(e) => {
            let _ = write_line(&mut write, &Reply::error(e.to_string())).await;
            return;
        }
    };
    if rows > 0 && cols > 0 {
        let _ = pane.resize(rows, cols);
    }
    let answer = Reply::Attached {
        attached: name.clone(),
        generation: pane.generation,
        status: status.clone(),
    };
    if write_line(&mut write, &answer).await.is_err() || write.write_all(&snapshot).await.is_err() {
        return;
    }
    if status.is_some()
        && write
            .write_all(&status_title(&name, status.as_ref()))
            .await
            .is_err()
    {
        return;
    }
    let _ = write.flush().await;
    let input = async {
        use crate::stdx::lines::{Line, LineReader, Overlong, Splitter};
        let mut lines = LineReader::new(&mut read, Splitter::new(MAX_ATTACH_LINE, Overlong::Stop));
        loop {
            let line = match lines.next().await {
                Ok(Some(Line::Line(line))) => line,
                _ => return,
            };
            match serde_json::from_slice::<AttachInput>(&line) {
                Ok(AttachInput::Input(hex)) => {
                    if let Ok(bytes) = hex::decode(hex.trim())
                        && host.user_input(&name, &bytes).is_err()
                    {
                        return;
                    }
                }
                Ok(AttachInput::Resize { rows, cols }) if rows > 0 && cols > 0 => {
                    let _ = pane.resize(rows, cols);
                }
                _ => {}
            }
        }
    };
    let output = async {
        let mut statuses = Some(statuses);
        loop {
            let next_status = async {
                match statuses.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                chunk = output.recv() => match chunk {
                    Ok(bytes) if bytes.is_empty() => return, // the pane's output ended
                    Ok(bytes) => {
                        if write.write_all(&bytes).await.is_err() || write.flush().await.is_err() {
                            return;
                        }
                    }
                    Err(RecvError::Lagged(n)) => {
                        let note = format!("\r\n[npc: {n} chunks of output skipped]\r\n");
                        if write.write_all(note.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                    Err(RecvError::Closed) => return,
                },
                update = next_status => match update {
                    Ok(update) if update.pane == name => {
                        let title = status_title(&name, Some(&update.report));
                        if write.write_all(&title).await.is_err() || write.flush().await.is_err() {
                            return;
                        }
                    }
                    Ok(_) | Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => statuses = None,
                },
            }
        }
    };
    tokio::select! {
        () = input => {}
        () = output => {}
    }
    let _ = write.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_title_is_one_clean_bounded_osc_sequence() {
        let report = serde_json::json!({
            "state": "needs_attention",
            "detail": format!("limit\x1b]2;evil\x07\n{}", "x".repeat(500)),
        });
        let title = status_title("one", Some(&report));
        let text = String::from_utf8(title).unwrap();
        let inner = text
            .strip_prefix("\x1b]2;")
            .unwrap()
            .strip_suffix('\x07')
            .unwrap();
        assert!(inner.starts_with("npc: one [needs_attention: limit]2;evil"));
        assert!(!inner.chars().any(char::is_control));
        assert_eq!(inner.chars().count(), MAX_TITLE_CHARS);
        let cleared = status_title("one", Some(&serde_json::json!({ "state": "cancelled" })));
        assert_eq!(cleared, b"\x1b]2;npc: one\x07");
    }
}
