-- Email verification by link and platform-wide webhooks (docs/notifications.md). Matches
-- migrations/postgres/0021_verify_and_platform_hooks.sql.
--
-- One open verification per user (asking again replaces it). `token` is sealed with the
-- data keys (core/src/at_rest.rs, context `email_verifications.token:<user>`), so the
-- database alone cannot prove an address; the link is good for `email` until
-- `expires_at`, and only while the user's address is still `email`.
CREATE TABLE email_verifications (
    user_id    BLOB PRIMARY KEY NOT NULL REFERENCES users (id),
    email      TEXT NOT NULL,
    token      TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    created_at TEXT NOT NULL
);

-- Platform-wide webhooks are rows with `team_id` NULL (platform admins manage them; they
-- get every team's events and the platform's own). SQLite cannot drop NOT NULL in place:
-- the table is rebuilt with its rows.
CREATE TABLE team_webhooks_new (
    id                   BLOB PRIMARY KEY NOT NULL,
    team_id              BLOB REFERENCES teams (id),
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
INSERT INTO team_webhooks_new (id, team_id, url, secret, events, enabled, consecutive_failures,
    last_status, last_error, last_delivery_at, created_at)
SELECT id, team_id, url, secret, events, enabled, consecutive_failures, last_status,
    last_error, last_delivery_at, created_at FROM team_webhooks;
DROP TABLE team_webhooks;
ALTER TABLE team_webhooks_new RENAME TO team_webhooks;
CREATE INDEX team_webhooks_team ON team_webhooks (team_id);
