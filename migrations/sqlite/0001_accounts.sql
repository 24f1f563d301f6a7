-- Accounts: local users with argon2id password hashes.
--
-- Ids are UUIDs (sqlx stores them as 16-byte BLOBs in SQLite, native UUID in PostgreSQL).
-- Timestamps are RFC 3339 text in SQLite and TIMESTAMPTZ in PostgreSQL; sqlx maps both to
-- chrono::DateTime<Utc>.
CREATE TABLE users (
    id                  BLOB PRIMARY KEY NOT NULL,
    -- Lowercase, validated by domain::account::Username.
    username            TEXT NOT NULL UNIQUE,
    -- PHC string: $argon2id$v=19$m=19456,t=2,p=1$...
    password_hash       TEXT NOT NULL,
    -- Platform administrator (above teams).
    is_admin            BOOLEAN NOT NULL DEFAULT FALSE,
    -- A disabled user cannot sign in; their sessions stop working at the next request.
    disabled            BOOLEAN NOT NULL DEFAULT FALSE,
    -- Sessions that signed in before this instant are rejected: a password change or
    -- disabling the account moves it forward, signing out every other session.
    sessions_valid_after TEXT NOT NULL,
    created_at          TEXT NOT NULL
);

-- Sessions live in the table tower-sessions-sqlx-store creates ("tower_sessions"); it is
-- created by the store's own migrate() right after these migrations.
