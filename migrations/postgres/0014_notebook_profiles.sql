-- Named notebook profiles per team (like JupyterHub's profile list): what a member starts
-- a notebook with in one click, e.g. "Small: 1g.10gb, 8 h". The notebook requests that GPU
-- for itself (workloads.owns_allocation). Matches migrations/sqlite/0014_notebook_profiles.sql.
CREATE TABLE notebook_profiles (
    id               UUID PRIMARY KEY,
    team_id          UUID NOT NULL REFERENCES teams (id),
    name             TEXT NOT NULL,
    kind             TEXT NOT NULL,
    duration_minutes BIGINT NOT NULL CHECK (duration_minutes > 0),
    created_at       TIMESTAMPTZ NOT NULL,
    created_by       UUID REFERENCES users (id),
    UNIQUE (team_id, name)
);
