//! Upgrades lose nothing: a database built by the previous release (every migration but
//! the newest applied one at a time, rows written into every table as soon as it exists)
//! is opened by this release's server, which migrates it forward; every row is still there
//! and the API reads each kind of object back.
//!
//! A migration that adds a table fails this test until `seed` below writes a row into it
//! (in the step that creates it), so the next upgrade is tested with data there too.

use crate::support::{Db, TestApp, fresh_pg_database};
use chrono::{DateTime, Duration, Utc};
use reqwest::Method;
use std::collections::BTreeMap;
use tessera_core::store::Store;
use uuid::Uuid;

crate::on_both_databases!(a_previous_release_database_migrates_forward_with_every_row);

/// The share allocation seeded before migration 0030.
const SHARE: Uuid = Uuid::from_u128(2901);

/// A value bound to a seed statement (the same statement runs on both backends).
enum V {
    U(Uuid),
    T(String),
    I(i64),
    B(bool),
    D(DateTime<Utc>),
}

fn t(s: &str) -> V {
    V::T(s.to_owned())
}

macro_rules! bind_all {
    ($q:expr, $vals:expr) => {{
        let mut q = $q;
        for v in $vals {
            q = match v {
                V::U(u) => q.bind(*u),
                V::T(s) => q.bind(s.clone()),
                V::I(i) => q.bind(*i),
                V::B(b) => q.bind(*b),
                V::D(d) => q.bind(*d),
            };
        }
        q
    }};
}

async fn exec(store: &Store, sql: &str, vals: &[V]) {
    let done = match store {
        Store::Sqlite(p) => bind_all!(sqlx::query(sql), vals)
            .execute(p)
            .await
            .map(|_| ()),
        Store::Postgres(p) => bind_all!(sqlx::query(sql), vals)
            .execute(p)
            .await
            .map(|_| ()),
    };
    done.unwrap_or_else(|e| panic!("seeding failed: {sql}: {e}"));
}

/// Everything the seed wrote, for the checks after the upgrade.
struct Seeded {
    admin_token: String,
    team: Uuid,
    node: Uuid,
    allocation: Uuid,
    workload: Uuid,
    ledger_minor: i64,
}

/// Writes rows into the tables migration `version` creates (or changes), referring to the
/// rows of earlier steps.
async fn seed(store: &Store, version: i64, s: &Seeded, now: DateTime<Utc>) {
    let admin = Uuid::from_u128(1);
    let member = Uuid::from_u128(2);
    let join = Uuid::from_u128(10);
    let hour = now - Duration::hours(3);
    let hour = hour - Duration::seconds(hour.timestamp() % 3600);
    let txn = Uuid::from_u128(40);
    match version {
        1 => {
            for (id, name, is_admin) in [(admin, "root", true), (member, "ada", false)] {
                exec(
                    store,
                    "INSERT INTO users (id, username, password_hash, is_admin, disabled, \
                     sessions_valid_after, created_at) VALUES ($1, $2, $3, $4, FALSE, $5, $5)",
                    &[
                        V::U(id),
                        t(name),
                        t("$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ$AAAAAAAAAAAAAAAAAAAAAA"),
                        V::B(is_admin),
                        V::D(now - Duration::days(30)),
                    ],
                )
                .await;
            }
        }
        2 => {
            exec(
                store,
                "INSERT INTO teams (id, name, archived, created_at) VALUES ($1, 'Vision', FALSE, $2)",
                &[V::U(s.team), V::D(now - Duration::days(20))],
            )
            .await;
            exec(
                store,
                "INSERT INTO memberships (team_id, user_id, role, added_at) VALUES ($1, $2, 'member', $3)",
                &[V::U(s.team), V::U(member), V::D(now - Duration::days(20))],
            )
            .await;
            exec(
                store,
                "INSERT INTO api_tokens (id, user_id, name, prefix, secret_hash, created_at) \
                 VALUES ($1, $2, 'upgrade', $3, $4, $5)",
                &[
                    V::U(Uuid::from_u128(3)),
                    V::U(admin),
                    V::T(tessera_core::auth::secret::prefix(&s.admin_token)),
                    V::T(tessera_core::auth::secret::hash(&s.admin_token)),
                    V::D(now - Duration::days(20)),
                ],
            )
            .await;
            exec(
                store,
                "INSERT INTO join_tokens (id, note, prefix, secret_hash, created_by, created_at, \
                 expires_at, max_uses, uses, revoked) VALUES ($1, 'rack 4', 'tsj_000000', \
                 'join-hash', $2, $3, $4, 5, 1, FALSE)",
                &[
                    V::U(join),
                    V::U(admin),
                    V::D(now - Duration::days(20)),
                    V::D(now + Duration::days(20)),
                ],
            )
            .await;
            exec(
                store,
                "INSERT INTO nodes (id, hostname, credential_hash, join_token_id, registered_at, \
                 last_heartbeat_at, agent_version, manages_mig) \
                 VALUES ($1, 'gpu-upgrade-1', 'node-hash', $2, $3, $3, '0.9.0', TRUE)",
                &[V::U(s.node), V::U(join), V::D(now - Duration::days(20))],
            )
            .await;
        }
        3 => {
            exec(
                store,
                "INSERT INTO gpu_desired (node_id, gpu_uuid, mode, layout, version, updated_at, \
                 updated_by) VALUES ($1, 'GPU-u1', 'enabled', '[]', 1, $2, $3)",
                &[V::U(s.node), V::D(now), V::U(admin)],
            )
            .await;
            exec(
                store,
                "INSERT INTO gpu_apply_status (node_id, gpu_uuid, version, status, reported_at) \
                 VALUES ($1, 'GPU-u1', 1, '{\"gpu_uuid\":\"GPU-u1\",\"version\":1,\
                 \"state\":\"success\",\"step\":null,\"error\":null,\"retry_in_s\":null}', $2)",
                &[V::U(s.node), V::D(now)],
            )
            .await;
            exec(
                store,
                "INSERT INTO telemetry_samples (node_id, seq, at, payload, received_at) \
                 VALUES ($1, 1, $2, $3, $2)",
                &[
                    V::U(s.node),
                    V::D(now),
                    V::T(format!(
                        "{{\"seq\":1,\"at_unix_ms\":{},\"gpus\":[]}}",
                        now.timestamp_millis()
                    )),
                ],
            )
            .await;
        }
        4 => {
            exec(
                store,
                "INSERT INTO quotas (team_id, model, guaranteed, limit_units, per_user, used, \
                 updated_at, updated_by) VALUES ($1, 'H100-80GB', 7, 14, 7, 0, $2, $3)",
                &[V::U(s.team), V::D(now), V::U(admin)],
            )
            .await;
            exec(
                store,
                "INSERT INTO user_usage (team_id, model, user_id, used) \
                 VALUES ($1, 'H100-80GB', $2, 0)",
                &[V::U(s.team), V::U(member)],
            )
            .await;
            exec(
                store,
                "INSERT INTO allocations (id, team_id, user_id, kind, model, count, units, \
                 priority, purpose, state, duration_minutes, created_at, active_at, ends_at, \
                 devices, release_cause, idempotency_key) VALUES ($1, $2, $3, \
                 'H100-80GB:1g.10gb', 'H100-80GB', 1, 1, 'normal', 'old run', 'ended', 480, \
                 $4, $4, $5, '[]', 'released', 'k-upgrade')",
                &[
                    V::U(s.allocation),
                    V::U(s.team),
                    V::U(member),
                    V::D(hour),
                    V::D(hour + Duration::hours(1)),
                ],
            )
            .await;
            exec(
                store,
                "INSERT INTO allocation_events (allocation_id, seq, at, from_state, to_state, \
                 actor, note) VALUES ($1, 1, $2, NULL, 'queued', 'ada', 'requested')",
                &[V::U(s.allocation), V::D(hour)],
            )
            .await;
            exec(
                store,
                "INSERT INTO audit_log (id, at, actor, action, object_type, object_id, team_id, \
                 before, after) VALUES ($1, $2, 'root', 'quota.set', 'quota', 'H100-80GB', $3, \
                 NULL, '{\"limit\":14}')",
                &[V::U(Uuid::from_u128(30)), V::D(now), V::U(s.team)],
            )
            .await;
        }
        5 => {
            exec(
                store,
                "INSERT INTO rate_cards (id, kind, model, price_minor_per_hour, \
                 preemptible_discount_pct, effective_from, created_at, created_by) \
                 VALUES ($1, 'H100-80GB:1g.10gb', 'H100-80GB', 250, 50, $2, $2, $3)",
                &[
                    V::U(Uuid::from_u128(20)),
                    V::D(now - Duration::days(25)),
                    V::U(admin),
                ],
            )
            .await;
            exec(
                store,
                "INSERT INTO meter_hours (allocation_id, hour_start, day, team_id, user_id, kind, \
                 model, priority, count, resource_id, resource_name, wall_ms, gpu_ms, \
                 active_gpu_ms, samples, rate_id, list_minor, billed_minor, currency, txn_id, \
                 metered_at) VALUES ($1, $2, $3, $4, $5, 'H100-80GB:1g.10gb', 'H100-80GB', \
                 'normal', 1, 'MIG-u1', 'gpu-upgrade-1', 3600000, 514285, 0, 360, $6, $7, $7, \
                 'EUR', $8, $9)",
                &[
                    V::U(s.allocation),
                    V::D(hour),
                    V::T(hour.format("%Y-%m-%d").to_string()),
                    V::U(s.team),
                    V::U(member),
                    V::U(Uuid::from_u128(20)),
                    V::I(s.ledger_minor),
                    V::U(txn),
                    V::D(now),
                ],
            )
            .await;
            for (id, account, amount) in [
                (41u128, format!("team:{}", s.team), s.ledger_minor),
                (42, "platform".to_owned(), -s.ledger_minor),
            ] {
                exec(
                    store,
                    "INSERT INTO ledger_entries (id, txn_id, account, team_id, amount_minor, \
                     currency, entry_type, allocation_id, hour_start, posted_at, memo) \
                     VALUES ($1, $2, $3, $4, $5, 'EUR', 'charge', $6, $7, $8, NULL)",
                    &[
                        V::U(Uuid::from_u128(id)),
                        V::U(txn),
                        V::T(account),
                        V::U(s.team),
                        V::I(amount),
                        V::U(s.allocation),
                        V::D(hour),
                        V::D(now),
                    ],
                )
                .await;
            }
            exec(
                store,
                "INSERT INTO budgets (team_id, monthly_minor, hard, updated_at, updated_by) \
                 VALUES ($1, 100000, FALSE, $2, $3)",
                &[V::U(s.team), V::D(now), V::U(admin)],
            )
            .await;
            // Every hour of the ended allocation is metered.
            exec(store, "UPDATE allocations SET billing_closed = TRUE", &[]).await;
        }
        6 => {
            exec(
                store,
                "INSERT INTO workloads (id, kind, name, allocation_id, team_id, user_id, node_id, \
                 hostname, devices, state, command, exit_code, created_at, started_at, ended_at, \
                 log_stored, log_complete) VALUES ($1, 'job', 'train-old', $2, $3, $4, $5, \
                 'gpu-upgrade-1', '[]', 'succeeded', 'python train.py', 0, $6, $6, $7, 12, TRUE)",
                &[
                    V::U(s.workload),
                    V::U(s.allocation),
                    V::U(s.team),
                    V::U(member),
                    V::U(s.node),
                    V::D(hour),
                    V::D(hour + Duration::minutes(30)),
                ],
            )
            .await;
            exec(
                store,
                "INSERT INTO workload_logs (workload_id, offset_b, len_b, text) \
                 VALUES ($1, 0, 12, 'epoch 1 ok\n\n')",
                &[V::U(s.workload)],
            )
            .await;
        }
        7 => {
            exec(
                store,
                "INSERT INTO user_identities (issuer, subject, user_id, email, last_groups, \
                 grants_admin, created_at, last_login_at) VALUES ('https://idp.example', \
                 'sub-ada', $1, 'ada@example.org', '[\"vision\"]', FALSE, $2, $2)",
                &[V::U(member), V::D(now - Duration::days(10))],
            )
            .await;
        }
        8 => exec(store, "UPDATE nodes SET workload_sandbox = TRUE", &[]).await,
        9 => {
            exec(
                store,
                "INSERT INTO notebook_grants (secret_hash, kind, workload_id, user_id, issued_at, \
                 expires_at) VALUES ('grant-hash', 'cookie', $1, $2, $3, $4)",
                &[
                    V::U(s.workload),
                    V::U(member),
                    V::D(now),
                    V::D(now + Duration::hours(12)),
                ],
            )
            .await;
        }
        10 => {
            exec(
                store,
                "INSERT INTO server_replicas (name, version, started_at, seen_at, is_leader) \
                 VALUES ('old-replica', '0.0.0', $1, $1, FALSE)",
                &[V::D(now - Duration::hours(1))],
            )
            .await;
        }
        14 => {
            exec(
                store,
                "INSERT INTO notebook_profiles (id, team_id, name, kind, duration_minutes, \
                 created_at) VALUES ($1, $2, 'Small', 'H100-80GB:1g.10gb', 480, $3)",
                &[V::U(Uuid::from_u128(500)), V::U(s.team), V::D(now)],
            )
            .await;
        }
        19 => {
            let event = Uuid::from_u128(1900);
            exec(
                store,
                "INSERT INTO outbox_events (id, kind, team_id, subject_kind, subject_id, payload, \
                 fanned_out, created_at) VALUES ($1, 'workload.failed', $2, 'workload', $3, \
                 '{\"summary\":\"Your job failed\",\"path\":\"/workloads/x\"}', TRUE, $4)",
                &[V::U(event), V::U(s.team), V::U(s.workload), V::D(now)],
            )
            .await;
            exec(
                store,
                "INSERT INTO notification_deliveries (id, event_id, channel, recipient, state, \
                 attempts, next_try_at, sent_at, created_at) \
                 VALUES ($1, $2, 'email', $3, 'sent', 1, $4, $4, $4)",
                &[
                    V::U(Uuid::from_u128(1901)),
                    V::U(event),
                    V::U(member),
                    V::D(now),
                ],
            )
            .await;
            exec(
                store,
                "INSERT INTO notification_preferences (user_id, event_kind, mode) \
                 VALUES ($1, 'workload.succeeded', 'off')",
                &[V::U(member)],
            )
            .await;
            exec(
                store,
                "INSERT INTO team_webhooks (id, team_id, url, secret, created_at) \
                 VALUES ($1, $2, 'https://hooks.example.org/t', 'clear-secret', $3)",
                &[V::U(Uuid::from_u128(1902)), V::U(s.team), V::D(now)],
            )
            .await;
        }
        20 => {
            exec(
                store,
                "INSERT INTO drains (node_id, gpu_uuid, deadline, reason, created_at) \
                 VALUES ($1, 'GPU-upgrade-0', $2, 'firmware', $3)",
                &[V::U(s.node), V::D(now + Duration::hours(1)), V::D(now)],
            )
            .await;
            exec(
                store,
                "INSERT INTO gpu_health (node_id, gpu_uuid, xid_base, ecc_base) \
                 VALUES ($1, 'GPU-upgrade-0', 0, 0)",
                &[V::U(s.node)],
            )
            .await;
        }
        21 => {
            // A sealed token's text is opaque here: the row must survive, not open.
            exec(
                store,
                "INSERT INTO email_verifications (user_id, email, token, expires_at, created_at) \
                 VALUES ($1, 'member@example.org', 'sealed', $2, $3)",
                &[V::U(member), V::D(now + Duration::hours(24)), V::D(now)],
            )
            .await;
            exec(
                store,
                "INSERT INTO team_webhooks (id, team_id, url, secret, events, created_at) \
                 VALUES ($1, NULL, 'https://hooks.example.org/platform', 'sealed', '[]', $2)",
                &[V::U(Uuid::from_u128(2101)), V::D(now)],
            )
            .await;
        }
        22 => {
            exec(
                store,
                "INSERT INTO workload_attempts (workload_id, attempt, hostname, started_at, \
                 ended_at, exit_code, reason, preempted, gpu_ms) \
                 VALUES ($1, 1, 'gpu-upgrade', $2, $3, NULL, 'its allocation was preempted', TRUE, 60000)",
                &[V::U(s.workload), V::D(now - Duration::minutes(5)), V::D(now)],
            )
            .await;
        }
        23 => {
            exec(
                store,
                "INSERT INTO spares (model, gpus, percent, updated_by, updated_at) \
                 VALUES ('H100-80GB', 1, NULL, $1, $2)",
                &[V::U(member), V::D(now)],
            )
            .await;
        }
        24 => {
            exec(
                store,
                "INSERT INTO bookings (id, team_id, user_id, kind, model, count, units, \
                 starts_at, ends_at, purpose, created_at, cancelled_at, allocation_id) \
                 VALUES ($1, $2, $3, 'H100-80GB:whole', 'H100-80GB', 1, 7, $4, $5, 'upgrade', \
                 $6, NULL, $7)",
                &[
                    V::U(Uuid::from_u128(2401)),
                    V::U(s.team),
                    V::U(member),
                    V::D(now + Duration::days(1)),
                    V::D(now + Duration::days(1) + Duration::hours(2)),
                    V::D(now),
                    V::U(s.allocation),
                ],
            )
            .await;
            exec(
                store,
                "INSERT INTO booking_locks (model, n) VALUES ('H100-80GB', 1)",
                &[],
            )
            .await;
        }
        26 => {
            // The change feed is filled by its triggers: any write of an allocation.
            exec(
                store,
                "UPDATE allocations SET purpose = purpose WHERE id = $1",
                &[V::U(s.allocation)],
            )
            .await;
        }
        27 => {
            exec(
                store,
                "INSERT INTO image_catalog (id, team_id, name, reference, pinned, requires_cuda, \
                 added_by, created_at) VALUES ($1, $2, 'pytorch', 'reg.test/pt:1', \
                 'reg.test/pt@sha256:0000000000000000000000000000000000000000000000000000000000000000', \
                 '12.4', 'admin', $3)",
                &[V::U(Uuid::from_u128(2701)), V::U(s.team), V::D(now)],
            )
            .await;
            exec(
                store,
                "INSERT INTO registry_allowlist (entry, added_by, created_at) \
                 VALUES ('reg.test', 'admin', $1)",
                &[V::D(now)],
            )
            .await;
            exec(
                store,
                "INSERT INTO registry_logins (team_id, registry, username, secret, updated_at) \
                 VALUES ($1, 'reg.test', 'bot', 'sealed-or-clear', $2)",
                &[V::U(s.team), V::D(now)],
            )
            .await;
        }
        29 => {
            // A share, for migration 0030's `share_milli` (filled from the kind's text).
            exec(
                store,
                "INSERT INTO allocations (id, team_id, user_id, kind, model, count, units, \
                 priority, purpose, state, duration_minutes, created_at, devices) VALUES ($1, $2, \
                 (SELECT user_id FROM allocations WHERE id = $3), 'H100-80GB:share:250', \
                 'H100-80GB:shared', 1, 250, 'normal', 'old share', 'ended', 60, $4, '[]')",
                &[V::U(SHARE), V::U(s.team), V::U(s.allocation), V::D(now)],
            )
            .await;
        }
        _ => {}
    }
}

/// Row counts of every table the migrations made (not sqlx's own).
async fn row_counts(store: &Store) -> BTreeMap<String, i64> {
    let tables: Vec<String> = match store {
        Store::Sqlite(p) => {
            sqlx::query_scalar(
                "SELECT name FROM sqlite_master WHERE type = 'table' \
             AND name NOT LIKE 'sqlite_%' AND name NOT LIKE '_sqlx%'",
            )
            .fetch_all(p)
            .await
        }
        Store::Postgres(p) => {
            sqlx::query_scalar(
                "SELECT table_name::TEXT FROM information_schema.tables \
             WHERE table_schema = 'public' AND table_name NOT LIKE '_sqlx%'",
            )
            .fetch_all(p)
            .await
        }
    }
    .expect("tables");
    let mut counts = BTreeMap::new();
    for table in tables {
        let sql = format!("SELECT COUNT(*) FROM {table}");
        let n: i64 = match store {
            Store::Sqlite(p) => sqlx::query_scalar(&sql).fetch_one(p).await,
            Store::Postgres(p) => sqlx::query_scalar(&sql).fetch_one(p).await,
        }
        .expect("count");
        counts.insert(table, n);
    }
    counts
}

async fn a_previous_release_database_migrates_forward_with_every_row(db: Db) {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = match db {
        Db::Sqlite => format!("sqlite://{}/old.db?mode=rwc", dir.path().display()),
        Db::Postgres => fresh_pg_database().await,
    };
    let store = Store::connect(&url).await.expect("connect");
    let migrations = store.migrations();
    let (newest, _) = migrations.last().cloned().expect("migrations");
    let seeded = Seeded {
        admin_token: tessera_core::auth::secret::generate("tsk").0,
        team: Uuid::from_u128(100),
        node: Uuid::from_u128(200),
        allocation: Uuid::from_u128(300),
        workload: Uuid::from_u128(400),
        ledger_minor: 250,
    };
    let now = Utc::now();
    // The previous release: every migration but the newest, one at a time, each followed
    // by its rows.
    for (version, _) in migrations.iter().filter(|(v, _)| *v < newest) {
        store.migrate_to(*version).await.expect("migrate one step");
        seed(&store, *version, &seeded, now).await;
    }
    let before = row_counts(&store).await;
    let empty: Vec<&String> = before
        .iter()
        .filter(|(_, n)| **n == 0)
        .map(|(t, _)| t)
        .collect();
    assert!(
        empty.is_empty(),
        "tables without rows in the previous release's database (add rows in `seed`): {empty:?}"
    );
    store.close().await;

    // This release's server opens it and migrates forward.
    let app = TestApp::spawn_existing(url.clone()).await;
    let store = Store::connect(&url).await.expect("connect again");
    assert_eq!(
        store.schema_version().await.expect("version"),
        Some(newest),
        "migrated to the newest schema"
    );
    let after = row_counts(&store).await;
    for (table, n) in &before {
        let now_n = after.get(table).copied().unwrap_or(0);
        assert!(
            now_n >= *n,
            "{table}: {n} rows before the upgrade, {now_n} after"
        );
    }
    // A share's milli-GPU is a column since 0030, filled for the rows before it.
    let milli = match &store {
        Store::Sqlite(p) => {
            sqlx::query_scalar::<_, Option<i64>>(
                "SELECT share_milli FROM allocations WHERE id = $1",
            )
            .bind(SHARE)
            .fetch_one(p)
            .await
        }
        Store::Postgres(p) => {
            sqlx::query_scalar::<_, Option<i64>>(
                "SELECT share_milli FROM allocations WHERE id = $1",
            )
            .bind(SHARE)
            .fetch_one(p)
            .await
        }
    }
    .expect("share row");
    assert_eq!(milli, Some(250));
    store.close().await;

    // Each kind of object reads back through the API, with the old admin's token.
    let get = |path: String| {
        let (app_url, token) = (app.url(&path), seeded.admin_token.clone());
        async move {
            let r = reqwest::Client::new()
                .request(Method::GET, app_url)
                .bearer_auth(token)
                .send()
                .await
                .expect("request");
            let status = r.status().as_u16();
            let text = r.text().await.expect("body");
            assert_eq!(status, 200, "GET {path}: {text}");
            text
        }
    };
    let me = get("/api/v1/me".into()).await;
    assert!(me.contains("\"root\""), "{me}");
    let a = get(format!("/api/v1/allocations/{}", seeded.allocation)).await;
    assert!(a.contains("\"ended\"") && a.contains("old run"), "{a}");
    let w = get(format!("/api/v1/workloads/{}", seeded.workload)).await;
    assert!(w.contains("train-old") && w.contains("succeeded"), "{w}");
    let log = get(format!("/api/v1/workloads/{}/log.txt", seeded.workload)).await;
    assert!(log.contains("epoch 1 ok"), "{log}");
    let nodes = get("/api/v1/nodes".into()).await;
    assert!(nodes.contains("gpu-upgrade-1"), "{nodes}");
    let members = get(format!("/api/v1/teams/{}/members", seeded.team)).await;
    assert!(members.contains("ada"), "{members}");
    let quotas = get(format!("/api/v1/teams/{}/quotas", seeded.team)).await;
    assert!(quotas.contains("H100-80GB"), "{quotas}");
    let rates = get("/api/v1/rates".into()).await;
    assert!(rates.contains("250"), "{rates}");
    let budgets = get("/api/v1/budgets".into()).await;
    assert!(budgets.contains("100000"), "{budgets}");
    let ledger = get(format!(
        "/api/v1/ledger?team={}&from={}&to={}",
        seeded.team,
        (now - Duration::days(1)).format("%Y-%m-%d"),
        (now + Duration::days(1)).format("%Y-%m-%d")
    ))
    .await;
    assert!(
        ledger.contains(&seeded.allocation.to_string()),
        "the ledger entry is listed: {ledger}"
    );
    let audit = get("/api/v1/audit".into()).await;
    assert!(audit.contains("quota.set"), "{audit}");
    let joins = get("/api/v1/join-tokens".into()).await;
    assert!(joins.contains("rack 4"), "{joins}");
    drop(app);
}
