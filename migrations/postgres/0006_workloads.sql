-- Workloads on allocations: notebooks and training jobs, and their logs.
-- Matches migrations/sqlite/0006_workloads.sql.
--
-- A workload runs on one node (the allocation's), sees the allocation's devices
-- (`devices`, JSON list of the allocation's `AllocatedDevice`s on that node) and is reconciled by that node's executor
-- through `POST /agent/v1/workloads`. `token` is the notebook's secret: only the server's
-- proxy and the executor ever see it. Logs are kept per workload as chunks keyed by their
-- byte offset (`log_stored` bytes received so far, of which the oldest before
-- `log_start` were dropped to stay within the bound); `log_base` maps the current
-- attempt's offsets (which restart at 0 on the node) onto the workload's log.

CREATE TABLE workloads (
    id               UUID PRIMARY KEY,
    kind             TEXT NOT NULL CHECK (kind IN ('notebook', 'job')),
    name             TEXT NOT NULL,
    allocation_id    UUID NOT NULL REFERENCES allocations (id),
    team_id          UUID NOT NULL REFERENCES teams (id),
    user_id          UUID NOT NULL REFERENCES users (id),
    node_id          UUID NOT NULL REFERENCES nodes (id),
    hostname         TEXT NOT NULL,
    devices          TEXT NOT NULL,
    state            TEXT NOT NULL,
    command          TEXT NOT NULL DEFAULT '',
    workdir          TEXT NOT NULL DEFAULT '',
    env              TEXT NOT NULL DEFAULT '[]',
    retries          BIGINT NOT NULL DEFAULT 0 CHECK (retries >= 0),
    attempt          BIGINT NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    token            TEXT,
    endpoint         TEXT,
    exit_code        BIGINT,
    message          TEXT,
    stop_state       TEXT,
    created_at       TIMESTAMPTZ NOT NULL,
    started_at       TIMESTAMPTZ,
    ready_at         TIMESTAMPTZ,
    ended_at         TIMESTAMPTZ,
    synced_at        TIMESTAMPTZ,
    kernel_activity  TIMESTAMPTZ,
    kernel_busy      BOOLEAN NOT NULL DEFAULT FALSE,
    log_base         BIGINT NOT NULL DEFAULT 0,
    log_stored       BIGINT NOT NULL DEFAULT 0,
    log_start        BIGINT NOT NULL DEFAULT 0,
    log_complete     BOOLEAN NOT NULL DEFAULT FALSE,
    idempotency_key  TEXT,
    UNIQUE (user_id, idempotency_key)
);
CREATE INDEX workloads_team ON workloads (team_id, created_at);
CREATE INDEX workloads_node ON workloads (node_id, state);
CREATE INDEX workloads_allocation ON workloads (allocation_id);
-- A notebook's name is its proxy path: unique per user among live notebooks.
CREATE UNIQUE INDEX workloads_live_notebook ON workloads (user_id, name)
    WHERE kind = 'notebook' AND state IN ('pending', 'starting', 'running', 'stopping');
-- One live workload per allocation: it has the allocation's devices to itself.
CREATE UNIQUE INDEX workloads_live_allocation ON workloads (allocation_id)
    WHERE state IN ('pending', 'starting', 'running', 'stopping');

CREATE TABLE workload_logs (
    workload_id UUID NOT NULL REFERENCES workloads (id),
    offset_b    BIGINT NOT NULL,
    len_b       BIGINT NOT NULL CHECK (len_b > 0),
    text        TEXT NOT NULL,
    PRIMARY KEY (workload_id, offset_b)
);
