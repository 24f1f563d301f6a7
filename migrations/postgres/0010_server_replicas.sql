-- The server processes (replicas) on this database and which one leads, for the admin
-- pages. Matches migrations/sqlite/0010_server_replicas.sql; see there for notes.
CREATE TABLE server_replicas (
    name       TEXT PRIMARY KEY,
    version    TEXT NOT NULL,
    started_at TIMESTAMPTZ NOT NULL,
    seen_at    TIMESTAMPTZ NOT NULL,
    is_leader  BOOLEAN NOT NULL DEFAULT FALSE
);
