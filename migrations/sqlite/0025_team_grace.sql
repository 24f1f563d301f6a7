-- The deadline channel (docs/operations.md): a team's own warning before its work is
-- stopped early (a reclaim preemption, a booking's start), in seconds, set by a team admin
-- within the platform's maximum (TESSERA_PREEMPTION_GRACE). NULL: the platform maximum.
ALTER TABLE teams ADD COLUMN preemption_grace_secs BIGINT;
-- A deadline the workload service tells one workload (besides its allocation's): an idle
-- notebook's stop ('idle') or a user's or admin's stop after a short grace ('stop'). NULL
-- while none stands.
ALTER TABLE workloads ADD COLUMN deadline_at TEXT;
ALTER TABLE workloads ADD COLUMN deadline_cause TEXT
    CHECK (deadline_cause IS NULL OR deadline_cause IN ('idle', 'stop'));
