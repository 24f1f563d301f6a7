-- Named notebook profiles per team (like JupyterHub's profile list): what a member starts
-- a notebook with in one click, e.g. "Small: 1g.10gb, 8 h". The notebook requests that GPU
-- for itself (workloads.owns_allocation). Matches migrations/postgres/0014_notebook_profiles.sql.
CREATE TABLE notebook_profiles (
    id               BLOB PRIMARY KEY NOT NULL,
    team_id          BLOB NOT NULL REFERENCES teams (id),
    name             TEXT NOT NULL,
    kind             TEXT NOT NULL,
    duration_minutes INTEGER NOT NULL CHECK (duration_minutes > 0),
    created_at       TEXT NOT NULL,
    created_by       BLOB REFERENCES users (id),
    UNIQUE (team_id, name)
);
