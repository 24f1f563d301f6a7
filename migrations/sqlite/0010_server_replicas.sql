-- The server processes (replicas) on this database and which one leads, for the admin
-- pages. Each replica rewrites its row every few seconds (`seen_at`) and removes it when it
-- stops; a row that is not refreshed belongs to a replica that died. The lease itself is
-- not here (an advisory lock on PostgreSQL, the process on SQLite): this only reports it.
-- Matches migrations/postgres/0010_server_replicas.sql.
CREATE TABLE server_replicas (
    name       TEXT PRIMARY KEY NOT NULL,
    version    TEXT NOT NULL,
    started_at TEXT NOT NULL,
    seen_at    TEXT NOT NULL,
    is_leader  BOOLEAN NOT NULL DEFAULT FALSE
);
