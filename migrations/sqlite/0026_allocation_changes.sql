-- Issue 41: the scheduler's leader keeps the live allocations in memory and reads only
-- what changed since its last pass. Every insert, update and delete of an allocation
-- notes its id here (SQLite serializes writers, so `seq` grows in commit order).
-- The leader prunes old entries; a process that fell behind reloads everything.
CREATE TABLE allocation_changes (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    allocation_id BLOB NOT NULL,
    at            TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

CREATE TRIGGER allocation_changes_insert AFTER INSERT ON allocations
BEGIN
    INSERT INTO allocation_changes (allocation_id) VALUES (NEW.id);
END;

CREATE TRIGGER allocation_changes_update AFTER UPDATE ON allocations
BEGIN
    INSERT INTO allocation_changes (allocation_id) VALUES (NEW.id);
END;

CREATE TRIGGER allocation_changes_delete AFTER DELETE ON allocations
BEGIN
    INSERT INTO allocation_changes (allocation_id) VALUES (OLD.id);
END;
