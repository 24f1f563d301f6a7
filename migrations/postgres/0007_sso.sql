-- Single sign-on: users who sign in through an OpenID Connect provider.
-- Matches migrations/sqlite/0007_sso.sql; see there for column notes.
CREATE TABLE user_identities (
    issuer        TEXT NOT NULL,
    subject       TEXT NOT NULL,
    user_id       UUID NOT NULL UNIQUE REFERENCES users (id),
    email         TEXT,
    last_groups   TEXT NOT NULL DEFAULT '[]',
    grants_admin  BOOLEAN NOT NULL DEFAULT FALSE,
    created_at    TIMESTAMPTZ NOT NULL,
    last_login_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (issuer, subject)
);
