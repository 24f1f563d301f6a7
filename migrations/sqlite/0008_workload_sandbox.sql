-- Whether a node's agent runs local workloads in its sandbox (docs/security.md).
-- Existing nodes ran none: they show the warning until their next heartbeat says otherwise.
ALTER TABLE nodes ADD COLUMN workload_sandbox BOOLEAN NOT NULL DEFAULT FALSE;
