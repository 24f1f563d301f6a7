-- Hot spares (docs/operations.md): per GPU model, platform admins keep `gpus` GPUs (or
-- `percent` of the model's in-service GPUs) idle as spares. Exactly one of the two is set.
CREATE TABLE spares (
    model      TEXT PRIMARY KEY,
    gpus       BIGINT CHECK (gpus IS NULL OR gpus >= 0),
    percent    BIGINT CHECK (percent IS NULL OR (percent >= 0 AND percent <= 50)),
    updated_by UUID REFERENCES users (id),
    updated_at TIMESTAMPTZ NOT NULL,
    CHECK ((gpus IS NULL) <> (percent IS NULL))
);
-- A queued allocation that replaces a high-priority one displaced from an unhealthy GPU
-- or a lost node: placed on a spare first. The displaced one's id.
ALTER TABLE allocations ADD COLUMN displaced_from UUID;
