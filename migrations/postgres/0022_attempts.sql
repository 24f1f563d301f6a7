-- A job's ended attempts (docs/operations.md, "The deadline channel"): one row per
-- attempt that ended and was followed by another (a retry after a failure, or a requeue
-- after a preemption), written in the same transaction as the step to the next attempt.
-- `gpu_ms` is the GPU time the attempt held (GPU-milliseconds: its allocation's share of
-- GPUs × its run time); for a preempted attempt, the time the preemption cost. Matches
-- migrations/sqlite/0022_attempts.sql.
CREATE TABLE workload_attempts (
    workload_id UUID NOT NULL REFERENCES workloads (id),
    attempt     BIGINT NOT NULL,
    hostname    TEXT NOT NULL,
    started_at  TIMESTAMPTZ,
    ended_at    TIMESTAMPTZ NOT NULL,
    exit_code   BIGINT,
    reason      TEXT NOT NULL,
    preempted   BOOLEAN NOT NULL,
    gpu_ms      BIGINT NOT NULL,
    PRIMARY KEY (workload_id, attempt)
);
