//! The only place with SQL.
//!
//! One [`Store`] over two backends: SQLite (the embedded default) and PostgreSQL
//! (production). Queries are written once, in the dialect both share (`$1` placeholders,
//! `RETURNING`, `ON CONFLICT`), and [`on_pool!`] runs the same code against whichever pool
//! is configured. A backend-specific branch appears only where the dialects really differ.

mod admission;
mod allocations;
mod audit;
mod billing;
mod bookings;
mod changes;
mod drains;
mod health;
mod images;
mod leader;
mod node_state;
mod nodes;
pub(crate) mod outbox;
mod spares;
mod sso;
mod teams;
mod tokens;
mod users;
mod workloads;

pub use admission::{Admit, Admitted, Line, OpenAllocation, Standing};
pub use allocations::{
    AllocationListRow, AllocationRow, Change, EventRow, Inserted, QuotaRow, Transition,
};
pub use billing::{BudgetRow, ChargeRow, LedgerRow, MeterRow, RateRow, UsageGroupRow};
pub use bookings::{BookingListRow, BookingRow, BookingStanding};
pub use drains::DrainRow;
pub use health::HealthRow;
pub use images::{CatalogRow, LoginRow};
pub use leader::{Coordination, Lease, NodeListener, ReplicaRow, WakeListener, sqlite_file};
pub use node_state::{
    ApplyStatusRow, DesiredRow, DesiredWithStatus, HeldShareRow, NodeLatestSampleRow, SampleRow,
};
pub use nodes::{Beat, NodeRow};
pub use outbox::{
    Deliveries, DeliveryRow, EmailVerification, NewDelivery, NewEvent, OutboxRow, Recipient,
    WebhookRow,
};
pub use spares::SpareRow;
pub use sso::{NO_PASSWORD, SsoChanges, SsoOutcome, SsoSignIn};
pub use teams::{ChangeOutcome, MemberRow, TeamListRow, TeamRow};
pub use tokens::{ApiTokenRow, JoinTokenRow};
pub use users::UserRow;
pub use workloads::{LogChunkRow, ProfileRow, WorkloadChange, WorkloadListRow, WorkloadRow};

use anyhow::Context;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{PgPool, SqlitePool};
use std::str::FromStr;
use std::time::Duration;
use uuid::Uuid;

/// The domain's state sets as SQL lists, for `concat!` into statements: written once here,
/// held to [`AllocState::LIVE`] and [`AllocState::ON_NODE`] by a test.
///
/// [`AllocState::LIVE`]: tessera_domain::alloc::AllocState::LIVE
/// [`AllocState::ON_NODE`]: tessera_domain::alloc::AllocState::ON_NODE
macro_rules! live_states {
    () => {
        "('queued', 'placing', 'active', 'releasing')"
    };
}
macro_rules! on_node_states {
    () => {
        "('placing', 'active', 'releasing')"
    };
}
pub(crate) use {live_states, on_node_states};

/// A column's raw value, read only to be handed to a parser or a typed id
/// (`#[sqlx(try_from = "…")]`): `$t` wraps the `$inner` the driver decodes from a `$column`
/// column (text unless named).
macro_rules! text_column {
    ($(#[$doc:meta])* $t:ident($inner:ty)) => {
        text_column!($(#[$doc])* $t($inner) as String);
    };
    ($(#[$doc:meta])* $t:ident($inner:ty) as $column:ty) => {
        $(#[$doc])*
        pub struct $t($inner);

        impl<DB: sqlx::Database> sqlx::Type<DB> for $t
        where
            $column: sqlx::Type<DB>,
        {
            fn type_info() -> DB::TypeInfo {
                <$column as sqlx::Type<DB>>::type_info()
            }
            fn compatible(ty: &DB::TypeInfo) -> bool {
                <$column as sqlx::Type<DB>>::compatible(ty)
            }
        }

        impl<'r, DB: sqlx::Database> sqlx::Decode<'r, DB> for $t
        where
            $inner: sqlx::Decode<'r, DB>,
        {
            fn decode(
                v: <DB as sqlx::Database>::ValueRef<'r>,
            ) -> Result<Self, sqlx::error::BoxDynError> {
                Ok($t(<$inner as sqlx::Decode<'r, DB>>::decode(v)?))
            }
        }
    };
}

text_column!(
    /// A nullable text column read as `Option<T>` through `T`'s parser
    /// (`#[sqlx(try_from = "NullableText")]`): the nullable twin of the domain's
    /// `stored_as_text!`, so a value no release wrote fails the read instead of becoming
    /// `None`.
    NullableText(Option<String>)
);

text_column!(
    /// A text column holding JSON, read as its Rust type (`#[sqlx(try_from = "JsonText")]`):
    /// a document that does not parse fails the read instead of becoming an empty list.
    JsonText(String)
);

text_column!(
    /// A nullable UUID column read as a typed id (`#[sqlx(try_from = "NullableId")]`).
    NullableId(Option<Uuid>) as Uuid
);

macro_rules! nullable_id_as {
    ($($t:ty),* $(,)?) => {
        $(impl From<NullableId> for Option<$t> {
            fn from(v: NullableId) -> Self {
                v.0.map(<$t>::from)
            }
        })*
    };
}

nullable_id_as!(
    tessera_domain::ids::AllocationId,
    tessera_domain::ids::WorkloadId,
    tessera_domain::ids::NodeId,
    tessera_domain::ids::TeamId,
    tessera_domain::ids::UserId,
);

macro_rules! json_as {
    ($($t:ty),* $(,)?) => {
        $(impl TryFrom<JsonText> for $t {
            type Error = serde_json::Error;
            fn try_from(v: JsonText) -> Result<Self, Self::Error> {
                serde_json::from_str(&v.0)
            }
        })*
    };
}

json_as!(
    Vec<String>,
    Vec<tessera_domain::alloc::AllocatedDevice>,
    Vec<tessera_domain::wire::DesiredInstance>,
    tessera_domain::wire::TelemetrySample,
    tessera_domain::wire::ApplyStatus,
);

/// Nullable JSON columns: an agent's apply status, a node's newest sample (`None`: none).
macro_rules! nullable_json_as {
    ($($t:ty),* $(,)?) => {
        $(impl TryFrom<NullableText> for Option<$t> {
            type Error = serde_json::Error;
            fn try_from(v: NullableText) -> Result<Self, Self::Error> {
                v.0.map(|s| serde_json::from_str(&s)).transpose()
            }
        })*
    };
}

nullable_json_as!(
    tessera_domain::wire::ApplyStatus,
    tessera_domain::wire::TelemetrySample,
);

macro_rules! nullable_as {
    ($($t:ty),* $(,)?) => {
        $(impl TryFrom<NullableText> for Option<$t> {
            type Error = tessera_domain::error::AppError;
            fn try_from(v: NullableText) -> Result<Self, Self::Error> {
                v.0.map(<$t>::try_from).transpose()
            }
        })*
    };
}

nullable_as!(
    tessera_domain::alloc::Approver,
    tessera_domain::alloc::ReleaseCause,
    tessera_domain::alloc::PreemptCause,
    tessera_domain::alloc::Ranks,
    tessera_domain::wire::GangLauncher,
    tessera_domain::workload::WorkloadState,
    tessera_domain::drain::DeadlineCause,
    tessera_domain::wire::ShareMethod,
);

impl TryFrom<NullableText> for Option<tessera_domain::image::CudaVersion> {
    type Error = tessera_domain::error::AppError;
    fn try_from(v: NullableText) -> Result<Self, Self::Error> {
        v.0.map(|s| tessera_domain::image::CudaVersion::parse(&s))
            .transpose()
    }
}

/// A connection pool to one of the supported databases.
#[derive(Clone, Debug)]
pub enum Store {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// Runs `$body` with `$pool` bound to the concrete pool, whichever backend is configured.
macro_rules! on_pool {
    ($store:expr, $pool:ident => $body:expr) => {
        match $store {
            $crate::store::Store::Sqlite($pool) => $body,
            $crate::store::Store::Postgres($pool) => $body,
        }
    };
}

pub(crate) use on_pool;

/// [`on_pool!`] in one transaction: `$body` runs with `$tx` open, and the transaction
/// commits once the body has its value. A `?` or `return` in the body leaves without
/// committing: the transaction rolls back when dropped.
macro_rules! in_tx {
    ($store:expr, $tx:ident => $body:block) => {
        $crate::store::on_pool!($store, pool => {
            let mut $tx = pool.begin().await?;
            let out = $body;
            $tx.commit().await?;
            Ok(out)
        })
    };
}
pub(crate) use in_tx;

/// [`on_pool!`] for a body that yields the driver's result, answered as the store's
/// ([`from_driver`]).
macro_rules! db {
    ($store:expr, $pool:ident => $body:expr) => {
        $crate::store::from_driver($crate::store::on_pool!($store, $pool => $body))
    };
}
pub(crate) use db;

/// `$n, $n+1, …` for `len` values starting at `first`.
pub(crate) fn placeholders(first: usize, len: usize) -> String {
    (first..first + len)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// A value written to a JSON text column (the write side of [`JsonText`]).
pub(crate) fn json_text<T: serde::Serialize + ?Sized>(v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError(sqlx::Error::Encode(Box::new(e))))
}

/// The driver's result as the store answers it.
pub(crate) fn from_driver<T>(r: Result<T, sqlx::Error>) -> Result<T, StoreError> {
    r.map_err(StoreError)
}

static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");
static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

impl Store {
    /// Connects to `url` (`sqlite:…` or `postgres://…`). For SQLite the file and its folder
    /// are created when missing.
    pub async fn connect(url: &str) -> anyhow::Result<Store> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let opts = PgConnectOptions::from_str(url).context("invalid PostgreSQL URL")?;
            let pool = PgPoolOptions::new()
                .max_connections(16)
                .acquire_timeout(Duration::from_secs(10))
                .connect_with(opts)
                .await
                .context("cannot connect to PostgreSQL")?;
            Ok(Store::Postgres(pool))
        } else if url.starts_with("sqlite:") {
            let opts = SqliteConnectOptions::from_str(url)
                .context("invalid SQLite URL")?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal)
                .foreign_keys(true)
                .busy_timeout(Duration::from_secs(10))
                // 16 MiB of page cache per connection (SQLite's default is 2 MiB): big
                // scans such as the chargeback export stay in memory.
                .pragma("cache_size", "-16384");
            let path = opts.get_filename().to_path_buf();
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("cannot create database folder {}", dir.display()))?;
            }
            let pool = SqlitePoolOptions::new()
                .max_connections(8)
                .connect_with(opts)
                .await
                .with_context(|| format!("cannot open SQLite database {}", path.display()))?;
            Ok(Store::Sqlite(pool))
        } else {
            anyhow::bail!("must start with sqlite: or postgres://")
        }
    }

    /// Applies pending migrations for this backend.
    pub async fn migrate(&self) -> anyhow::Result<()> {
        on_pool!(self, pool => self.migrator().run(pool).await)?;
        Ok(())
    }

    /// This backend's migrations: (version, description), oldest first.
    pub fn migrations(&self) -> Vec<(i64, String)> {
        self.migrator()
            .iter()
            .map(|m| (m.version, m.description.to_string()))
            .collect()
    }

    /// Applies this backend's migrations up to and including `version`, no further: the
    /// upgrade test builds the previous release's database with it, step by step.
    pub async fn migrate_to(&self, version: i64) -> anyhow::Result<()> {
        let upto = sqlx::migrate::Migrator {
            migrations: std::borrow::Cow::Owned(
                self.migrator()
                    .iter()
                    .filter(|m| m.version <= version)
                    .cloned()
                    .collect(),
            ),
            ..sqlx::migrate::Migrator::DEFAULT
        };
        match self {
            Store::Sqlite(p) => upto.run(p).await?,
            Store::Postgres(p) => upto.run(p).await?,
        }
        Ok(())
    }

    fn migrator(&self) -> &'static sqlx::migrate::Migrator {
        match self {
            Store::Sqlite(_) => &SQLITE_MIGRATIONS,
            Store::Postgres(_) => &POSTGRES_MIGRATIONS,
        }
    }

    /// Writes a consistent copy of the SQLite database to `path` while it is in use
    /// (`VACUUM INTO`: one read transaction, so the copy is one moment of the database,
    /// every committed write before it included). PostgreSQL has `pg_dump` for this.
    pub async fn backup_to(&self, path: &std::path::Path) -> anyhow::Result<()> {
        let Store::Sqlite(pool) = self else {
            anyhow::bail!(
                "tessera backup copies the SQLite store; for PostgreSQL use pg_dump (README: Backups)"
            );
        };
        anyhow::ensure!(
            !path.exists(),
            "{} exists already; choose a new file",
            path.display()
        );
        let target = path
            .to_str()
            .context("the backup path must be valid UTF-8")?;
        sqlx::query("VACUUM INTO $1")
            .bind(target)
            .execute(pool)
            .await
            .with_context(|| format!("writing the backup {}", path.display()))?;
        Ok(())
    }

    /// The newest migration a database has: a backup is checked with it before a restore.
    pub async fn schema_version(&self) -> Result<Option<i64>, StoreError> {
        db!(self, pool => sqlx::query_scalar::<_, Option<i64>>(
            "SELECT MAX(version) FROM _sqlx_migrations WHERE success")
            .fetch_one(pool).await)
    }

    /// Closes every connection (a SQLite file is then complete on disk, WAL checkpointed).
    pub async fn close(&self) {
        on_pool!(self, pool => pool.close().await)
    }

    /// `SELECT 1`: used by `/readyz`.
    pub async fn ping(&self) -> Result<(), StoreError> {
        db!(self, pool => sqlx::query("SELECT 1").execute(pool).await.map(|_| ()))
    }

    /// Creates a new, empty database on the PostgreSQL server at `url` and returns its URL
    /// (benchmarks and tests use one each, so runs never see each other's rows).
    pub async fn create_postgres_database(url: &str) -> anyhow::Result<String> {
        use sqlx::Connection;
        let name = format!("tessera_scratch_{}", uuid::Uuid::new_v4().simple());
        let mut conn = sqlx::PgConnection::connect(url).await?;
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await?;
        let base = url.rsplit_once('/').map_or(url, |(b, _)| b);
        Ok(format!("{base}/{name}"))
    }

    pub fn backend_name(&self) -> &'static str {
        match self {
            Store::Sqlite(_) => "sqlite",
            Store::Postgres(_) => "postgres",
        }
    }
}

/// What went wrong in the database. Services see this type, never the driver's: they log
/// it and answer Internal (`services::internal`). The driver's error stays inside the
/// store, which is the only place that knows which database it talks to.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct StoreError(#[from] sqlx::Error);

impl StoreError {
    /// A stored value no release wrote (a state that does not parse, JSON that does not
    /// read): the data is wrong, not the connection.
    pub fn is_bad_data(&self) -> bool {
        matches!(
            self.0,
            sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_)
        )
    }
}

/// A text column read as a domain enum: a value no release wrote is a decode error, like a
/// column of the wrong type, never a quiet fallback.
pub(crate) fn decoded<T>(text: String) -> Result<T, StoreError>
where
    T: TryFrom<String, Error = tessera_domain::error::AppError>,
{
    T::try_from(text).map_err(|e| StoreError(undecodable(e)))
}

/// A stored value no release wrote (out of range, not the shape it should be), as the
/// driver's decode error: the read fails like one of a column of the wrong type.
pub(crate) fn undecodable(e: impl std::error::Error + Send + Sync + 'static) -> sqlx::Error {
    sqlx::Error::Decode(Box::new(e))
}

#[cfg(test)]
mod tests {
    use tessera_domain::alloc::AllocState;

    fn sql_list(states: &[AllocState]) -> String {
        let quoted: Vec<String> = states.iter().map(|s| format!("'{}'", s.as_str())).collect();
        format!("({})", quoted.join(", "))
    }

    #[test]
    fn the_sql_state_sets_are_the_domains() {
        assert_eq!(live_states!(), sql_list(&AllocState::LIVE));
        assert_eq!(on_node_states!(), sql_list(&AllocState::ON_NODE));
    }
}
