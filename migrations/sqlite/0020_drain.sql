-- Drain (docs/operations.md): a platform admin takes a node, or one GPU of it, out of
-- placement with a deadline. No new work is placed there; what runs is warned through the
-- deadline channel and released (jobs requeued elsewhere) at the deadline. `gpu_uuid` is ''
-- for the whole node. Undrain deletes the row.
CREATE TABLE drains (
    node_id    BLOB NOT NULL REFERENCES nodes (id),
    gpu_uuid   TEXT NOT NULL DEFAULT '',
    deadline   TEXT NOT NULL,
    reason     TEXT NOT NULL,
    created_by BLOB REFERENCES users (id),
    created_at TEXT NOT NULL,
    PRIMARY KEY (node_id, gpu_uuid)
);
-- Why an allocation's `preempt_at` was set: 'reclaim' (borrowed capacity a team's guarantee
-- asks back), 'drain' (its node or GPU is drained) or 'health' (its GPU turned unhealthy).
-- NULL while no warning stands.
ALTER TABLE allocations ADD COLUMN preempt_cause TEXT
    CHECK (preempt_cause IS NULL OR preempt_cause IN ('reclaim', 'drain', 'health'));
-- GPU health (docs/operations.md): the error counters a platform admin last cleared at,
-- and since when the GPU is unhealthy (NULL: healthy). A GPU with a critical Xid or an
-- uncorrectable ECC error beyond its baseline is taken out like a drain, at once.
CREATE TABLE gpu_health (
    node_id         BLOB NOT NULL REFERENCES nodes (id),
    gpu_uuid        TEXT NOT NULL,
    xid_base        BIGINT NOT NULL DEFAULT 0,
    ecc_base        BIGINT NOT NULL DEFAULT 0,
    unhealthy_since TEXT,
    reason          TEXT,
    PRIMARY KEY (node_id, gpu_uuid)
);
