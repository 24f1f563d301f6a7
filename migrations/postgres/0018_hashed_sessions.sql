-- Sessions are stored under a hash of the cookie's id; the sessions of earlier releases,
-- stored under the cookie's id itself, are dropped with their table (recreated by the
-- session store's migrate()). See migrations/sqlite/0018_hashed_sessions.sql.
DROP TABLE IF EXISTS tower_sessions.session;
