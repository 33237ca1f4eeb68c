//! TLS to the fleet's PostgreSQL through the real `npc` binary, against a
//! throwaway cluster on 127.0.0.1 that takes TCP clients over TLS only
//! (`pg::PgCluster::start_tls`: an authority and a server certificate made
//! at test time): `verify-full` with the right authority migrates the store
//! and a worker carries out a run; `verify-ca` ignores the host name that
//! `verify-full` checks; the wrong authority, a name the certificate does
//! not list and `sslmode=require` against a server without TLS each fail
//! with a message naming the problem. No output ever holds the password.

use std::path::Path;
use std::process::Output;

use npcagent::store::fleet::FleetQueue;
use npcagent::store::pg::PgStore;
use npcagent::store::queue::{Enqueued, state};

use crate::fleet::{
    STEADY_LEASE_SECS, fleet_key, fleet_repo, run, start_worker_leased, worker_logs,
};
use crate::pg::{PG_PASSWORD, PG_USER, PgCluster};

/// `npc store migrate` in `repo` with `url` as `NPC_STORE_URL`.
fn migrate(repo: &Path, url: &str) -> Output {
    crate::support::npc()
        .args(["store", "migrate"])
        .current_dir(repo)
        .env("NPC_STORE_URL", url)
        .output()
        .unwrap()
}

/// Everything a command printed; asserts the password is not in it.
fn said(out: &Output) -> String {
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!all.contains(PG_PASSWORD), "the password leaked: {all}");
    all
}

fn with_query(url: &str, query: &str) -> String {
    format!("{url}?{query}")
}

#[test]
fn verify_full_with_the_right_authority_migrates_and_a_worker_carries_out_a_run() {
    let Some((cluster, files)) = PgCluster::start_tls() else {
        return;
    };
    let repo = fleet_repo("echo \"$NPC_RUN_ID\" >> ran.log");
    let base = cluster.database("fleet");
    // The server takes no plain TCP client: what works below is TLS.
    let plain = migrate(repo.path(), &with_query(&base, "sslmode=disable"));
    assert!(!plain.status.success());
    assert!(said(&plain).contains("no encryption"), "{}", said(&plain));
    let url = with_query(
        &base,
        &format!("sslmode=verify-full&sslrootcert={}", files.ca.display()),
    );
    let out = migrate(repo.path(), &url);
    assert!(out.status.success(), "{}", said(&out));
    assert!(
        said(&out).contains("migrated from schema version 0"),
        "{}",
        said(&out)
    );

    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(PgStore::connect(&url, &fleet_key())).unwrap();
    let queued = rt.block_on(store.enqueue(run("run-over-tls"))).unwrap();
    assert_eq!(queued, Enqueued::Queued);
    let logs = tempfile::tempdir().unwrap();
    let _worker = crate::support::Stopped::new(start_worker_leased(
        repo.path(),
        &url,
        &logs.path().join("worker.log"),
        STEADY_LEASE_SECS,
    ));
    let row = crate::support::wait_for("the run to end", || {
        let row = rt.block_on(store.run("run-over-tls")).unwrap().unwrap();
        (row.state != state::QUEUED && row.state != state::RUNNING).then_some(row)
    });
    let logged = worker_logs(logs.path());
    assert_eq!(row.state, state::SUCCEEDED, "{row:?}\n{logged}");
    let ran = std::fs::read_to_string(repo.path().join("ran.log")).unwrap();
    assert_eq!(ran.trim(), "run-over-tls");
    assert!(!logged.contains(PG_PASSWORD), "{logged}");
}

#[test]
fn verify_ca_ignores_the_host_name_that_verify_full_checks() {
    let Some((cluster, files)) = PgCluster::start_tls() else {
        return;
    };
    let repo = fleet_repo("true");
    cluster.database("fleet");
    // The certificate names 127.0.0.1; this URL names `localhost` and
    // connects to 127.0.0.1 by `hostaddr` (nothing else is probed).
    let by_name = format!(
        "postgres://{PG_USER}:{PG_PASSWORD}@localhost:{}/fleet?hostaddr=127.0.0.1&sslrootcert={}",
        cluster.port,
        files.ca.display()
    );
    let full = migrate(repo.path(), &format!("{by_name}&sslmode=verify-full"));
    assert!(!full.status.success());
    assert!(
        said(&full).contains("not valid for the host the URL names"),
        "{}",
        said(&full)
    );
    let ca = migrate(repo.path(), &format!("{by_name}&sslmode=verify-ca"));
    assert!(ca.status.success(), "{}", said(&ca));
}

#[test]
fn the_wrong_authority_or_a_server_without_tls_fails_clearly_without_the_password() {
    let Some((cluster, files)) = PgCluster::start_tls() else {
        return;
    };
    let repo = fleet_repo("true");
    let base = cluster.database("fleet");
    let wrong = with_query(
        &base,
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            files.wrong_ca.display()
        ),
    );
    let out = migrate(repo.path(), &wrong);
    assert!(!out.status.success());
    let text = said(&out);
    assert!(
        text.contains("not signed by a certificate authority npc trusts"),
        "{text}"
    );
    assert!(!text.contains(&*files.wrong_ca.to_string_lossy()), "{text}");
    drop(cluster);

    let Some(plain) = PgCluster::start() else {
        return;
    };
    let url = with_query(&plain.database("fleet"), "sslmode=require");
    let out = migrate(repo.path(), &url);
    assert!(!out.status.success());
    let text = said(&out);
    assert!(text.contains("the server does not offer TLS"), "{text}");
    assert!(text.contains("sslmode"), "{text}");
}

#[test]
fn a_manifest_that_names_a_certificate_file_itself_is_refused() {
    let repo = fleet_repo("true");
    let manifest = repo.path().join("npcagent.toml");
    let text = std::fs::read_to_string(&manifest).unwrap().replace(
        "url = \"${NPC_STORE_URL}\"",
        "url = \"postgres://npc:${PW}@db.internal/npc?sslrootcert=/etc/shadow\"",
    );
    std::fs::write(&manifest, text).unwrap();
    let out = crate::support::npc()
        .arg("validate")
        .current_dir(repo.path())
        .env("PW", PG_PASSWORD)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text = said(&out);
    assert!(
        text.contains("names an `sslrootcert` file in the manifest itself"),
        "{text}"
    );
}
