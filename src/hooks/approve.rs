//! The approver of a hook run inside an agent that `npc acp` started
//! ([`SocketApprover`]): it asks over `npc acp`'s approval socket
//! (`surfaces::approval`, the wire) and turns the editor's answer into an
//! [`Approval`]; any failure on the way is a denial (fail closed).

use crate::surfaces::approval::{
    APPROVAL_SESSION_ENV, APPROVAL_SOCKET_ENV, Answer, Question, ask, valid_name,
};

use super::{Approval, ApprovalRequest, Approve};

impl From<Answer> for Approval {
    fn from(a: Answer) -> Self {
        match a {
            Answer::Allow => Approval::Allow,
            Answer::Deny { reason } => Approval::Deny { reason },
        }
    }
}

/// The [`Approve`]r of a hook run inside an agent that `npc acp` started:
/// it asks over the approval socket; any failure is a denial.
#[derive(Debug, Clone)]
pub struct SocketApprover {
    name: String,
    session: String,
}

impl SocketApprover {
    /// The approver the environment names ([`APPROVAL_SOCKET_ENV`] and
    /// [`APPROVAL_SESSION_ENV`]), if both are set and the name is one of ours.
    pub fn from_env() -> Option<Self> {
        let name = std::env::var(APPROVAL_SOCKET_ENV).ok()?;
        let session = std::env::var(APPROVAL_SESSION_ENV).ok()?;
        Self::new(name, session)
    }

    /// The approver asking on socket `name` for ACP session `session`, if
    /// the name is one of ours.
    pub fn new(name: String, session: String) -> Option<Self> {
        valid_name(&name).then_some(Self { name, session })
    }
}

impl Approve for SocketApprover {
    fn approve(&self, request: ApprovalRequest) -> futures_util::future::BoxFuture<'_, Approval> {
        Box::pin(async move {
            let question = Question {
                session: self.session.clone(),
                request,
            };
            match ask(&self.name, &question).await {
                Ok(answer) => answer.into(),
                Err(e) => Approval::Deny {
                    reason: e.to_string(),
                },
            }
        })
    }
}
