//! The daemon's side of `npc pane attach`: after the upgrade answer, the
//! pane's scrollback and then its raw output go to the client as they come;
//! the client's lines (`AttachInput`: typed bytes, terminal size) go to the
//! pane through the host's user-input path. Several clients may attach to
//! one pane; a client that falls [`super::pane::ATTACH_QUEUE`] chunks behind
//! is told how many it missed instead of holding memory.

use tokio::io::{
    AsyncBufRead, AsyncBufReadExt as _, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _,
};
use tokio::sync::broadcast::error::RecvError;

use super::PaneHost;
use crate::surfaces::control::{AttachInput, write_line};

/// Longest client line: hex of the largest input plus the JSON around it.
pub const MAX_ATTACH_LINE: usize = 2 * super::MAX_USER_INPUT_BYTES + 64;

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
    } = match host.attach(&name) {
        Ok(attached) => attached,
        Err(e) => {
            let _ = write_line(&mut write, &serde_json::json!({ "error": e.to_string() })).await;
            return;
        }
    };
    if rows > 0 && cols > 0 {
        let _ = pane.resize(rows, cols);
    }
    let answer =
        serde_json::json!({ "attached": name, "generation": pane.generation, "status": status });
    if write_line(&mut write, &answer).await.is_err() || write.write_all(&snapshot).await.is_err() {
        return;
    }
    let _ = write.flush().await;
    let input = async {
        let mut line = Vec::new();
        loop {
            line.clear();
            let mut limited = (&mut read).take(MAX_ATTACH_LINE as u64 + 1);
            match limited.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => return,
                Ok(_) if line.len() > MAX_ATTACH_LINE => return,
                Ok(_) => {}
            }
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
        loop {
            match output.recv().await {
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
            }
        }
    };
    tokio::select! {
        () = input => {}
        () = output => {}
    }
    let _ = write.shutdown().await;
}
