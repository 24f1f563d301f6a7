-- OCI images (issue 36, docs/workloads.md "Environments").
-- The image catalog: platform-wide entries (team_id NULL) and teams' own, each pinned to a
-- digest when added (`pinned` = registry/repository@sha256:…, what runs; a tag is never
-- re-resolved), with the CUDA version the image's config says it needs.
CREATE TABLE image_catalog (
    id            BLOB PRIMARY KEY,
    team_id       BLOB REFERENCES teams (id),
    name          TEXT NOT NULL,
    reference     TEXT NOT NULL,
    pinned        TEXT NOT NULL,
    requires_cuda TEXT,
    added_by      TEXT NOT NULL,
    created_at    TEXT NOT NULL
);
CREATE UNIQUE INDEX image_catalog_team_name ON image_catalog (team_id, name) WHERE team_id IS NOT NULL;
CREATE UNIQUE INDEX image_catalog_platform_name ON image_catalog (name) WHERE team_id IS NULL;
-- Where images may come from (platform admins): `registry` or `registry/repository prefix`.
CREATE TABLE registry_allowlist (
    entry      TEXT PRIMARY KEY,
    added_by   TEXT NOT NULL,
    created_at TEXT NOT NULL
);
-- A team's login to a registry; the password sealed under the data keys (core::at_rest),
-- never shown back, sent only to the agent that pulls for the team.
CREATE TABLE registry_logins (
    team_id    BLOB NOT NULL REFERENCES teams (id),
    registry   TEXT NOT NULL,
    username   TEXT NOT NULL,
    secret     TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (team_id, registry)
);
-- A workload's image (pinned) and what it needs; the node's pull progress while it pulls.
ALTER TABLE workloads ADD COLUMN image TEXT;
ALTER TABLE workloads ADD COLUMN image_cuda TEXT;
ALTER TABLE workloads ADD COLUMN pull_done BIGINT;
ALTER TABLE workloads ADD COLUMN pull_total BIGINT;
-- A notebook profile's image (a catalog entry; none = the node's environment).
ALTER TABLE notebook_profiles ADD COLUMN image_id BLOB REFERENCES image_catalog (id);
-- An allocation made for a workload in an image: the CUDA version its node's driver
-- must support (placement skips nodes whose driver is older).
ALTER TABLE allocations ADD COLUMN needs_cuda TEXT;
