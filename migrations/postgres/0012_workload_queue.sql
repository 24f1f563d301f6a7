-- Workloads that bring their own GPU: a job or notebook may own its allocation
-- (`owns_allocation`), requested when the workload was submitted. It waits in state
-- `queued`, on no node yet (`node_id` NULL), until that allocation is active; it is
-- released when the workload ends. Matches migrations/sqlite/0012_workload_queue.sql.
ALTER TABLE workloads ALTER COLUMN node_id DROP NOT NULL;
ALTER TABLE workloads ADD COLUMN owns_allocation BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE workloads ADD CONSTRAINT workloads_node_or_own_allocation
    CHECK (node_id IS NOT NULL OR owns_allocation);
DROP INDEX workloads_live_notebook;
DROP INDEX workloads_live_allocation;
-- A notebook's name is its proxy path: unique per user among live notebooks.
CREATE UNIQUE INDEX workloads_live_notebook ON workloads (user_id, name)
    WHERE kind = 'notebook' AND state IN ('queued', 'pending', 'starting', 'running', 'stopping');
-- One live workload per allocation: it has the allocation's devices to itself.
CREATE UNIQUE INDEX workloads_live_allocation ON workloads (allocation_id)
    WHERE state IN ('queued', 'pending', 'starting', 'running', 'stopping');
