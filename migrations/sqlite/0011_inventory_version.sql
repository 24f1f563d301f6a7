-- Counts changes of a node's inventory, so the scheduler reads (and parses) an inventory
-- only when it changed instead of every node's on every pass (tens of kilobytes each,
-- rewritten on every heartbeat). Matches migrations/postgres/0011_inventory_version.sql.
ALTER TABLE nodes ADD COLUMN inventory_version INTEGER NOT NULL DEFAULT 0;
