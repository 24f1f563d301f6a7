-- Tenancy and nodes. Matches migrations/sqlite/0002_tenancy.sql; see there for notes.

CREATE TABLE teams (
    id         UUID PRIMARY KEY,
    name       TEXT NOT NULL,
    archived   BOOLEAN NOT NULL DEFAULT FALSE,
    created_at TIMESTAMPTZ NOT NULL
);
CREATE UNIQUE INDEX teams_name_unique ON teams (lower(name));

CREATE TABLE memberships (
    team_id  UUID NOT NULL REFERENCES teams (id),
    user_id  UUID NOT NULL REFERENCES users (id),
    role     TEXT NOT NULL CHECK (role IN ('team_admin', 'member', 'viewer')),
    added_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (team_id, user_id)
);
CREATE INDEX memberships_user ON memberships (user_id);

CREATE TABLE api_tokens (
    id           UUID PRIMARY KEY,
    user_id      UUID NOT NULL REFERENCES users (id),
    name         TEXT NOT NULL,
    prefix       TEXT NOT NULL,
    secret_hash  TEXT NOT NULL UNIQUE,
    created_at   TIMESTAMPTZ NOT NULL,
    expires_at   TIMESTAMPTZ,
    last_used_at TIMESTAMPTZ,
    revoked_at   TIMESTAMPTZ
);
CREATE INDEX api_tokens_user ON api_tokens (user_id);

CREATE TABLE join_tokens (
    id          UUID PRIMARY KEY,
    note        TEXT NOT NULL,
    prefix      TEXT NOT NULL,
    secret_hash TEXT NOT NULL UNIQUE,
    created_by  UUID NOT NULL REFERENCES users (id),
    created_at  TIMESTAMPTZ NOT NULL,
    expires_at  TIMESTAMPTZ NOT NULL,
    max_uses    BIGINT NOT NULL CHECK (max_uses > 0),
    uses        BIGINT NOT NULL DEFAULT 0 CHECK (uses <= max_uses),
    revoked     BOOLEAN NOT NULL DEFAULT FALSE
);

CREATE TABLE nodes (
    id                UUID PRIMARY KEY,
    hostname          TEXT NOT NULL,
    credential_hash   TEXT NOT NULL UNIQUE,
    join_token_id     UUID REFERENCES join_tokens (id),
    registered_at     TIMESTAMPTZ NOT NULL,
    last_heartbeat_at TIMESTAMPTZ,
    agent_version     TEXT NOT NULL DEFAULT '',
    manages_mig       BOOLEAN NOT NULL DEFAULT FALSE,
    inventory         TEXT NOT NULL DEFAULT '{"gpus":[]}',
    revoked_at        TIMESTAMPTZ
);
