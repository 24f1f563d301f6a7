-- Metering and money: rate cards, metered (allocation, hour) rows, the append-only
-- double-entry ledger, and team budgets. Matches migrations/sqlite/0005_billing.sql.
--
-- Units (tessera_domain::billing): wall time in milliseconds, GPU-time in milli-GPU-seconds,
-- money in minor units of the configured currency. No floats anywhere.

-- Every price ever set; the one in force for a kind at an hour is the latest
-- `effective_from` at or before it. A rate never starts at an hour already billed.
CREATE TABLE rate_cards (
    id                       UUID PRIMARY KEY,
    kind                     TEXT NOT NULL,
    model                    TEXT NOT NULL,
    price_minor_per_hour     BIGINT NOT NULL CHECK (price_minor_per_hour >= 0),
    preemptible_discount_pct BIGINT NOT NULL CHECK (preemptible_discount_pct BETWEEN 0 AND 100),
    effective_from           TIMESTAMPTZ NOT NULL,
    created_at               TIMESTAMPTZ NOT NULL,
    created_by               UUID REFERENCES users (id),
    UNIQUE (kind, effective_from)
);

-- One row per (allocation, hour) metered: what it used and what it cost. The primary key
-- makes the metering job idempotent; the row and its ledger entries are written in one
-- transaction.
CREATE TABLE meter_hours (
    allocation_id UUID NOT NULL REFERENCES allocations (id),
    hour_start    TIMESTAMPTZ NOT NULL,
    day           TEXT NOT NULL,
    team_id       UUID NOT NULL REFERENCES teams (id),
    user_id       UUID NOT NULL REFERENCES users (id),
    kind          TEXT NOT NULL,
    model         TEXT NOT NULL,
    priority      TEXT NOT NULL,
    count         BIGINT NOT NULL,
    resource_id   TEXT NOT NULL,
    resource_name TEXT NOT NULL,
    wall_ms       BIGINT NOT NULL CHECK (wall_ms BETWEEN 0 AND 3600000),
    gpu_ms        BIGINT NOT NULL CHECK (gpu_ms >= 0),
    active_gpu_ms BIGINT NOT NULL CHECK (active_gpu_ms >= 0),
    samples       BIGINT NOT NULL,
    rate_id       UUID,
    list_minor    BIGINT NOT NULL CHECK (list_minor >= 0),
    billed_minor  BIGINT NOT NULL CHECK (billed_minor >= 0),
    currency      TEXT NOT NULL,
    txn_id        UUID NOT NULL,
    metered_at    TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (allocation_id, hour_start)
);
CREATE INDEX meter_hours_team ON meter_hours (team_id, hour_start);
CREATE INDEX meter_hours_hour ON meter_hours (hour_start);

-- Append-only double entry: a charge is +amount on `team:<id>` and −amount on `platform`;
-- a correction is a reversing pair. At most one charge and one reversal per
-- (allocation, hour, account).
CREATE TABLE ledger_entries (
    id            UUID PRIMARY KEY,
    txn_id        UUID NOT NULL,
    account       TEXT NOT NULL,
    team_id       UUID NOT NULL REFERENCES teams (id),
    amount_minor  BIGINT NOT NULL,
    currency      TEXT NOT NULL,
    entry_type    TEXT NOT NULL CHECK (entry_type IN ('charge', 'reversal')),
    allocation_id UUID NOT NULL REFERENCES allocations (id),
    hour_start    TIMESTAMPTZ NOT NULL,
    posted_at     TIMESTAMPTZ NOT NULL,
    memo          TEXT,
    UNIQUE (allocation_id, hour_start, entry_type, account)
);
CREATE INDEX ledger_entries_team ON ledger_entries (team_id, hour_start);
CREATE INDEX ledger_entries_hour ON ledger_entries (hour_start);
-- The chargeback export reads the team side in (hour_start, id) order: a partial index
-- that covers what it needs from the entry, so a page is one range scan.
CREATE INDEX ledger_entries_team_hour ON ledger_entries
    (hour_start, id, allocation_id, team_id, amount_minor, entry_type, currency)
    WHERE account <> 'platform';
CREATE INDEX ledger_entries_txn ON ledger_entries (txn_id);

CREATE FUNCTION ledger_entries_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'ledger entries are append-only';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER ledger_entries_no_change BEFORE UPDATE OR DELETE ON ledger_entries
    FOR EACH ROW EXECUTE FUNCTION ledger_entries_append_only();

-- A team's monthly budget (calendar month, UTC). `hard`: requests beyond it need a
-- platform admin's approval.
CREATE TABLE budgets (
    team_id       UUID PRIMARY KEY REFERENCES teams (id),
    monthly_minor BIGINT NOT NULL CHECK (monthly_minor >= 0),
    hard          BOOLEAN NOT NULL,
    updated_at    TIMESTAMPTZ NOT NULL,
    updated_by    UUID REFERENCES users (id)
);

-- Set once every hour of an ended allocation is metered: the job stops looking at it.
ALTER TABLE allocations ADD COLUMN billing_closed BOOLEAN NOT NULL DEFAULT FALSE;
CREATE INDEX allocations_billing ON allocations (billing_closed, active_at);
