//! The session registry: sessions live in the store (`store::acp`, this
//! machine's or the fleet's) and at most `MAX_SESSIONS` in memory (the
//! least recently used idle one makes room); `session/new`, `list`, `load`
//! (replaying the runs' recorded events), `resume` and `fork`. A fleet's
//! sessions keep their working directory relative to the repository, so
//! each machine finds them under its own checkout.

use super::*;

/// How a fleet's session records the repository's root as its directory.
const ROOT_DIR: &str = ".";

impl Agent {
    pub(super) fn session(&self, id: &str) -> Option<Arc<Session>> {
        let mut sessions = self.sessions.lock().ok()?;
        let at = sessions.iter().position(|s| s.record.id == id)?;
        let s = sessions.remove(at)?;
        sessions.push_back(s.clone());
        Some(s)
    }

    /// Hold `record` in memory (making room by dropping the least recently
    /// used idle session), or refuse when every slot runs a prompt.
    pub(super) fn hold(&self, record: AcpSession) -> Result<Arc<Session>, Value> {
        let mut sessions = self.sessions.lock().map_err(internal)?;
        if let Some(s) = sessions.iter().find(|s| s.record.id == record.id) {
            return Ok(s.clone());
        }
        if sessions.len() >= MAX_SESSIONS {
            let idle = sessions
                .iter()
                .position(|s| s.active.lock().map(|a| a.is_none()).unwrap_or(false));
            match idle {
                Some(at) => {
                    sessions.remove(at);
                }
                None => {
                    return Err(frame::error(
                        BUSY,
                        &format!(
                            "{MAX_SESSIONS} sessions are running prompts; wait for one to end"
                        ),
                    ));
                }
            }
        }
        let s = Arc::new(Session {
            record,
            active: Mutex::new(None),
        });
        sessions.push_back(s.clone());
        Ok(s)
    }

    /// A stored session by id (held in memory from now on).
    pub(super) async fn stored(&self, id: &str) -> Result<Arc<Session>, Value> {
        if let Some(s) = self.session(id) {
            return Ok(s);
        }
        let record = self
            .config
            .sessions
            .session(id)
            .await
            .map_err(internal)?
            .ok_or_else(|| {
                frame::error(
                    RESOURCE_NOT_FOUND,
                    &format!("no session `{}`; list them with `session/list`", clip(id)),
                )
            })?;
        self.hold(record)
    }

    pub(super) async fn create(
        &self,
        cwd: PathBuf,
        forked_from: Option<String>,
    ) -> Result<String, Value> {
        let now = crate::store::now_ms();
        let id = runs::new_run_id().replacen(runs::RUN_ID_PREFIX, SESSION_ID_PREFIX, 1);
        let record = AcpSession {
            id: id.clone(),
            profile: self.config.profile.clone(),
            cwd: self.stored_cwd(&cwd),
            title: None,
            forked_from,
            created_at_ms: now,
            updated_at_ms: now,
        };
        self.config
            .sessions
            .create(record.clone())
            .await
            .map_err(internal)?;
        self.hold(record)?;
        Ok(id)
    }

    pub(super) fn session_meta(&self, profile: &str) -> serde_json::Map<String, Value> {
        meta(json!({
            "profile": profile,
            "mcpServers": self.profile_servers(profile),
        }))
    }

    pub(super) async fn new_session(
        &self,
        req: NewSessionRequest,
    ) -> Result<(Value, String), Value> {
        let id = self.create(req.cwd, None).await?;
        let response = to_value(
            NewSessionResponse::new(id.clone()).meta(self.session_meta(&self.config.profile)),
        )?;
        Ok((response, id))
    }

    /// `cwd` as a session records it: in a fleet's store, relative to the
    /// repository when inside it (each machine has its own checkout).
    pub(super) fn stored_cwd(&self, cwd: &std::path::Path) -> String {
        if self.config.sessions.shared()
            && let Ok(inside) = cwd.strip_prefix(&self.config.root)
        {
            return match inside.as_os_str().is_empty() {
                true => ROOT_DIR.to_string(),
                false => inside.display().to_string(),
            };
        }
        cwd.display().to_string()
    }

    /// A session's recorded directory on this machine.
    pub(super) fn local_cwd(&self, stored: &str) -> PathBuf {
        let path = PathBuf::from(stored);
        if path.is_absolute() {
            path
        } else if stored == ROOT_DIR {
            self.config.root.clone()
        } else {
            self.config.root.join(path)
        }
    }

    pub(super) async fn list(&self, req: ListSessionsRequest) -> Result<Value, Value> {
        let cwd = req.cwd.as_ref().map(|c| self.stored_cwd(c));
        let cursor = match req.cursor.as_deref() {
            None => None,
            Some(c) => Some(
                c.split_once(':')
                    .and_then(|(ms, id)| Some((ms.parse::<i64>().ok()?, id.to_string())))
                    .ok_or_else(|| invalid_params("`cursor` is not one npc gave"))?,
            ),
        };
        let rows = self
            .config
            .sessions
            .sessions(
                cwd.as_deref(),
                cursor.as_ref().map(|(ms, id)| (*ms, id.as_str())),
                SESSIONS_PER_PAGE + 1,
            )
            .await
            .map_err(internal)?;
        let more = rows.len() > SESSIONS_PER_PAGE;
        let page = &rows[..rows.len().min(SESSIONS_PER_PAGE)];
        let sessions: Vec<SessionInfo> = page
            .iter()
            .map(|s| {
                let updated = chrono::DateTime::from_timestamp_millis(s.updated_at_ms)
                    .map(|t| t.to_rfc3339())
                    .unwrap_or_default();
                SessionInfo::new(s.id.clone(), self.local_cwd(&s.cwd))
                    .title(s.title.clone())
                    .updated_at(updated)
                    .meta(meta(json!({
                        "profile": s.profile,
                        "forkedFrom": s.forked_from,
                    })))
            })
            .collect();
        let next = more
            .then(|| page.last().map(|s| format!("{}:{}", s.updated_at_ms, s.id)))
            .flatten();
        to_value(ListSessionsResponse::new(sessions).next_cursor(next))
    }

    pub(super) async fn load(&self, req: LoadSessionRequest) -> Result<(Value, String), Value> {
        let session = self.stored(&req.session_id.0).await?;
        let id = session.record.id.clone();
        let runs = self.config.sessions.runs(&id).await.map_err(internal)?;
        let mut mapper = map::Mapper::default();
        for run in runs {
            self.update(
                &id,
                SessionUpdate::UserMessageChunk(ContentChunk::new(ContentBlock::from(run.prompt))),
            );
            let events = self
                .config
                .sessions
                .agent_events(&run.run_id)
                .await
                .map_err(internal)?;
            for e in events {
                for u in mapper.updates(&e.payload) {
                    self.update(&id, u);
                }
            }
        }
        let response =
            to_value(LoadSessionResponse::new().meta(self.session_meta(&session.record.profile)))?;
        Ok((response, id))
    }

    pub(super) async fn resume(&self, req: ResumeSessionRequest) -> Result<(Value, String), Value> {
        let session = self.stored(&req.session_id.0).await?;
        let response = to_value(
            ResumeSessionResponse::new().meta(self.session_meta(&session.record.profile)),
        )?;
        Ok((response, session.record.id.clone()))
    }

    pub(super) async fn fork(&self, req: ForkSessionRequest) -> Result<(Value, String), Value> {
        let parent = self.stored(&req.session_id.0).await?;
        let id = self.create(req.cwd, Some(parent.record.id.clone())).await?;
        let response = to_value(
            ForkSessionResponse::new(id.clone()).meta(self.session_meta(&parent.record.profile)),
        )?;
        Ok((response, id))
    }
}
