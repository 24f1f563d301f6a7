//! Browser sessions: tower-sessions over a SQL store in the application database.
//!
//! The session holds only the user id, the sign-in instant and the session's birth; the
//! principal is re-read from the database on every request, so disabling a user or changing
//! a password takes effect at once.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tower_sessions::Session;
use tower_sessions::session::{Id, Record};
use tower_sessions::session_store::{self, ExpiredDeletion, SessionStore};
use tower_sessions_sqlx_store::{PostgresStore, SqliteStore};

use crate::store::Store;

const USER_ID: &str = "uid";
const SIGNED_IN_AT: &str = "signed_in_at";

/// Whichever SQL session store matches the configured database.
#[derive(Debug, Clone)]
pub enum AnySessionStore {
    Sqlite(SqliteStore),
    Postgres(PostgresStore),
}

impl AnySessionStore {
    pub async fn new(store: &Store) -> anyhow::Result<Self> {
        let s = match store {
            Store::Sqlite(p) => {
                let s = SqliteStore::new(p.clone());
                s.migrate().await?;
                AnySessionStore::Sqlite(s)
            }
            Store::Postgres(p) => {
                let s = PostgresStore::new(p.clone());
                s.migrate().await?;
                AnySessionStore::Postgres(s)
            }
        };
        Ok(s)
    }
}

macro_rules! on_store {
    ($self:expr, $s:ident => $body:expr) => {
        match $self {
            AnySessionStore::Sqlite($s) => $body,
            AnySessionStore::Postgres($s) => $body,
        }
    };
}

#[async_trait]
impl SessionStore for AnySessionStore {
    async fn create(&self, record: &mut Record) -> session_store::Result<()> {
        on_store!(self, s => s.create(record).await)
    }
    async fn save(&self, record: &Record) -> session_store::Result<()> {
        on_store!(self, s => s.save(record).await)
    }
    async fn load(&self, id: &Id) -> session_store::Result<Option<Record>> {
        on_store!(self, s => s.load(id).await)
    }
    async fn delete(&self, id: &Id) -> session_store::Result<()> {
        on_store!(self, s => s.delete(id).await)
    }
}

#[async_trait]
impl ExpiredDeletion for AnySessionStore {
    async fn delete_expired(&self) -> session_store::Result<()> {
        on_store!(self, s => s.delete_expired().await)
    }
}

/// Cookie name: `__Host-` (which browsers only accept with `Secure`, `Path=/` and no
/// `Domain`) when served over https.
pub fn cookie_name(secure: bool) -> &'static str {
    if secure {
        "__Host-tessera_session"
    } else {
        "tessera_session"
    }
}

/// What a signed-in session records.
#[derive(Debug, Clone, Copy)]
pub struct SessionUser {
    pub user_id: uuid::Uuid,
    pub signed_in_at: DateTime<Utc>,
}

/// Reads the session's user; `None` when anonymous or past the absolute timeout (the session
/// is then deleted).
pub async fn read(
    session: &Session,
    absolute: std::time::Duration,
    now: DateTime<Utc>,
) -> Result<Option<SessionUser>, tower_sessions::session::Error> {
    let Some(user_id) = session.get::<uuid::Uuid>(USER_ID).await? else {
        return Ok(None);
    };
    let Some(signed_in_at) = session.get::<DateTime<Utc>>(SIGNED_IN_AT).await? else {
        return Ok(None);
    };
    let limit = chrono::Duration::from_std(absolute).unwrap_or(chrono::Duration::days(1));
    if now - signed_in_at > limit {
        session.flush().await?;
        return Ok(None);
    }
    Ok(Some(SessionUser {
        user_id,
        signed_in_at,
    }))
}

/// Starts a signed-in session under a fresh id (defeats session fixation).
pub async fn sign_in(
    session: &Session,
    user: SessionUser,
) -> Result<(), tower_sessions::session::Error> {
    session.cycle_id().await?;
    session.insert(USER_ID, user.user_id).await?;
    session.insert(SIGNED_IN_AT, user.signed_in_at).await?;
    Ok(())
}

/// Deletes the session on the server and clears the cookie.
pub async fn sign_out(session: &Session) -> Result<(), tower_sessions::session::Error> {
    session.flush().await
}
