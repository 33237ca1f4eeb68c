//! The approval channel: how a `before_tool` hook's `ask`, decided inside
//! an agent CLI's own hook (`npc hook run`, a grandchild of `npc acp`),
//! reaches the editor attached to `npc acp`. `npc acp` binds one abstract
//! Unix socket with an unguessable name ([`bind`]) and passes the name and
//! the session id to the agent in its environment ([`APPROVAL_SOCKET_ENV`],
//! [`APPROVAL_SESSION_ENV`]); `npc hook run` connects ([`SocketApprover`]),
//! writes one [`Question`] line and reads one [`Answer`] line. Only peers
//! with `npc acp`'s uid are answered, and only a listener of the asker's
//! own uid is asked; frames are bounded
//! ([`MAX_FRAME_BYTES`]) and so are connections ([`MAX_CONNECTIONS`]).
//! Every failure on the asking side is a denial (fail closed).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt as _;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};

/// A failed `accept` (out of descriptors, say) is tried again after this.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// Environment variable carrying the approval socket's abstract name.
pub const APPROVAL_SOCKET_ENV: &str = "NPC_ACP_APPROVAL_SOCKET";
/// Environment variable carrying the ACP session the agent runs for.
pub const APPROVAL_SESSION_ENV: &str = "NPC_ACP_SESSION";
/// Prefix of the socket's abstract name (then 32 random hex digits).
pub const SOCKET_NAME_PREFIX: &str = "npc-acp-approval-";
/// Largest question or answer line: a hook's whole input plus room for the envelope.
pub const MAX_FRAME_BYTES: usize = 2 * 1024 * 1024 + 64 * 1024;
/// Connections served at once; more wait in the kernel's backlog.
pub const MAX_CONNECTIONS: usize = 32;
/// How long a connected peer has to send its question.
pub const QUESTION_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the asking side waits for the user's answer.
pub const ANSWER_WAIT_LIMIT: Duration = Duration::from_secs(10 * 60);

/// A tool call as hooks see it (`payload.tool_call`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallInfo {
    pub id: String,
    pub name: String,
    /// A JSON object (or `null` when the call had none).
    pub arguments: serde_json::Value,
}

/// A tool call a `before_tool` hook wants the user to approve.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    /// The asking hook's label (`hooks::HookEntry::label`).
    pub hook: String,
    /// Why the hook asks (shown to the user), if it said.
    pub reason: Option<String>,
    /// The call, with the arguments earlier hooks rewrote.
    pub tool_call: ToolCallInfo,
}

/// What `npc hook run` asks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Question {
    /// The ACP session the agent runs for ([`APPROVAL_SESSION_ENV`]).
    pub session: String,
    #[serde(flatten)]
    pub request: ApprovalRequest,
}

/// The user's decision, as sent back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum Answer {
    Allow,
    Deny { reason: String },
}

/// One question waiting for the user, with where its answer goes.
pub type Asked = (Question, oneshot::Sender<Answer>);

/// A bound approval socket.
#[derive(Debug)]
pub struct ApprovalListener {
    name: String,
    listener: UnixListener,
}

/// Bind a new abstract socket with a random name. Needs a tokio runtime.
pub fn bind() -> std::io::Result<ApprovalListener> {
    use std::os::linux::net::SocketAddrExt as _;
    let mut random = [0u8; 16];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut random)?;
    let name = format!("{SOCKET_NAME_PREFIX}{}", hex::encode(random));
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(&name)?;
    let std_listener = std::os::unix::net::UnixListener::bind_addr(&addr)?;
    std_listener.set_nonblocking(true)?;
    Ok(ApprovalListener {
        name,
        listener: UnixListener::from_std(std_listener)?,
    })
}

impl ApprovalListener {
    /// The abstract name (for [`APPROVAL_SOCKET_ENV`]).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Serve until `asked` closes: each question goes to `asked`, its answer
    /// back to the peer. A peer of another uid, an oversized or invalid
    /// question, or a question not sent within [`QUESTION_TIMEOUT`] gets a
    /// denial.
    pub async fn serve(self, asked: mpsc::Sender<Asked>) {
        let uid = nix::unistd::getuid().as_raw();
        let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        loop {
            let permit = tokio::select! {
                () = asked.closed() => return,
                permit = slots.clone().acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => return,
                },
            };
            let stream = tokio::select! {
                () = asked.closed() => return,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::warn!("acp approvals: accept failed: {e}");
                        tokio::time::sleep(ACCEPT_RETRY).await;
                        continue;
                    }
                },
            };
            let asked = asked.clone();
            tokio::spawn(async move {
                let _permit = permit;
                let same_user = stream.peer_cred().map(|c| c.uid()).ok() == Some(uid);
                serve_one(stream, same_user, asked).await;
            });
        }
    }
}

async fn serve_one(stream: UnixStream, same_user: bool, asked: mpsc::Sender<Asked>) {
    let (read, mut write) = stream.into_split();
    let answer = if same_user {
        match tokio::time::timeout(QUESTION_TIMEOUT, read_frame::<Question>(read)).await {
            Ok(Ok(question)) => {
                let (tx, rx) = oneshot::channel();
                if asked.send((question, tx)).await.is_err() {
                    deny("`npc acp` is shutting down")
                } else {
                    rx.await
                        .unwrap_or_else(|_| deny("the editor gave no answer"))
                }
            }
            Ok(Err(e)) => deny(&e.to_string()),
            Err(_) => deny("no question arrived in time"),
        }
    } else {
        deny("the approval socket answers only its own user")
    };
    let mut line = serde_json::to_vec(&answer).unwrap_or_default();
    line.push(b'\n');
    let _ = write.write_all(&line).await;
}

fn deny(reason: &str) -> Answer {
    Answer::Deny {
        reason: reason.to_string(),
    }
}

/// Why asking failed (always answered as a denial).
#[derive(Debug, thiserror::Error)]
pub enum ApprovalError {
    #[error("cannot reach `npc acp`'s approval socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("the approval frame is larger than {MAX_FRAME_BYTES} bytes")]
    TooLarge,
    #[error("the approval frame is not valid: {0}")]
    Invalid(#[from] serde_json::Error),
    #[error("no answer from the editor within {}s", ANSWER_WAIT_LIMIT.as_secs())]
    Timeout,
    #[error("the approval socket belongs to another user; only your own `npc acp` is asked")]
    OtherUser,
}

/// Read one newline-terminated JSON frame of at most [`MAX_FRAME_BYTES`].
async fn read_frame<T: for<'de> Deserialize<'de>>(
    read: impl tokio::io::AsyncRead + Unpin,
) -> Result<T, ApprovalError> {
    use crate::stdx::lines::{Line, LineReader, Overlong, Splitter};
    let mut reader = LineReader::new(read, Splitter::new(MAX_FRAME_BYTES, Overlong::Stop));
    match reader.next().await? {
        Some(Line::Line(line)) => Ok(serde_json::from_slice(&line)?),
        Some(_) => Err(ApprovalError::TooLarge),
        None => Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into()),
    }
}

/// Ask the `npc acp` listening on abstract socket `name`.
pub async fn ask(name: &str, question: &Question) -> Result<Answer, ApprovalError> {
    use std::os::linux::net::SocketAddrExt as _;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
    let std_stream = std::os::unix::net::UnixStream::connect_addr(&addr)?;
    std_stream.set_nonblocking(true)?;
    let stream = UnixStream::from_std(std_stream)?;
    // Abstract names are shared by every user of the network namespace:
    // only an `npc acp` of this user may answer (the name may come from a
    // queued run read back from the repository's store).
    if stream.peer_cred()?.uid() != nix::unistd::getuid().as_raw() {
        return Err(ApprovalError::OtherUser);
    }
    let mut line = serde_json::to_vec(question)?;
    if line.len() > MAX_FRAME_BYTES {
        return Err(ApprovalError::TooLarge);
    }
    line.push(b'\n');
    let (read, mut write) = stream.into_split();
    write.write_all(&line).await?;
    tokio::time::timeout(ANSWER_WAIT_LIMIT, read_frame(read))
        .await
        .map_err(|_| ApprovalError::Timeout)?
}

/// Whether `name` is an approval socket name [`bind`] makes.
pub fn valid_name(name: &str) -> bool {
    name.strip_prefix(SOCKET_NAME_PREFIX)
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn question() -> Question {
        Question {
            session: "s1".into(),
            request: ApprovalRequest {
                hook: "before_tool[0]".into(),
                reason: Some("why".into()),
                tool_call: ToolCallInfo {
                    id: "c".into(),
                    name: "Bash".into(),
                    arguments: serde_json::json!({"command": "ls"}),
                },
            },
        }
    }

    #[tokio::test]
    async fn a_question_reaches_the_listener_and_its_answer_comes_back() {
        let listener = bind().unwrap();
        let name = listener.name().to_string();
        let (tx, mut rx) = mpsc::channel::<Asked>(4);
        tokio::spawn(listener.serve(tx));
        let answering = tokio::spawn(async move {
            let (q, reply) = rx.recv().await.unwrap();
            let _ = reply.send(Answer::Deny {
                reason: "no".into(),
            });
            q
        });
        let answer = ask(&name, &question()).await.unwrap();
        assert_eq!(
            answer,
            Answer::Deny {
                reason: "no".into()
            }
        );
        assert_eq!(answering.await.unwrap(), question());
    }

    #[tokio::test]
    async fn garbage_and_oversized_questions_are_denied() {
        let listener = bind().unwrap();
        let name = listener.name().to_string();
        let (tx, _rx) = mpsc::channel::<Asked>(4);
        tokio::spawn(listener.serve(tx));
        for frame in [b"not json\n".to_vec(), vec![b'x'; MAX_FRAME_BYTES + 10]] {
            use std::os::linux::net::SocketAddrExt as _;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(&name).unwrap();
            let s = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
            s.set_nonblocking(true).unwrap();
            let s = UnixStream::from_std(s).unwrap();
            let (read, mut write) = s.into_split();
            let writing = tokio::spawn(async move {
                let _ = write.write_all(&frame).await;
                write
            });
            let answer: Answer = read_frame(read).await.unwrap();
            assert!(matches!(answer, Answer::Deny { .. }), "{answer:?}");
            drop(writing);
        }
    }

    #[tokio::test]
    async fn only_our_socket_names_are_taken_from_the_environment() {
        assert!(valid_name(bind().unwrap().name()));
        for bad in [
            "npc-acp-approval-".to_string(),
            format!("{SOCKET_NAME_PREFIX}{}", "z".repeat(32)),
            format!("{SOCKET_NAME_PREFIX}{}", "a".repeat(31)),
            format!("other-{}", "a".repeat(32)),
        ] {
            assert!(!valid_name(&bad), "{bad}");
        }
    }
}
