-- Multi-node (gang) jobs, issue 42: one process per node (NULL, `per_node`) or one per GPU
-- (`per_gpu`), set on every member.
ALTER TABLE workloads ADD COLUMN gang_ranks TEXT;
