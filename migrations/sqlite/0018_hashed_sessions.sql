-- Sessions are stored under a hash of the cookie's id (core/src/sessions.rs), so the table
-- and every backup of it name no session anyone could present. A release before this one
-- stored the cookie's id itself: those rows are dropped with their table (everyone signs in
-- once more), and tower-sessions-sqlx-store's migrate() creates it again, empty, right
-- after these migrations. Matches migrations/postgres/0018_hashed_sessions.sql.
DROP TABLE IF EXISTS tower_sessions;
