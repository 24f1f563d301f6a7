-- Notifications (docs/notifications.md): a transactional outbox, its deliveries, users'
-- email addresses and preferences, and team webhooks. Matches
-- migrations/postgres/0019_notifications.sql.
--
-- A user's address for notification mail: set on My account (or later from OIDC claims).
-- `email_verified` records that the user proved the address (not yet required to send).
ALTER TABLE users ADD COLUMN email TEXT;
ALTER TABLE users ADD COLUMN email_verified BOOLEAN NOT NULL DEFAULT FALSE;

-- One row per event, written in the same transaction as the change it tells of.
-- `kind` is domain::notify::EventKind; `team_id` NULL for platform events (a node lost);
-- `subject_kind`/`subject_id` name the portal object; `payload` is
-- domain::notify::EventPayload as JSON. `dedupe_key` keeps an event that a pass may find
-- twice (a budget threshold in a month, a node lost since a heartbeat) to one row.
-- `fanned_out` turns true once its deliveries are written (the delivery worker's first
-- step, one transaction).
CREATE TABLE outbox_events (
    id           BLOB PRIMARY KEY NOT NULL,
    kind         TEXT NOT NULL,
    team_id      BLOB REFERENCES teams (id),
    subject_kind TEXT NOT NULL,
    subject_id   BLOB NOT NULL,
    payload      TEXT NOT NULL,
    dedupe_key   TEXT UNIQUE,
    fanned_out   BOOLEAN NOT NULL DEFAULT FALSE,
    created_at   TEXT NOT NULL
);
CREATE INDEX outbox_events_unfanned ON outbox_events (created_at) WHERE NOT fanned_out;

-- One row per event × channel × recipient (a user for `email`/`digest`, a webhook for
-- `webhook`): sent at most once. A worker takes a row with one conditional UPDATE
-- (`pending` → `sending`, `claimed_by` its claim) before it sends, and records the outcome.
CREATE TABLE notification_deliveries (
    id           BLOB PRIMARY KEY NOT NULL,
    event_id     BLOB NOT NULL REFERENCES outbox_events (id),
    channel      TEXT NOT NULL CHECK (channel IN ('email', 'digest', 'webhook')),
    recipient    BLOB NOT NULL,
    state        TEXT NOT NULL CHECK (state IN ('pending', 'sending', 'sent', 'failed')),
    attempts     INTEGER NOT NULL DEFAULT 0,
    next_try_at  TEXT NOT NULL,
    claimed_by   BLOB,
    claimed_at   TEXT,
    sent_at      TEXT,
    last_status  INTEGER,
    last_error   TEXT,
    created_at   TEXT NOT NULL,
    UNIQUE (event_id, channel, recipient)
);
CREATE INDEX notification_deliveries_due ON notification_deliveries (state, next_try_at);
CREATE INDEX notification_deliveries_recipient ON notification_deliveries (recipient, created_at);

-- A user's choice per event kind (absent: the kind's default).
CREATE TABLE notification_preferences (
    user_id    BLOB NOT NULL REFERENCES users (id),
    event_kind TEXT NOT NULL,
    mode       TEXT NOT NULL CHECK (mode IN ('immediate', 'digest', 'off')),
    PRIMARY KEY (user_id, event_kind)
);

-- A team's webhooks. `secret` is sealed at rest (core/src/at_rest.rs, context
-- `team_webhooks.secret:<id>`); `events` a JSON list of event kinds (empty: all).
-- Disabled after consecutive failures (`consecutive_failures`).
CREATE TABLE team_webhooks (
    id                   BLOB PRIMARY KEY NOT NULL,
    team_id              BLOB NOT NULL REFERENCES teams (id),
    url                  TEXT NOT NULL,
    secret               TEXT NOT NULL,
    events               TEXT NOT NULL DEFAULT '[]',
    enabled              BOOLEAN NOT NULL DEFAULT TRUE,
    consecutive_failures INTEGER NOT NULL DEFAULT 0,
    last_status          INTEGER,
    last_error           TEXT,
    last_delivery_at     TEXT,
    created_at           TEXT NOT NULL
);
CREATE INDEX team_webhooks_team ON team_webhooks (team_id);
