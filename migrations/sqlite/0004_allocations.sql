-- Allocations: quotas (with their usage counters), allocation requests and their history,
-- and the audit trail. Matches migrations/postgres/0004_allocations.sql.
--
-- Units are compute slices of a GPU model (tessera_domain::alloc): 1g.10gb = 1, a whole
-- H100 = 7. `quotas.used` and `user_usage.used` count the units of allocations whose state
-- holds quota (queued, placing, active, releasing). They change only in the same
-- transaction as the allocation's state, by conditional UPDATEs, so admission is atomic
-- and a crash can neither leak nor double-count units. CHECKs keep them non-negative.

CREATE TABLE quotas (
    team_id     BLOB NOT NULL REFERENCES teams (id),
    model       TEXT NOT NULL,
    guaranteed  INTEGER NOT NULL CHECK (guaranteed >= 0),
    limit_units INTEGER NOT NULL CHECK (limit_units >= guaranteed),
    per_user    INTEGER NOT NULL CHECK (per_user >= 0 AND per_user <= limit_units),
    used        INTEGER NOT NULL DEFAULT 0 CHECK (used >= 0),
    updated_at  TEXT NOT NULL,
    updated_by  BLOB REFERENCES users (id),
    PRIMARY KEY (team_id, model)
);

CREATE TABLE user_usage (
    team_id BLOB NOT NULL REFERENCES teams (id),
    model   TEXT NOT NULL,
    user_id BLOB NOT NULL REFERENCES users (id),
    used    INTEGER NOT NULL CHECK (used >= 0),
    PRIMARY KEY (team_id, model, user_id)
);

-- `devices` is JSON of the placed devices ([{node_id, hostname, gpu_uuid, profile, start,
-- mig_uuid}]); empty until placed. `idempotency_key` is the client's Idempotency-Key.
CREATE TABLE allocations (
    id               BLOB PRIMARY KEY NOT NULL,
    team_id          BLOB NOT NULL REFERENCES teams (id),
    user_id          BLOB NOT NULL REFERENCES users (id),
    kind             TEXT NOT NULL,
    model            TEXT NOT NULL,
    count            INTEGER NOT NULL CHECK (count > 0),
    units            INTEGER NOT NULL CHECK (units > 0),
    priority         TEXT NOT NULL,
    purpose          TEXT NOT NULL,
    state            TEXT NOT NULL,
    duration_minutes INTEGER NOT NULL,
    starts_at        TEXT,
    created_at       TEXT NOT NULL,
    active_at        TEXT,
    ends_at          TEXT,
    approver         TEXT,
    approval_reason  TEXT,
    pending_reason   TEXT,
    devices          TEXT NOT NULL DEFAULT '[]',
    release_cause    TEXT,
    preempt_at       TEXT,
    idempotency_key  TEXT,
    UNIQUE (user_id, idempotency_key)
);
CREATE INDEX allocations_state ON allocations (state, created_at);
CREATE INDEX allocations_team ON allocations (team_id, created_at);

-- Every state change, with who made it (NULL: the scheduler) and why.
CREATE TABLE allocation_events (
    allocation_id BLOB NOT NULL REFERENCES allocations (id),
    seq           INTEGER NOT NULL,
    at            TEXT NOT NULL,
    from_state    TEXT,
    to_state      TEXT NOT NULL,
    actor         TEXT,
    note          TEXT,
    PRIMARY KEY (allocation_id, seq)
);

-- Who changed what, when: before/after as JSON.
CREATE TABLE audit_log (
    id          BLOB PRIMARY KEY NOT NULL,
    at          TEXT NOT NULL,
    actor       TEXT,
    action      TEXT NOT NULL,
    object_type TEXT NOT NULL,
    object_id   TEXT NOT NULL,
    team_id     BLOB,
    before      TEXT,
    after       TEXT
);
CREATE INDEX audit_log_at ON audit_log (at);
