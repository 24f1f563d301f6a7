-- Desired GPU state, apply status, telemetry. Matches migrations/sqlite/0003_node_state.sql.

CREATE TABLE gpu_desired (
    node_id    UUID NOT NULL REFERENCES nodes (id),
    gpu_uuid   TEXT NOT NULL,
    mode       TEXT NOT NULL CHECK (mode IN ('enabled', 'disabled')),
    layout     TEXT NOT NULL,
    version    BIGINT NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL,
    updated_by UUID REFERENCES users (id),
    PRIMARY KEY (node_id, gpu_uuid)
);

CREATE TABLE gpu_apply_status (
    node_id     UUID NOT NULL REFERENCES nodes (id),
    gpu_uuid    TEXT NOT NULL,
    version     BIGINT NOT NULL,
    status      TEXT NOT NULL,
    reported_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (node_id, gpu_uuid)
);

CREATE TABLE telemetry_samples (
    node_id     UUID NOT NULL REFERENCES nodes (id),
    seq         BIGINT NOT NULL,
    at          TIMESTAMPTZ NOT NULL,
    payload     TEXT NOT NULL,
    received_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (node_id, seq)
);
CREATE INDEX telemetry_samples_at ON telemetry_samples (node_id, at);

ALTER TABLE nodes ADD COLUMN telemetry_dropped BIGINT NOT NULL DEFAULT 0;
