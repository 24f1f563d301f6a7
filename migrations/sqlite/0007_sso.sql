-- Single sign-on: users who sign in through an OpenID Connect provider.
-- Matches migrations/postgres/0007_sso.sql.
--
-- One row per (issuer, subject): the provider's stable id for a person, never the
-- username (a provider's `preferred_username` can be reassigned; `sub` cannot). Such users
-- are created at their first sign-in with `password_hash = '!'`, which no password
-- verifies. `grants_admin` records that the provider's groups made the user a platform
-- admin, so a later sign-in without that group takes back only what a claim gave (an
-- admin granted locally stays). `last_groups` is the last group claim, as JSON.
CREATE TABLE user_identities (
    issuer        TEXT NOT NULL,
    subject       TEXT NOT NULL,
    user_id       BLOB NOT NULL UNIQUE REFERENCES users (id),
    email         TEXT,
    last_groups   TEXT NOT NULL DEFAULT '[]',
    grants_admin  BOOLEAN NOT NULL DEFAULT FALSE,
    created_at    TEXT NOT NULL,
    last_login_at TEXT NOT NULL,
    PRIMARY KEY (issuer, subject)
);
