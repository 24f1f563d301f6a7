-- Email verification by link and platform-wide webhooks (docs/notifications.md). Matches
-- migrations/sqlite/0021_verify_and_platform_hooks.sql.
--
-- One open verification per user (asking again replaces it). `token` is sealed with the
-- data keys (core/src/at_rest.rs, context `email_verifications.token:<user>`), so the
-- database alone cannot prove an address; the link is good for `email` until
-- `expires_at`, and only while the user's address is still `email`.
CREATE TABLE email_verifications (
    user_id    UUID PRIMARY KEY REFERENCES users (id),
    email      TEXT NOT NULL,
    token      TEXT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    created_at TIMESTAMPTZ NOT NULL
);

-- Platform-wide webhooks are rows with `team_id` NULL (platform admins manage them; they
-- get every team's events and the platform's own).
ALTER TABLE team_webhooks ALTER COLUMN team_id DROP NOT NULL;
