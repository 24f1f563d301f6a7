-- Accounts: local users with argon2id password hashes.
-- Matches migrations/sqlite/0001_accounts.sql; see there for column notes.
CREATE TABLE users (
    id                  UUID PRIMARY KEY,
    username            TEXT NOT NULL UNIQUE,
    password_hash       TEXT NOT NULL,
    is_admin            BOOLEAN NOT NULL DEFAULT FALSE,
    disabled            BOOLEAN NOT NULL DEFAULT FALSE,
    sessions_valid_after TIMESTAMPTZ NOT NULL,
    created_at          TIMESTAMPTZ NOT NULL
);

-- Sessions live in tower_sessions.session, created by tower-sessions-sqlx-store's migrate().
