//! Data at rest gives nothing away: the database and `tessera backup` hold no session
//! cookie's value, no notebook token and no environment value in clear; the backup is
//! readable by its owner only, and `tessera restore` refuses one that others could read.
//! (SQLite: `tessera backup` copies the embedded store; PostgreSQL uses pg_dump.)

use crate::allocations::{set_quota, team};
use crate::support::{AdminClient, Db, TestApp, get_as, post_as};
use reqwest::Method;
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use tessera_core::store::Store;

const SECRET: &str = "s3cr3t-wandb-key-0f1e2d3c";

/// Every file of the SQLite database at `url` (the database, its WAL), concatenated.
fn database_bytes(url: &str) -> Vec<u8> {
    let db = tessera_core::store::sqlite_file(url).expect("a SQLite file");
    let mut bytes = Vec::new();
    for suffix in ["", "-wal"] {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        if let Ok(b) = std::fs::read(std::path::PathBuf::from(name)) {
            bytes.extend(b);
        }
    }
    bytes
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path)
        .expect("metadata")
        .permissions()
        .mode()
        & 0o777
}

/// `POST body` to `path` as `token`, which creates a workload: the workload.
async fn create(app: &TestApp, token: &str, path: &str, body: Value) -> Value {
    let (s, v) = post_as(app, token, path, body).await;
    assert_eq!(s, 201, "{v}");
    v
}

fn workload_id(v: &Value) -> tessera_domain::ids::WorkloadId {
    tessera_domain::ids::WorkloadId::parse(v["id"].as_str().expect("id")).expect("uuid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_holds_no_session_token_or_secret_in_clear() {
    let mut a = AdminClient::new(Db::Sqlite).await;
    let cookie = a.cookie().to_owned();
    let (_, session_id) = cookie.split_once('=').expect("name=value");
    assert_eq!(session_id.len(), 22, "a tower-sessions id: {cookie}");
    let t = team(&a, "rest").await;
    set_quota(&a, &t.id, "H100-80GB", 7, 7, 7).await;

    // A notebook (it has a token) and a job, each with a secret in its environment; no
    // node, so both wait for their own GPU.
    let nb = create(
        &a.app,
        &t.member,
        "/api/v1/notebooks",
        json!({"name": "nb-at-rest", "gpu": "H100-80GB:1g.10gb",
               "env": {"WANDB_API_KEY": SECRET}}),
    )
    .await;
    let env = json!({"HF_TOKEN": format!("{SECRET}-job")});
    let job = json!({"command": "true", "gpu": "H100-80GB:1g.10gb", "env": env});
    create(&a.app, &t.member, "/api/v1/jobs", job).await;
    // The owner still reads the value back.
    assert_eq!(nb["env"][0]["value"], SECRET, "{nb}");
    let id = workload_id(&nb);
    let store = Store::connect(&a.app.database_url).await.expect("store");
    let row = store.workload(id).await.expect("load").expect("row");
    store.close().await;
    let token = a
        .app
        .side_services()
        .await
        .0
        .workloads
        .notebook_token(&row.w)
        .expect("the token opens")
        .expect("a notebook has a token");
    assert_eq!(token.len(), 64, "{token}");

    // Neither the live database nor a backup holds any of them in clear.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("tessera-backup.db");
    tessera_server::backup(&a.app.database_url, &file)
        .await
        .expect("backup");
    assert_eq!(mode(&file), 0o600, "a backup is its owner's only");
    let db = tessera_core::store::sqlite_file(&a.app.database_url).expect("file");
    assert_eq!(mode(&db), 0o600, "so is the database");
    let backup = std::fs::read(&file).expect("read backup");
    let live = database_bytes(&a.app.database_url);
    for (what, bytes) in [("backup", &backup), ("database", &live)] {
        assert!(
            contains(bytes, "nb-at-rest"),
            "the {what} was read in clear"
        );
        for (name, value) in [
            ("the session cookie's value", session_id),
            ("the notebook token", &token),
            ("a secret environment value", SECRET),
        ] {
            assert!(!contains(bytes, value), "the {what} holds {name}");
        }
    }
    // The session is in the backup, under a hash of the cookie's id.
    let copy = Store::connect(&format!("sqlite://{}", file.display()))
        .await
        .expect("open backup");
    let Store::Sqlite(pool) = &copy else {
        unreachable!()
    };
    let ids: Vec<String> = sqlx::query_scalar("SELECT id FROM tower_sessions")
        .fetch_all(pool)
        .await
        .expect("sessions");
    let hashed =
        tessera_core::sessions::stored_id(&session_id.parse().expect("session id")).to_string();
    assert!(ids.contains(&hashed), "{ids:?} lacks {hashed}");
    copy.close().await;

    // A restore refuses a backup others could read, and restores one only its owner can.
    a.app.stop().await;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let err = tessera_server::restore(&a.app.database_url, &file)
        .await
        .expect_err("a 0644 backup is refused");
    assert!(format!("{err:#}").contains("chmod 600"), "{err:#}");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    tessera_server::restore(&a.app.database_url, &file)
        .await
        .expect("restore");
    a.app.start_again().await;
    // The restored session still signs the admin in; the secrets open with the key beside
    // the database.
    let (s, me) = a.call(Method::GET, "/api/v1/me", None).await;
    assert_eq!(s, 200, "{me}");
    let (s, v) = get_as(&a.app, &t.member, &format!("/api/v1/workloads/{id}")).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["env"][0]["value"], SECRET, "{v}");
}

/// Writes `sql` (binding `id`) to the SQLite database at `url`.
async fn execute(url: &str, sql: &str, id: tessera_domain::ids::WorkloadId) {
    let store = Store::connect(url).await.expect("store");
    let Store::Sqlite(pool) = &store else {
        unreachable!()
    };
    sqlx::query(sql)
        .bind(id.0)
        .execute(pool)
        .await
        .expect("update");
    store.close().await;
}

/// The ids of the keys that sealed a workload's environment and token.
async fn sealed_with(
    url: &str,
    id: tessera_domain::ids::WorkloadId,
) -> (Option<String>, Option<String>) {
    let store = Store::connect(url).await.expect("store");
    let w = store.workload(id).await.expect("load").expect("row").w;
    store.close().await;
    (
        w.env.key_id().map(str::to_owned),
        w.token.as_ref().and_then(|t| t.key_id()).map(str::to_owned),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_in_clear_and_under_a_retired_key_are_sealed_under_the_newest_at_start() {
    let mut a = AdminClient::new(Db::Sqlite).await;
    let t = team(&a, "rotate").await;
    set_quota(&a, &t.id, "H100-80GB", 7, 7, 7).await;
    let nb = create(
        &a.app,
        &t.member,
        "/api/v1/notebooks",
        json!({"name": "nb-rotate", "gpu": "H100-80GB:1g.10gb",
               "env": {"WANDB_API_KEY": SECRET}}),
    )
    .await;
    let id = workload_id(&nb);
    let url = a.app.database_url.clone();
    let old = a.app.data_keys().ids()[0].to_owned();
    assert_eq!(
        sealed_with(&url, id).await,
        (Some(old.clone()), Some(old.clone()))
    );
    // A row as an older release wrote it: in clear.
    let job = create(
        &a.app,
        &t.member,
        "/api/v1/jobs",
        json!({"command": "true", "gpu": "H100-80GB:1g.10gb"}),
    )
    .await;
    let legacy = workload_id(&job);
    a.app.stop().await;
    execute(
        &url,
        "UPDATE workloads SET env = '[{\"name\":\"OLD_KEY\",\"value\":\"legacy-secret-4711\"}]' \
         WHERE id = $1",
        legacy,
    )
    .await;
    assert_eq!(sealed_with(&url, legacy).await, (None, None));

    // Rotation: a new key first in the key file, the old one kept to open what it sealed.
    let db = tessera_core::store::sqlite_file(&url).expect("file");
    let key_file = tessera_server::data_keys::default_file(&db);
    let old_key = std::fs::read_to_string(&key_file).expect("key file");
    let new_key = tessera_core::at_rest::DataKeys::generate();
    std::fs::write(&key_file, format!("{new_key}\n{old_key}")).expect("rotate");
    a.app.start_again().await;
    let new = a.app.data_keys().ids()[0].to_owned();
    assert_ne!(new, old);
    assert_eq!(
        sealed_with(&url, id).await,
        (Some(new.clone()), Some(new.clone()))
    );
    assert_eq!(sealed_with(&url, legacy).await, (Some(new.clone()), None));
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("after-rotation.db");
    tessera_server::backup(&url, &file).await.expect("backup");
    let backup = std::fs::read(&file).expect("read backup");
    assert!(
        !contains(&backup, "legacy-secret-4711"),
        "the clear row was sealed"
    );

    // The old key retired: everything still opens.
    a.app.stop().await;
    std::fs::write(&key_file, format!("{new_key}\n")).expect("retire");
    a.app.start_again().await;
    for (w, name, value) in [
        (id, "WANDB_API_KEY", SECRET),
        (legacy, "OLD_KEY", "legacy-secret-4711"),
    ] {
        let (s, v) = get_as(&a.app, &t.member, &format!("/api/v1/workloads/{w}")).await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["env"][0]["name"], name, "{v}");
        assert_eq!(v["env"][0]["value"], value, "{v}");
    }

    // A key that opens none of them stops the start, naming the key it needs.
    a.app.stop().await;
    let mut config = tessera_server::config::ServeConfig::for_tests(&url);
    config.data_key = Some(tessera_server::config::Secret::new(
        tessera_core::at_rest::DataKeys::generate(),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let err = tessera_server::run(config, listener, std::future::pending())
        .await
        .expect_err("no key opens the rows");
    assert!(format!("{err:#}").contains(&new), "{err:#}");
}
