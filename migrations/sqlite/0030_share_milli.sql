-- A share's milli-GPU as a column of its own (issue 40): "is this a share" is
-- `share_milli IS NOT NULL`, not a pattern over the kind's text.
ALTER TABLE allocations ADD COLUMN share_milli INTEGER;
UPDATE allocations SET share_milli = CAST(substr(kind, instr(kind, ':share:') + 7) AS INTEGER)
    WHERE kind LIKE '%:share:%';
