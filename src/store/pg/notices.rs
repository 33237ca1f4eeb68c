//! The fleet's notice board in PostgreSQL ([`Notices`]): every daemon of
//! the fleet posts its panes' notices here with its host, and hears the
//! others'. The same bounds as the user-level board: fields cut to
//! `MAX_FIELD_CHARS`, the newest `MAX_NOTICES` of the fleet kept; times
//! are the database's clock. Posts hold a per-fleet advisory lock, so ids
//! are in commit order and a reader after an id never skips one.

use std::sync::LazyLock;

use super::{PgStore, pg_error};
use crate::store::notices::{
    MAX_FIELD_CHARS, MAX_NOTICES, MAX_READ, NewNotice, Notice, NoticeFuture, Notices, bounded,
};
use crate::store::{StoreError, untrusted};

/// Notices after `$2` of fleet `$1`, at most `$3`: another machine may
/// have written them, so each field is cut to [`MAX_FIELD_CHARS`] here
/// and blanked of controls by [`bounded`] once read.
static NOTICES_SQL: LazyLock<String> = LazyLock::new(|| {
    let field = |col: &str| untrusted::pg_text(col, MAX_FIELD_CHARS);
    format!(
        "SELECT id, at_ms, {}, {}, {}, {}, {} FROM npc_notices
         WHERE fleet = $1 AND id > $2 ORDER BY id LIMIT $3",
        field("repository"),
        field("pane"),
        field("plugin"),
        field("reason"),
        field("host"),
    )
});

/// The advisory lock class of a fleet's notice posts.
const NOTICES_LOCK_CLASS: i32 = 0x6e70_6e6f;

impl PgStore {
    async fn post_notice(&self, notice: &NewNotice) -> Result<i64, StoreError> {
        let failed = pg_error("post a notice");
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(&failed)?;
        tx.execute(
            "SELECT pg_advisory_xact_lock($1, hashtext($2))",
            &[&NOTICES_LOCK_CLASS, &self.fleet()],
        )
        .await
        .map_err(&failed)?;
        let id: i64 = tx
            .query_one(
                "INSERT INTO npc_notices (fleet, at_ms, host, repository, pane, plugin, reason)
                 VALUES ($1, npc_now_ms(), $2, $3, $4, $5, $6) RETURNING id",
                &[
                    &self.fleet(),
                    &bounded(&notice.host),
                    &bounded(&notice.repository),
                    &bounded(&notice.pane),
                    &bounded(&notice.plugin),
                    &bounded(&notice.reason),
                ],
            )
            .await
            .map_err(&failed)?
            .get(0);
        tx.execute(
            "DELETE FROM npc_notices WHERE fleet = $1 AND id <= (
                 SELECT id FROM npc_notices WHERE fleet = $1 ORDER BY id DESC OFFSET $2 LIMIT 1)",
            &[&self.fleet(), &MAX_NOTICES],
        )
        .await
        .map_err(&failed)?;
        tx.commit().await.map_err(&failed)?;
        Ok(id)
    }

    async fn last_notice(&self) -> Result<i64, StoreError> {
        let client = self.client().await?;
        client
            .query_one(
                "SELECT COALESCE(MAX(id), 0) FROM npc_notices WHERE fleet = $1",
                &[&self.fleet()],
            )
            .await
            .map(|row| row.get(0))
            .map_err(pg_error("read the notice board"))
    }

    async fn notices_since(&self, after_id: i64) -> Result<Vec<Notice>, StoreError> {
        let client = self.client().await?;
        let limit = i64::try_from(MAX_READ).unwrap_or(i64::MAX);
        let rows = client
            .query(&*NOTICES_SQL, &[&self.fleet(), &after_id, &limit])
            .await
            .map_err(pg_error("read the notice board"))?;
        Ok(rows
            .iter()
            .map(|r| Notice {
                id: r.get(0),
                at_ms: r.get(1),
                repository: bounded(&r.get::<_, String>(2)),
                pane: bounded(&r.get::<_, String>(3)),
                plugin: bounded(&r.get::<_, String>(4)),
                reason: bounded(&r.get::<_, String>(5)),
                host: bounded(&r.get::<_, String>(6)),
            })
            .collect())
    }
}

impl Notices for PgStore {
    fn post<'a>(&'a self, notice: &'a NewNotice) -> NoticeFuture<'a, i64> {
        Box::pin(async move { Ok(self.post_notice(notice).await?) })
    }

    fn last_id(&self) -> NoticeFuture<'_, i64> {
        Box::pin(async move { Ok(self.last_notice().await?) })
    }

    fn since(&self, after_id: i64) -> NoticeFuture<'_, Vec<Notice>> {
        Box::pin(async move { Ok(self.notices_since(after_id).await?) })
    }
}
