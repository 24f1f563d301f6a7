-- Tenancy and nodes: teams, memberships, personal API tokens, node join tokens, nodes.
--
-- Secrets (API tokens, join tokens, node credentials) are stored only as SHA-256 hex of
-- the secret: they are 256-bit random values, so a fast hash is enough. `prefix` keeps the
-- first characters to tell tokens apart in lists.

CREATE TABLE teams (
    id         BLOB PRIMARY KEY NOT NULL,
    name       TEXT NOT NULL,
    -- Archived teams are read-only.
    archived   BOOLEAN NOT NULL DEFAULT FALSE,
    created_at TEXT NOT NULL
);
CREATE UNIQUE INDEX teams_name_unique ON teams (lower(name));

-- One role per (team, user): team_admin, member or viewer.
CREATE TABLE memberships (
    team_id  BLOB NOT NULL REFERENCES teams (id),
    user_id  BLOB NOT NULL REFERENCES users (id),
    role     TEXT NOT NULL CHECK (role IN ('team_admin', 'member', 'viewer')),
    added_at TEXT NOT NULL,
    PRIMARY KEY (team_id, user_id)
);
CREATE INDEX memberships_user ON memberships (user_id);

-- Personal API tokens: act as their owner with the owner's roles.
CREATE TABLE api_tokens (
    id           BLOB PRIMARY KEY NOT NULL,
    user_id      BLOB NOT NULL REFERENCES users (id),
    name         TEXT NOT NULL,
    prefix       TEXT NOT NULL,
    secret_hash  TEXT NOT NULL UNIQUE,
    created_at   TEXT NOT NULL,
    expires_at   TEXT,
    last_used_at TEXT,
    revoked_at   TEXT
);
CREATE INDEX api_tokens_user ON api_tokens (user_id);

-- Node join tokens: limited uses, expiring; traded by an agent for a node credential.
CREATE TABLE join_tokens (
    id          BLOB PRIMARY KEY NOT NULL,
    note        TEXT NOT NULL,
    prefix      TEXT NOT NULL,
    secret_hash TEXT NOT NULL UNIQUE,
    created_by  BLOB NOT NULL REFERENCES users (id),
    created_at  TEXT NOT NULL,
    expires_at  TEXT NOT NULL,
    max_uses    INTEGER NOT NULL CHECK (max_uses > 0),
    uses        INTEGER NOT NULL DEFAULT 0 CHECK (uses <= max_uses),
    revoked     BOOLEAN NOT NULL DEFAULT FALSE
);

-- GPU nodes, each with its own credential. `inventory` is the JSON of the last reported
-- tessera_domain::wire::Inventory.
CREATE TABLE nodes (
    id                BLOB PRIMARY KEY NOT NULL,
    hostname          TEXT NOT NULL,
    credential_hash   TEXT NOT NULL UNIQUE,
    join_token_id     BLOB REFERENCES join_tokens (id),
    registered_at     TEXT NOT NULL,
    last_heartbeat_at TEXT,
    agent_version     TEXT NOT NULL DEFAULT '',
    manages_mig       BOOLEAN NOT NULL DEFAULT FALSE,
    inventory         TEXT NOT NULL DEFAULT '{"gpus":[]}',
    revoked_at        TEXT
);
