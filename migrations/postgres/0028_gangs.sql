-- Multi-node (gang) jobs, issue 42.
-- A gang allocation: `gang_nodes` nodes, each with `count` devices of its kind.
ALTER TABLE allocations ADD COLUMN gang_nodes BIGINT;
-- A gang job is one workload per node. Rank 0 is the job users see; ranks 1.. point at it
-- with `gang_job`. `gang_size` is set on every member; `gang_addr`/`gang_via` are the
-- member's own address and its node's, once its sandbox is ready.
ALTER TABLE workloads ADD COLUMN gang_job UUID;
ALTER TABLE workloads ADD COLUMN gang_rank BIGINT NOT NULL DEFAULT 0;
ALTER TABLE workloads ADD COLUMN gang_size BIGINT;
ALTER TABLE workloads ADD COLUMN gang_launcher TEXT;
ALTER TABLE workloads ADD COLUMN gang_addr TEXT;
ALTER TABLE workloads ADD COLUMN gang_via TEXT;
CREATE INDEX workloads_gang ON workloads (gang_job);
-- One live workload per allocation, except that a gang's members (one per rank) share
-- their gang's allocation, each with the devices of its own node.
DROP INDEX workloads_live_allocation;
CREATE UNIQUE INDEX workloads_live_allocation ON workloads (allocation_id, gang_rank)
    WHERE state IN ('queued', 'pending', 'starting', 'running', 'stopping');
-- A node's group (a rack or switch, set by platform admins): a gang stays inside one group
-- when it can.
ALTER TABLE nodes ADD COLUMN node_group TEXT;
