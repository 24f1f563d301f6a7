-- Bookings (docs/operations.md): a team holds `count` of `kind` for [starts_at, ends_at).
-- Admitted when made, against the team's limit for the window and what other bookings
-- hold; shortly before the start it becomes an allocation (`allocation_id`) placed ahead
-- of the queue, and work borrowing the capacity is warned and preempted in time.
CREATE TABLE bookings (
    id            BLOB PRIMARY KEY,
    team_id       BLOB NOT NULL REFERENCES teams (id),
    user_id       BLOB NOT NULL REFERENCES users (id),
    kind          TEXT NOT NULL,
    model         TEXT NOT NULL,
    count         BIGINT NOT NULL CHECK (count > 0),
    units         BIGINT NOT NULL CHECK (units > 0),
    starts_at     TEXT NOT NULL,
    ends_at       TEXT NOT NULL,
    purpose       TEXT NOT NULL DEFAULT '',
    created_at    TEXT NOT NULL,
    cancelled_at  TEXT,
    allocation_id BLOB REFERENCES allocations (id)
);
CREATE INDEX bookings_model_window ON bookings (model, starts_at);
CREATE INDEX bookings_team ON bookings (team_id, ends_at);
-- One row per model: a booking's admission bumps it first, so bookings of one model are
-- admitted one at a time (PostgreSQL row lock; SQLite's writer lock does it anyway).
CREATE TABLE booking_locks (
    model TEXT PRIMARY KEY,
    n     BIGINT NOT NULL DEFAULT 0
);
-- An allocation warned because a booking needs its capacity: that booking (its
-- `preempt_cause` stays NULL; the cause reads as 'booking').
ALTER TABLE allocations ADD COLUMN preempt_booking BLOB;
