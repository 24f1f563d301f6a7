-- Rules that hold (docs/allocations.md, "Invariants").
--
-- Who may ask for `high` priority: a platform admin grants it per team, with an optional cap
-- in units held at high priority on any one quota line (NULL: no cap).
ALTER TABLE teams ADD COLUMN high_priority BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE teams ADD COLUMN high_cap BIGINT CHECK (high_cap IS NULL OR high_cap >= 0);
-- Bumped by every admission: its first write, so one team's checks that span rows (held
-- units at high priority, committed spend) run one at a time (PostgreSQL takes the row lock;
-- SQLite's writer lock serializes anyway).
ALTER TABLE teams ADD COLUMN admissions BIGINT NOT NULL DEFAULT 0;
-- A platform admin's explicit, audited override: this allocation was approved beyond the
-- team's limit, or beyond its hard budget.
ALTER TABLE allocations ADD COLUMN over_limit BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE allocations ADD COLUMN over_budget BOOLEAN NOT NULL DEFAULT FALSE;
-- What `high` priority costs on top of the rate, in percent (0: the same as normal).
ALTER TABLE rate_cards ADD COLUMN high_premium_pct BIGINT NOT NULL DEFAULT 0
    CHECK (high_premium_pct BETWEEN 0 AND 1000);
