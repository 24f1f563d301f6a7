-- Shared GPUs (fractional shares): an admin marks a GPU shared, with MPS or time-slicing.
-- The agent is told through its desired state; such a GPU runs with MIG disabled and an
-- empty layout. NULL: not shared. Matches migrations/postgres/0015_shared_gpus.sql.
ALTER TABLE gpu_desired ADD COLUMN sharing TEXT CHECK (sharing IN ('mps', 'time_slice'));
