-- Issue 41: the scheduler's leader keeps the live allocations in memory and reads only
-- what changed since its last pass. Every insert, update and delete of an allocation
-- notes its id here with its transaction id: sequence values are not committed in order,
-- so the leader reads the entries of every transaction at or after the oldest one that
-- was still running at its previous read (`pg_snapshot_xmin`). It prunes old entries; a
-- process that fell behind reloads everything.
CREATE TABLE allocation_changes (
    seq           BIGSERIAL PRIMARY KEY,
    allocation_id UUID NOT NULL,
    txid          xid8 NOT NULL DEFAULT pg_current_xact_id(),
    at            TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX allocation_changes_txid ON allocation_changes (txid);

CREATE FUNCTION note_allocation_change() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO allocation_changes (allocation_id) VALUES (OLD.id);
    ELSE
        INSERT INTO allocation_changes (allocation_id) VALUES (NEW.id);
    END IF;
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER allocation_changes AFTER INSERT OR UPDATE OR DELETE ON allocations
    FOR EACH ROW EXECUTE FUNCTION note_allocation_change();
