//! The permission bridge: a hook's `ask` (or a profile's `ask_tools`),
//! arriving on the approval socket, becomes a `session/request_permission`
//! to the editor; every way of getting no answer is a denial.

use super::*;

impl Agent {
    /// Put a hook's question to the client as `session/request_permission`.
    /// Fail closed: no such session, no running prompt, too many questions
    /// waiting, an error answer, a cancelled prompt — each is a denial.
    pub(super) async fn ask_permission(
        self: &Arc<Self>,
        session_id: &str,
        request: ApprovalRequest,
    ) -> Answer {
        let deny = |reason: &str| Answer::Deny {
            reason: reason.to_string(),
        };
        let Some(session) = self.session(session_id) else {
            return deny("the approval names no session of this `npc acp`");
        };
        let Some(mut ended) = session
            .active
            .lock()
            .ok()
            .and_then(|a| a.as_ref().map(|a| a.ended.clone()))
        else {
            return deny("the session runs no prompt");
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let Ok(mut pending) = self.pending.lock() else {
                return deny("internal error");
            };
            if pending.len() >= MAX_PENDING_REQUESTS {
                return deny("too many questions are waiting for the editor");
            }
            pending.insert(id, tx);
        }
        let call = &request.tool_call;
        // `request.hook` names the asker: a hook (`before_tool[0]`) or the
        // profile's policy (`profile `dev` ask_tools`).
        let mut title = format!("{} (asked by {})", call.name, request.hook);
        if let Some(reason) = &request.reason {
            title = format!("{title}: {reason}");
        }
        let tool_call = ToolCallUpdate::new(
            call.id.clone(),
            ToolCallUpdateFields::new()
                .title(title)
                .kind(map::kind(&call.name))
                .status(ToolCallStatus::Pending)
                .raw_input(call.arguments.clone()),
        );
        let options = vec![
            PermissionOption::new("allow", "Allow", PermissionOptionKind::AllowOnce),
            PermissionOption::new("deny", "Deny", PermissionOptionKind::RejectOnce),
        ];
        let params = RequestPermissionRequest::new(session_id.to_string(), tool_call, options)
            .meta(meta(
                json!({ "hook": request.hook, "reason": request.reason }),
            ));
        match serde_json::to_value(params) {
            Ok(params) => self.send(frame::message(
                Some(id),
                "session/request_permission",
                params,
            )),
            Err(e) => return deny(&e.to_string()),
        }
        let answer = tokio::select! {
            answer = rx => answer,
            _ = ended.wait_for(|ended| *ended) => {
                if let Ok(mut pending) = self.pending.lock() {
                    pending.remove(&id);
                }
                return deny("the prompt ended before the editor answered");
            }
        };
        match answer {
            Ok(Ok(result)) => {
                let outcome = &result["outcome"];
                if outcome["outcome"] == "selected" && outcome["optionId"] == "allow" {
                    Answer::Allow
                } else if outcome["outcome"] == "cancelled" {
                    deny("the editor cancelled the question")
                } else {
                    deny("denied in the editor")
                }
            }
            Ok(Err(error)) => deny(&format!("the editor answered with an error: {error}")),
            Err(_) => deny("the editor gave no answer"),
        }
    }
}
