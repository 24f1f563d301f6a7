-- The first-run checklist on a platform admin's dashboard: whether this admin dismissed
-- it (per admin: each sees it until they put it away). Matches the other backend's 0013.
ALTER TABLE users ADD COLUMN setup_dismissed BOOLEAN NOT NULL DEFAULT FALSE;
