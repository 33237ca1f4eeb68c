//! The PostgreSQL store's versioned migrations. `npc store migrate` applies
//! the missing ones, in order, each in its own transaction under an
//! advisory lock (two migrators never race), recorded in
//! `npc_schema_migrations`. Every other process only checks the version
//! and refuses a store of another one ([`check_version`]).

use deadpool_postgres::GenericClient;

use super::{PG_SCHEMA_VERSION, pg_error};
use crate::store::StoreError;

/// The advisory lock every migration holds (a fixed key, "npc migrate").
const MIGRATE_LOCK_KEY: i64 = 0x6e70_635f_6d69_6772;

struct Migration {
    version: i64,
    sql: &'static str,
}

/// Every migration, oldest first. Append only; never edit a shipped step.
const MIGRATIONS: &[Migration] = &[
    Migration {
        // The fleet's run queue, event log and trigger state, each row scoped
        // by its fleet (a repository's project name and remote URL). Times are
        // unix milliseconds of the database's clock (`npc_now_ms`), so leases
        // never depend on the workers' clocks agreeing.
        version: 1,
        sql: r#"
        CREATE FUNCTION npc_now_ms() RETURNS bigint LANGUAGE sql VOLATILE AS
            $$ SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint $$;
        CREATE TABLE npc_runs (
            seq                 bigserial PRIMARY KEY,
            fleet               text   NOT NULL,
            id                  text   NOT NULL,
            trigger             text   NOT NULL,
            origin              text   NOT NULL,
            dedupe_key          text,
            payload             text   NOT NULL,
            state               text   NOT NULL,
            enqueued_at_ms      bigint NOT NULL,
            started_at_ms       bigint,
            finished_at_ms      bigint,
            detail              text,
            owner               text,
            concurrency_key     text,
            result              text,
            worktree            text,
            replay_until_ms     bigint,
            lease_token         bigint NOT NULL DEFAULT 0,
            lease_expires_at_ms bigint,
            UNIQUE (fleet, id),
            UNIQUE (fleet, trigger, dedupe_key)
        );
        CREATE INDEX npc_runs_queued ON npc_runs (fleet, seq) WHERE state = 'queued';
        CREATE INDEX npc_runs_by_trigger ON npc_runs (fleet, trigger, state, seq);
        CREATE INDEX npc_runs_by_lease ON npc_runs (fleet, lease_expires_at_ms)
            WHERE state = 'running';
        CREATE TABLE npc_events (
            id        bigserial PRIMARY KEY,
            fleet     text   NOT NULL,
            ts_ms     bigint NOT NULL,
            kind      text   NOT NULL,
            component text,
            payload   text   NOT NULL
        );
        CREATE INDEX npc_events_by_fleet ON npc_events (fleet, id);
        CREATE INDEX npc_events_by_component ON npc_events (fleet, component, id);
        CREATE TABLE npc_trigger_state (
            fleet         text   NOT NULL,
            trigger       text   NOT NULL,
            key           text   NOT NULL,
            value         text   NOT NULL,
            updated_at_ms bigint NOT NULL,
            PRIMARY KEY (fleet, trigger, key)
        );
        CREATE TABLE npc_webhook_replays (
            fleet         text   NOT NULL,
            trigger       text   NOT NULL,
            key           text   NOT NULL,
            expires_at_ms bigint NOT NULL,
            PRIMARY KEY (fleet, trigger, key)
        );
        CREATE TABLE npc_workers (
            fleet           text   NOT NULL,
            id              text   NOT NULL,
            host            text   NOT NULL,
            version         text   NOT NULL,
            started_at_ms   bigint NOT NULL,
            heartbeat_at_ms bigint NOT NULL,
            PRIMARY KEY (fleet, id)
        );
    "#,
    },
    Migration {
        // The roster `npc workers` reads: each worker's lease (a worker
        // whose heartbeat is older is lost) and when it stopped cleanly.
        version: 2,
        sql: r#"
        ALTER TABLE npc_workers ADD COLUMN lease_ms bigint NOT NULL DEFAULT 30000;
        ALTER TABLE npc_workers ADD COLUMN stopped_at_ms bigint;
    "#,
    },
    Migration {
        // The fleet's policies: the attempt a run is at and the attempts
        // its trigger allows (`retries` + 1, written at enqueue), so a
        // rescuer queues a lost run again without a manifest; the run that
        // replaced a running one (overlap `replace`); and an index for the
        // claim's "one running run per trigger and key".
        version: 3,
        sql: r#"
        ALTER TABLE npc_runs ADD COLUMN attempt integer NOT NULL DEFAULT 1;
        ALTER TABLE npc_runs ADD COLUMN attempts integer NOT NULL DEFAULT 1;
        ALTER TABLE npc_runs ADD COLUMN replaced_by text;
        CREATE INDEX npc_runs_by_key ON npc_runs (fleet, trigger, concurrency_key, state, seq);
    "#,
    },
    Migration {
        // The code a run starts from (`store::queue::RunCode`): the
        // repository's remote URL (credentials stripped) and the commit the
        // ingress resolved when it queued the run.
        version: 4,
        sql: r#"
        ALTER TABLE npc_runs ADD COLUMN remote text;
        ALTER TABLE npc_runs ADD COLUMN start_commit text;
    "#,
    },
    Migration {
        // `npc acp`'s sessions, shared by every machine of the fleet: the
        // sessions, their prompts' runs (and the host each ran on: a
        // provider's conversation lives there), and the runs' agent events
        // `session/load` replays. The fleet's notice board.
        version: 5,
        sql: r#"
        CREATE TABLE npc_acp_sessions (
            fleet         text   NOT NULL,
            id            text   NOT NULL,
            profile       text   NOT NULL,
            cwd           text   NOT NULL,
            title         text,
            forked_from   text,
            created_at_ms bigint NOT NULL,
            updated_at_ms bigint NOT NULL,
            PRIMARY KEY (fleet, id)
        );
        CREATE INDEX npc_acp_sessions_by_update
            ON npc_acp_sessions (fleet, updated_at_ms DESC, id DESC);
        CREATE TABLE npc_acp_session_runs (
            fleet      text   NOT NULL,
            session_id text   NOT NULL,
            seq        bigint NOT NULL,
            run_id     text   NOT NULL,
            prompt     text   NOT NULL,
            host       text,
            PRIMARY KEY (fleet, session_id, seq)
        );
        CREATE TABLE npc_acp_events (
            fleet   text   NOT NULL,
            run_id  text   NOT NULL,
            seq     bigint NOT NULL,
            ts_ms   bigint NOT NULL,
            kind    text   NOT NULL,
            payload text   NOT NULL,
            PRIMARY KEY (fleet, run_id, seq)
        );
        CREATE TABLE npc_notices (
            id         bigserial PRIMARY KEY,
            fleet      text   NOT NULL,
            at_ms      bigint NOT NULL,
            host       text   NOT NULL,
            repository text   NOT NULL,
            pane       text   NOT NULL,
            plugin     text   NOT NULL,
            reason     text   NOT NULL
        );
        CREATE INDEX npc_notices_by_fleet ON npc_notices (fleet, id);
    "#,
    },
    Migration {
        // A run's concurrency key as a value an index can match:
        // `IS NOT DISTINCT FROM` (a key or none) is not indexable, so the
        // claim's "none of its key running or ahead" scanned every active
        // run of the trigger per candidate. `npc_key_slot` maps no key to
        // '' and a key to 'k' || key (one value per key, none colliding),
        // and the claim, a run's end and an enqueue compare slots through
        // an index of the queued runs and one of the running runs. Each is
        // partial on exactly the state the queries name, so the planner
        // takes it (an index-only probe) even before a fleet's first
        // `ANALYZE`. The fleet's queue in claim order, `npc_runs_queued`,
        // becomes `npc_runs_claimable`, partial on `seq > 0` as well (always
        // true): only the claim, which names it, scans it, so a probe of one
        // key's runs never walks the whole fleet's queue (it did on a fresh
        // fleet without statistics, over every claimed run's dead entry).
        version: 6,
        sql: r#"
        CREATE FUNCTION npc_key_slot(key text) RETURNS text
            LANGUAGE sql IMMUTABLE PARALLEL SAFE
            AS $$ SELECT CASE WHEN key IS NULL THEN '' ELSE 'k' || key END $$;
        ALTER TABLE npc_runs ADD COLUMN key_slot text NOT NULL
            GENERATED ALWAYS AS (npc_key_slot(concurrency_key)) STORED;
        CREATE INDEX npc_runs_queued_by_slot ON npc_runs (fleet, trigger, key_slot, seq)
            WHERE state = 'queued';
        CREATE INDEX npc_runs_running_by_slot ON npc_runs (fleet, trigger, key_slot)
            WHERE state = 'running';
        DROP INDEX npc_runs_by_key;
        CREATE INDEX npc_runs_claimable ON npc_runs (fleet, seq)
            WHERE state = 'queued' AND seq > 0;
        DROP INDEX npc_runs_queued;
    "#,
    },
    Migration {
        // The claim's order as an expression only its index has: with
        // `ORDER BY seq`, once `ANALYZE` counted many queued runs the
        // planner expected the primary key to reach one within a few rows
        // and walked the whole history by it (finished runs come first in
        // `seq` order), a claim going from a few buffers to tens of
        // thousands. `seq + 0` keeps the same order, and no other index
        // yields it sorted, so the claim keeps to the queued runs. Partial
        // on `seq > 0` as `npc_runs_claimable` was, so only the claim,
        // which names it, scans it (not a probe of one key's runs).
        version: 7,
        sql: r#"
        CREATE INDEX npc_runs_claim_order ON npc_runs (fleet, (seq + 0))
            WHERE state = 'queued' AND seq > 0;
        DROP INDEX npc_runs_claimable;
    "#,
    },
    Migration {
        // Whether a run was enqueued behind another of its trigger's queue
        // of its key (one of them queued or running then): a run that was
        // not heads its key's queue with none running for as long as it
        // is queued, so the claim takes it without looking at its key's
        // runs, and concurrent claimers that skip each other's locked runs
        // probe nothing for them. Runs queued before this version count as
        // behind: the claim looks, as it always did.
        //
        // A trigger's queue of one key is one value, `npc_queue_of`
        // (injective: each part but the last led by its length), and the
        // looks at a key's queued or running runs name it alone. Named as
        // three columns, the fleet and the trigger matched the lead of
        // other indexes too, and before a fleet's first `ANALYZE` the
        // planner took the unique index of dedupe keys for them, reading
        // every run of the trigger per claim candidate and per end.
        version: 8,
        sql: r#"
        ALTER TABLE npc_runs ADD COLUMN behind boolean NOT NULL DEFAULT true;
        CREATE FUNCTION npc_queue_of(fleet text, trigger text, key_slot text) RETURNS text
            LANGUAGE sql IMMUTABLE PARALLEL SAFE
            AS $$ SELECT length(fleet)::text || ':' || fleet || length(trigger)::text || ':'
                  || trigger || key_slot $$;
        CREATE INDEX npc_runs_queued_of_queue
            ON npc_runs (npc_queue_of(fleet, trigger, key_slot), seq) WHERE state = 'queued';
        CREATE INDEX npc_runs_running_of_queue
            ON npc_runs (npc_queue_of(fleet, trigger, key_slot)) WHERE state = 'running';
        DROP INDEX npc_runs_queued_by_slot;
        DROP INDEX npc_runs_running_by_slot;
    "#,
    },
    Migration {
        // A lease is found by one indexed value, `npc_run_of(fleet, id)`
        // (injective: the fleet led by its length), in an index of the runs
        // that hold one. Named as `fleet = … AND id = … AND state =
        // 'running'`, the look let the planner take the partial index of
        // running leases, led by the fleet, and every end, renewal and
        // fenced write read every running run of the fleet; without the
        // state, it took any index led by the fleet (without statistics
        // they all cost the same), reading every run of the fleet. Only a
        // running run holds a lease (every change out of `running` clears
        // it), so the look names no state; the check holds that.
        version: 9,
        sql: r#"
        UPDATE npc_runs SET lease_expires_at_ms = NULL
            WHERE state <> 'running' AND lease_expires_at_ms IS NOT NULL;
        ALTER TABLE npc_runs ADD CONSTRAINT npc_runs_lease_only_running
            CHECK (lease_expires_at_ms IS NULL OR state = 'running');
        CREATE FUNCTION npc_run_of(fleet text, id text) RETURNS text
            LANGUAGE sql IMMUTABLE PARALLEL SAFE
            AS $$ SELECT length(fleet)::text || ':' || fleet || id $$;
        CREATE UNIQUE INDEX npc_runs_leased ON npc_runs (npc_run_of(fleet, id))
            WHERE lease_expires_at_ms IS NOT NULL;
    "#,
    },
    Migration {
        // Pending approvals of the fleet's runs (`pg::approvals`): any
        // node's API answers a run parked on a worker.
        version: 10,
        sql: super::approvals::MIGRATION,
    },
];

const CREATE_VERSION_TABLE: &str = "CREATE TABLE IF NOT EXISTS npc_schema_migrations (
    version       bigint PRIMARY KEY,
    applied_at_ms bigint NOT NULL
)";

/// The store's schema version: 0 when it was never migrated.
pub(super) async fn current_version(client: &impl GenericClient) -> Result<i64, StoreError> {
    let exists = client
        .query_one(
            "SELECT to_regclass('npc_schema_migrations') IS NOT NULL",
            &[],
        )
        .await
        .map_err(pg_error("read the schema version"))?
        .get::<_, bool>(0);
    if !exists {
        return Ok(0);
    }
    client
        .query_one(
            "SELECT COALESCE(MAX(version), 0) FROM npc_schema_migrations",
            &[],
        )
        .await
        .map(|row| row.get::<_, i64>(0))
        .map_err(pg_error("read the schema version"))
}

/// Refuse a store of another version than this npc's.
pub(super) async fn check_version(client: &impl GenericClient) -> Result<(), StoreError> {
    let found = current_version(client).await?;
    match found.cmp(&PG_SCHEMA_VERSION) {
        std::cmp::Ordering::Equal => Ok(()),
        std::cmp::Ordering::Less => Err(StoreError::PgSchemaTooOld {
            found,
            supported: PG_SCHEMA_VERSION,
        }),
        std::cmp::Ordering::Greater => Err(StoreError::PgSchemaTooNew {
            found,
            supported: PG_SCHEMA_VERSION,
        }),
    }
}

/// Apply the missing migrations; returns the versions before and after.
pub(super) async fn migrate(
    client: &mut deadpool_postgres::Object,
) -> Result<(i64, i64), StoreError> {
    let failed = pg_error("migrate the store");
    let tx = client.transaction().await.map_err(&failed)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATE_LOCK_KEY])
        .await
        .map_err(&failed)?;
    tx.batch_execute(CREATE_VERSION_TABLE)
        .await
        .map_err(&failed)?;
    let before = current_version(&tx).await?;
    if before > PG_SCHEMA_VERSION {
        return Err(StoreError::PgSchemaTooNew {
            found: before,
            supported: PG_SCHEMA_VERSION,
        });
    }
    for migration in MIGRATIONS.iter().filter(|m| m.version > before) {
        tx.batch_execute(migration.sql).await.map_err(&failed)?;
        tx.execute(
            "INSERT INTO npc_schema_migrations (version, applied_at_ms) VALUES ($1, npc_now_ms())",
            &[&migration.version],
        )
        .await
        .map_err(&failed)?;
    }
    tx.commit().await.map_err(&failed)?;
    Ok((before, PG_SCHEMA_VERSION))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_ordered_and_end_at_the_schema_version() {
        let versions: Vec<i64> = MIGRATIONS.iter().map(|m| m.version).collect();
        assert_eq!(versions, (1..=PG_SCHEMA_VERSION).collect::<Vec<_>>());
    }
}
