-- A share's milli-GPU as a column of its own (issue 40): "is this a share" is
-- `share_milli IS NOT NULL`, not a pattern over the kind's text.
ALTER TABLE allocations ADD COLUMN share_milli BIGINT;
UPDATE allocations SET share_milli = CAST(split_part(kind, ':', 3) AS BIGINT)
    WHERE kind LIKE '%:share:%';
