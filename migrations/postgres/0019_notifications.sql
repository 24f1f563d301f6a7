-- Notifications: outbox, deliveries, email addresses, preferences, team webhooks.
-- Matches migrations/sqlite/0019_notifications.sql; see there for column notes.
ALTER TABLE users ADD COLUMN email TEXT;
ALTER TABLE users ADD COLUMN email_verified BOOLEAN NOT NULL DEFAULT FALSE;

CREATE TABLE outbox_events (
    id           UUID PRIMARY KEY,
    kind         TEXT NOT NULL,
    team_id      UUID REFERENCES teams (id),
    subject_kind TEXT NOT NULL,
    subject_id   UUID NOT NULL,
    payload      TEXT NOT NULL,
    dedupe_key   TEXT UNIQUE,
    fanned_out   BOOLEAN NOT NULL DEFAULT FALSE,
    created_at   TIMESTAMPTZ NOT NULL
);
CREATE INDEX outbox_events_unfanned ON outbox_events (created_at) WHERE NOT fanned_out;

CREATE TABLE notification_deliveries (
    id           UUID PRIMARY KEY,
    event_id     UUID NOT NULL REFERENCES outbox_events (id),
    channel      TEXT NOT NULL CHECK (channel IN ('email', 'digest', 'webhook')),
    recipient    UUID NOT NULL,
    state        TEXT NOT NULL CHECK (state IN ('pending', 'sending', 'sent', 'failed')),
    attempts     BIGINT NOT NULL DEFAULT 0,
    next_try_at  TIMESTAMPTZ NOT NULL,
    claimed_by   UUID,
    claimed_at   TIMESTAMPTZ,
    sent_at      TIMESTAMPTZ,
    last_status  BIGINT,
    last_error   TEXT,
    created_at   TIMESTAMPTZ NOT NULL,
    UNIQUE (event_id, channel, recipient)
);
CREATE INDEX notification_deliveries_due ON notification_deliveries (state, next_try_at);
CREATE INDEX notification_deliveries_recipient ON notification_deliveries (recipient, created_at);

CREATE TABLE notification_preferences (
    user_id    UUID NOT NULL REFERENCES users (id),
    event_kind TEXT NOT NULL,
    mode       TEXT NOT NULL CHECK (mode IN ('immediate', 'digest', 'off')),
    PRIMARY KEY (user_id, event_kind)
);

CREATE TABLE team_webhooks (
    id                   UUID PRIMARY KEY,
    team_id              UUID NOT NULL REFERENCES teams (id),
    url                  TEXT NOT NULL,
    secret               TEXT NOT NULL,
    events               TEXT NOT NULL DEFAULT '[]',
    enabled              BOOLEAN NOT NULL DEFAULT TRUE,
    consecutive_failures BIGINT NOT NULL DEFAULT 0,
    last_status          BIGINT,
    last_error           TEXT,
    last_delivery_at     TIMESTAMPTZ,
    created_at           TIMESTAMPTZ NOT NULL
);
CREATE INDEX team_webhooks_team ON team_webhooks (team_id);
