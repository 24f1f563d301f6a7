-- Notebooks on their own origin (docs/security.md): the portal hands the browser a
-- one-time `code` (a minute, single use) that the notebook's origin swaps for a
-- `cookie` pass bound to that notebook and that user. Only SHA-256 hashes of the
-- secrets are stored. A pass is honoured only while its notebook runs and its user may
-- still open it (checked on every request), so a stopped notebook or a removed member
-- leaves nothing usable behind. Matches migrations/sqlite/0009_notebook_grants.sql.

CREATE TABLE notebook_grants (
    secret_hash  TEXT PRIMARY KEY NOT NULL,
    kind         TEXT NOT NULL CHECK (kind IN ('code', 'cookie')),
    workload_id  UUID NOT NULL REFERENCES workloads (id),
    user_id      UUID NOT NULL REFERENCES users (id),
    issued_at    TIMESTAMPTZ NOT NULL,
    expires_at   TIMESTAMPTZ NOT NULL
);
CREATE INDEX notebook_grants_expiry ON notebook_grants (expires_at);
CREATE INDEX notebook_grants_workload ON notebook_grants (workload_id);
