//! Which replica runs the background passes, and how the others wake it.
//!
//! On PostgreSQL the leader holds a session-level advisory lock on a connection of its own
//! ([`Lease`]): PostgreSQL releases it the moment that connection ends, so a leader that
//! crashes, is killed or loses the database loses the lock with it, and the next replica's
//! `pg_try_advisory_lock` succeeds. A leader checks its connection before every pass and
//! every second, and stops its passes once the check fails. On SQLite there is one process
//! (the server holds an exclusive lock on the database's lock file), which always leads.
//!
//! Replicas that do not lead forward "something changed" to the leader with
//! `NOTIFY tessera_wake`; the leader `LISTEN`s and runs its scheduler pass at once.

use super::{Store, StoreError, db, from_driver, in_tx};
use chrono::{DateTime, Utc};
use sqlx::Connection;
use sqlx::postgres::{PgConnection, PgListener};
use std::path::PathBuf;
use std::time::Duration;

/// The advisory lock's key: "tessera" in ASCII.
const LEADER_KEY: i64 = 0x0074_6573_7365_7261;
const WAKE_CHANNEL: &str = "tessera_wake";
/// "Something changed for node N" between replicas (payload `<epoch> <node id>`), for the
/// agents' long polls (`crate::signals`).
const NODE_CHANNEL: &str = "tessera_node";

/// The store as the server's replicas coordinate through it: the leader lease, wake-ups
/// between replicas and the readiness check. Nothing here reads or writes the product's
/// rows: those go through the services, which authorize.
#[derive(Clone)]
pub struct Coordination(Store);

impl Coordination {
    pub(crate) fn new(store: Store) -> Self {
        Coordination(store)
    }

    /// `SELECT 1`: used by `/readyz`.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.0.ping().await
    }

    /// `sqlite` or `postgres`.
    pub fn backend_name(&self) -> &'static str {
        self.0.backend_name()
    }
}

/// Proof of leadership, valid while [`Lease::holds`] says so.
pub enum Lease {
    /// The connection that holds the advisory lock.
    Postgres(PgConnection),
    /// The only process on this database.
    Sqlite,
}

impl Lease {
    /// Whether the lease still holds: the lock's connection answers within two seconds
    /// (the lock lives exactly as long as the connection).
    pub async fn holds(&mut self) -> bool {
        match self {
            Lease::Sqlite => true,
            Lease::Postgres(conn) => matches!(
                tokio::time::timeout(
                    Duration::from_secs(2),
                    sqlx::query("SELECT 1").execute(&mut *conn)
                )
                .await,
                Ok(Ok(_))
            ),
        }
    }

    /// Gives the lease up at once (a replica shutting down), so another takes over without
    /// waiting for the connection to time out.
    pub async fn release(self) {
        if let Lease::Postgres(mut conn) = self {
            let _ = sqlx::query("SELECT pg_advisory_unlock($1)")
                .bind(LEADER_KEY)
                .execute(&mut conn)
                .await;
            let _ = conn.close().await;
        }
    }
}

/// Wake-ups sent by other replicas (PostgreSQL only).
pub struct WakeListener(PgListener);

impl WakeListener {
    /// Waits for the next wake-up.
    pub async fn next(&mut self) -> Result<(), StoreError> {
        from_driver(self.0.recv().await.map(|_| ()))
    }
}

impl Coordination {
    /// Tries to become the leader; `Ok(None)` while another replica leads.
    pub async fn try_lead(&self) -> Result<Option<Lease>, StoreError> {
        match &self.0 {
            Store::Sqlite(_) => Ok(Some(Lease::Sqlite)),
            Store::Postgres(pool) => {
                let opts = pool.connect_options();
                let mut conn = PgConnection::connect_with(&opts).await?;
                let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
                    .bind(LEADER_KEY)
                    .fetch_one(&mut conn)
                    .await?;
                if got {
                    Ok(Some(Lease::Postgres(conn)))
                } else {
                    let _ = conn.close().await;
                    Ok(None)
                }
            }
        }
    }

    /// Tells the leader that something changed (no-op on SQLite, where this is the leader).
    pub async fn notify_wake(&self) -> Result<(), StoreError> {
        match &self.0 {
            Store::Sqlite(_) => Ok(()),
            Store::Postgres(pool) => from_driver(
                sqlx::query("SELECT pg_notify($1, '')")
                    .bind(WAKE_CHANNEL)
                    .execute(pool)
                    .await
                    .map(|_| ()),
            ),
        }
    }

    /// Listens for other replicas' wake-ups; `None` on SQLite (one process).
    pub async fn wake_listener(&self) -> Result<Option<WakeListener>, StoreError> {
        match &self.0 {
            Store::Sqlite(_) => Ok(None),
            Store::Postgres(pool) => {
                let mut l = PgListener::connect_with(pool).await?;
                l.listen(WAKE_CHANNEL).await?;
                Ok(Some(WakeListener(l)))
            }
        }
    }
}

/// Other replicas' node wake-ups (PostgreSQL only).
pub struct NodeListener(PgListener);

impl NodeListener {
    /// The next payload (`<epoch> <node id>`).
    pub async fn next(&mut self) -> Result<String, StoreError> {
        from_driver(self.0.recv().await.map(|n| n.payload().to_owned()))
    }
}

impl Coordination {
    /// Tells the other replicas that something changed for a node (no-op on SQLite).
    pub async fn notify_node(&self, payload: &str) -> Result<(), StoreError> {
        match &self.0 {
            Store::Sqlite(_) => Ok(()),
            Store::Postgres(pool) => from_driver(
                sqlx::query("SELECT pg_notify($1, $2)")
                    .bind(NODE_CHANNEL)
                    .bind(payload)
                    .execute(pool)
                    .await
                    .map(|_| ()),
            ),
        }
    }

    /// Listens for other replicas' node wake-ups; `None` on SQLite (one process).
    pub async fn node_listener(&self) -> Result<Option<NodeListener>, StoreError> {
        match &self.0 {
            Store::Sqlite(_) => Ok(None),
            Store::Postgres(pool) => {
                let mut l = PgListener::connect_with(pool).await?;
                l.listen(NODE_CHANNEL).await?;
                Ok(Some(NodeListener(l)))
            }
        }
    }
}

impl Store {
    /// Ends the database connection that holds the leader lock, as a crash or a network
    /// cut would (tests and operators: `pg_terminate_backend`). `false` when none does.
    pub async fn terminate_leader_connection(&self) -> Result<bool, StoreError> {
        let Store::Postgres(pool) = self else {
            return Ok(false);
        };
        // A bigint advisory key shows as classid (high 32 bits) and objid (low 32 bits).
        let ended: Option<bool> = sqlx::query_scalar(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' \
             AND classid::bigint = ($1 >> 32) AND objid::bigint = ($1 & 4294967295) \
             AND granted AND database = (SELECT oid FROM pg_database \
             WHERE datname = current_database())",
        )
        .bind(LEADER_KEY)
        .fetch_optional(pool)
        .await?;
        Ok(ended.unwrap_or(false))
    }
}

/// A server process's row in `server_replicas`.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ReplicaRow {
    pub name: String,
    pub version: String,
    pub started_at: DateTime<Utc>,
    pub seen_at: DateTime<Utc>,
    pub is_leader: bool,
}

impl Store {
    /// Records that `replica` is alive at `now` and whether it leads. A replica that leads
    /// clears every other row's mark (theirs is stale: one lease, one leader), and rows not
    /// refreshed for a day are forgotten.
    pub async fn report_replica(&self, r: &ReplicaRow) -> Result<(), StoreError> {
        in_tx!(self, tx => {
            sqlx::query(
                "INSERT INTO server_replicas (name, version, started_at, seen_at, is_leader) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (name) DO UPDATE SET \
                 version = excluded.version, seen_at = excluded.seen_at, \
                 is_leader = excluded.is_leader")
                .bind(&r.name).bind(&r.version).bind(r.started_at).bind(r.seen_at)
                .bind(r.is_leader)
                .execute(&mut *tx).await?;
            if r.is_leader {
                sqlx::query("UPDATE server_replicas SET is_leader = FALSE \
                             WHERE name <> $1 AND is_leader")
                    .bind(&r.name).execute(&mut *tx).await?;
            }
            sqlx::query("DELETE FROM server_replicas WHERE seen_at < $1")
                .bind(r.seen_at - chrono::Duration::days(1))
                .execute(&mut *tx).await?;
        })
    }

    /// A replica that stops removes its row.
    pub async fn remove_replica(&self, name: &str) -> Result<(), StoreError> {
        db!(self, pool => sqlx::query("DELETE FROM server_replicas WHERE name = $1")
            .bind(name).execute(pool).await.map(|_| ()))
    }

    /// Every replica heard from since `since`, by name.
    pub async fn replicas(&self, since: DateTime<Utc>) -> Result<Vec<ReplicaRow>, StoreError> {
        db!(self, pool => sqlx::query_as::<_, ReplicaRow>(
            "SELECT name, version, started_at, seen_at, is_leader FROM server_replicas \
             WHERE seen_at >= $1 ORDER BY name")
            .bind(since).fetch_all(pool).await)
    }
}

/// The SQLite database file a `sqlite:` URL names (`None` for PostgreSQL or in-memory).
pub fn sqlite_file(url: &str) -> Option<PathBuf> {
    use std::str::FromStr;
    if !url.starts_with("sqlite:") || url.contains(":memory:") {
        return None;
    }
    sqlx::sqlite::SqliteConnectOptions::from_str(url)
        .ok()
        .map(|o| o.get_filename().to_path_buf())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_sqlite_file_comes_from_the_url() {
        assert_eq!(
            super::sqlite_file("sqlite://data/tessera.db?mode=rwc"),
            Some("data/tessera.db".into())
        );
        assert_eq!(super::sqlite_file("sqlite::memory:"), None);
        assert_eq!(super::sqlite_file("postgres://u@h/db"), None);
    }
}
