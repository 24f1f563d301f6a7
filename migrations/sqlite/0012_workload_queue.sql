-- Workloads that bring their own GPU: a job or notebook may own its allocation
-- (`owns_allocation`), requested when the workload was submitted. It waits in state
-- `queued`, on no node yet (`node_id` NULL), until that allocation is active; it is
-- released when the workload ends. Matches migrations/postgres/0012_workload_queue.sql.
--
-- SQLite cannot drop a NOT NULL constraint in place, so the table is rebuilt with its rows
-- and indexes. Foreign keys are deferred to the commit: dropping the old table leaves the
-- log and grant rows pointing at nothing until the copied rows are back, and the commit
-- fails if any is still missing.
PRAGMA defer_foreign_keys = ON;
CREATE TABLE workloads_copy AS SELECT * FROM workloads;
DROP TABLE workloads;

CREATE TABLE workloads (
    id               BLOB PRIMARY KEY NOT NULL,
    kind             TEXT NOT NULL CHECK (kind IN ('notebook', 'job')),
    name             TEXT NOT NULL,
    allocation_id    BLOB NOT NULL REFERENCES allocations (id),
    team_id          BLOB NOT NULL REFERENCES teams (id),
    user_id          BLOB NOT NULL REFERENCES users (id),
    node_id          BLOB REFERENCES nodes (id),
    hostname         TEXT NOT NULL,
    devices          TEXT NOT NULL,
    state            TEXT NOT NULL,
    command          TEXT NOT NULL DEFAULT '',
    workdir          TEXT NOT NULL DEFAULT '',
    env              TEXT NOT NULL DEFAULT '[]',
    retries          INTEGER NOT NULL DEFAULT 0 CHECK (retries >= 0),
    attempt          INTEGER NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    token            TEXT,
    endpoint         TEXT,
    exit_code        INTEGER,
    message          TEXT,
    stop_state       TEXT,
    created_at       TEXT NOT NULL,
    started_at       TEXT,
    ready_at         TEXT,
    ended_at         TEXT,
    synced_at        TEXT,
    kernel_activity  TEXT,
    kernel_busy      BOOLEAN NOT NULL DEFAULT FALSE,
    log_base         INTEGER NOT NULL DEFAULT 0,
    log_stored       INTEGER NOT NULL DEFAULT 0,
    log_start        INTEGER NOT NULL DEFAULT 0,
    log_complete     BOOLEAN NOT NULL DEFAULT FALSE,
    idempotency_key  TEXT,
    owns_allocation  BOOLEAN NOT NULL DEFAULT FALSE,
    UNIQUE (user_id, idempotency_key),
    CHECK (node_id IS NOT NULL OR owns_allocation)
);
INSERT INTO workloads (id, kind, name, allocation_id, team_id, user_id, node_id, hostname, devices, state, command, workdir, env, retries, attempt, token, endpoint, exit_code, message, stop_state, created_at, started_at, ready_at, ended_at, synced_at, kernel_activity, kernel_busy, log_base, log_stored, log_start, log_complete, idempotency_key)
SELECT id, kind, name, allocation_id, team_id, user_id, node_id, hostname, devices, state, command, workdir, env, retries, attempt, token, endpoint, exit_code, message, stop_state, created_at, started_at, ready_at, ended_at, synced_at, kernel_activity, kernel_busy, log_base, log_stored, log_start, log_complete, idempotency_key FROM workloads_copy;
DROP TABLE workloads_copy;
CREATE INDEX workloads_team ON workloads (team_id, created_at);
CREATE INDEX workloads_node ON workloads (node_id, state);
CREATE INDEX workloads_allocation ON workloads (allocation_id);
-- A notebook's name is its proxy path: unique per user among live notebooks.
CREATE UNIQUE INDEX workloads_live_notebook ON workloads (user_id, name)
    WHERE kind = 'notebook' AND state IN ('queued', 'pending', 'starting', 'running', 'stopping');
-- One live workload per allocation: it has the allocation's devices to itself.
CREATE UNIQUE INDEX workloads_live_allocation ON workloads (allocation_id)
    WHERE state IN ('queued', 'pending', 'starting', 'running', 'stopping');
