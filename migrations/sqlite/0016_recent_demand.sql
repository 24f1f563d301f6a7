-- The scheduler reads the latest allocation requests (newest first) for the mix of kinds the
-- fractional policy keeps room for: an index makes that a short read however long the history.
CREATE INDEX allocations_created ON allocations (created_at);
