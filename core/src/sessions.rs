//! Browser sessions: tower-sessions over a SQL store in the application database.
//!
//! The session holds only the user id, the sign-in instant and the session's birth; the
//! principal is re-read from the database on every request, so disabling a user or changing
//! a password takes effect at once.
//!
//! The table never holds a cookie's value: [`AnySessionStore`] stores each session under a
//! hash of its id ([`stored_id`]), so a copy of the database (a backup) names no session
//! anyone could present. Sessions stored by a release before this one were keyed by the
//! cookie value itself; migration 0018 drops them (everyone signs in once more).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};
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

/// The id a session is stored under: the first 128 bits of a SHA-256 over the cookie's id.
/// The cookie's id is 128 random bits, so the hash needs no salt or stretching to be
/// irreversible, and the same cookie always finds its row.
pub fn stored_id(cookie: &Id) -> Id {
    let digest = Sha256::new()
        .chain_update(b"tessera session\0")
        .chain_update(cookie.0.to_le_bytes())
        .finalize();
    let mut half = [0u8; 16];
    half.copy_from_slice(&digest[..16]);
    Id(i128::from_le_bytes(half))
}

/// `record` as stored: under the hash of its id.
fn stored(record: &Record) -> Record {
    Record {
        id: stored_id(&record.id),
        ..record.clone()
    }
}

#[async_trait]
impl SessionStore for AnySessionStore {
    async fn create(&self, record: &mut Record) -> session_store::Result<()> {
        loop {
            let mut row = stored(record);
            on_store!(self, s => s.create(&mut row).await)?;
            if row.id == stored_id(&record.id) {
                return Ok(());
            }
            // The hash was taken (the SQL store moved the row to a random id that no cookie
            // hashes to): drop that row and draw another cookie id.
            on_store!(self, s => s.delete(&row.id).await)?;
            record.id = Id::default();
        }
    }
    async fn save(&self, record: &Record) -> session_store::Result<()> {
        let row = stored(record);
        on_store!(self, s => s.save(&row).await)
    }
    async fn load(&self, id: &Id) -> session_store::Result<Option<Record>> {
        let row = on_store!(self, s => s.load(&stored_id(id)).await)?;
        Ok(row.map(|r| Record { id: *id, ..r }))
    }
    async fn delete(&self, id: &Id) -> session_store::Result<()> {
        on_store!(self, s => s.delete(&stored_id(id)).await)
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

#[cfg(test)]
mod tests {
    use super::*;
    use tower_sessions::cookie::time::{Duration, OffsetDateTime};

    async fn stored_ids(store: &Store) -> Vec<String> {
        let Store::Sqlite(p) = store else {
            unreachable!("an in-memory SQLite store")
        };
        sqlx::query_scalar("SELECT id FROM tower_sessions")
            .fetch_all(p)
            .await
            .expect("ids")
    }

    #[tokio::test]
    async fn the_table_holds_a_hash_of_the_cookie_never_the_cookie() {
        let store = Store::connect("sqlite::memory:").await.expect("store");
        let sessions = AnySessionStore::new(&store).await.expect("sessions");
        let mut record = Record {
            id: Id::default(),
            data: [("uid".to_owned(), serde_json::json!("someone"))].into(),
            expiry_date: OffsetDateTime::now_utc() + Duration::hours(1),
        };
        sessions.create(&mut record).await.expect("create");
        let cookie = record.id;
        assert_eq!(
            stored_ids(&store).await,
            vec![stored_id(&cookie).to_string()]
        );
        assert_ne!(stored_id(&cookie), cookie);

        // The cookie finds its session; the stored id, presented as a cookie, finds nothing.
        let loaded = sessions.load(&cookie).await.expect("load").expect("found");
        assert_eq!(loaded.id, cookie);
        assert_eq!(loaded.data, record.data);
        assert!(
            sessions
                .load(&stored_id(&cookie))
                .await
                .expect("load")
                .is_none()
        );

        // Saving (activity) keeps one row under the hash; deleting (sign-out) removes it.
        sessions.save(&loaded).await.expect("save");
        assert_eq!(stored_ids(&store).await.len(), 1);
        sessions.delete(&cookie).await.expect("delete");
        assert!(stored_ids(&store).await.is_empty());
        assert!(sessions.load(&cookie).await.expect("load").is_none());
    }
}
