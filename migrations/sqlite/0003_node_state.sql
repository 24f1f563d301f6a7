-- What the server wants on each GPU, what the agent last said about applying it, and
-- telemetry samples.

-- Desired MIG state per GPU (keyed by the GPU's UUID: indices may change on reboot).
-- `layout` is JSON: [{"profile":"1g.10gb","start":0}, ...]. `version` grows by one with
-- every change; the agent's status names the version it is about.
CREATE TABLE gpu_desired (
    node_id    BLOB NOT NULL REFERENCES nodes (id),
    gpu_uuid   TEXT NOT NULL,
    mode       TEXT NOT NULL CHECK (mode IN ('enabled', 'disabled')),
    layout     TEXT NOT NULL,
    version    INTEGER NOT NULL,
    updated_at TEXT NOT NULL,
    updated_by BLOB REFERENCES users (id),
    PRIMARY KEY (node_id, gpu_uuid)
);

-- The agent's last apply status per GPU (JSON of tessera_domain::wire::ApplyStatus).
CREATE TABLE gpu_apply_status (
    node_id     BLOB NOT NULL REFERENCES nodes (id),
    gpu_uuid    TEXT NOT NULL,
    version     INTEGER NOT NULL,
    status      TEXT NOT NULL,
    reported_at TEXT NOT NULL,
    PRIMARY KEY (node_id, gpu_uuid)
);

-- One row per agent sample; (node_id, seq) deduplicates resends after lost acks.
-- `payload` is JSON of tessera_domain::wire::TelemetrySample.
CREATE TABLE telemetry_samples (
    node_id     BLOB NOT NULL REFERENCES nodes (id),
    seq         INTEGER NOT NULL,
    at          TEXT NOT NULL,
    payload     TEXT NOT NULL,
    received_at TEXT NOT NULL,
    PRIMARY KEY (node_id, seq)
);
CREATE INDEX telemetry_samples_at ON telemetry_samples (node_id, at);

-- Samples the agent reports it had to drop (its spool was full), ever.
ALTER TABLE nodes ADD COLUMN telemetry_dropped INTEGER NOT NULL DEFAULT 0;
