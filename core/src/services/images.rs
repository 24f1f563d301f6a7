//! Images (issue 36): the catalog a team picks its environment from, where images may
//! come from, and the teams' registry logins.
//!
//! - **Catalog**: platform-wide entries (platform admins) and teams' own (their admins).
//!   An entry is pinned to a digest when added ([`tessera_registry::resolve`]); a tag is
//!   never re-resolved. A workload names an entry (by id, name or pinned reference) that
//!   its team sees; anything else is refused, so team B cannot run team A's private image.
//! - **Allow-list**: only images from listed registries / repository prefixes are added
//!   or run ([`tessera_domain::image::allowed_by`]).
//! - **Logins**: a team's login to a registry is sealed at rest, never shown back, and
//!   sent only with that team's workloads to the node (or pod secret) that pulls.

use crate::clock::Clock;
use crate::services::audit::Entry;
use std::sync::Arc;
use tessera_domain::audit::AuditAction;

use crate::auth::Principal;
use tessera_domain::error::AppError;
use tessera_domain::ids::TeamId;
use tessera_domain::image::{
    self, CatalogImage, CudaVersion, ImageRef, RegistryLoginView, parse_allowed_entry,
    parse_catalog_name,
};
use tessera_domain::wire::RegistryLogin;
use uuid::Uuid;

use super::authz::{self, Need};
use super::{found, internal};
use crate::at_rest::DataKeys;
use crate::store::{CatalogRow, Store};

/// How long resolving an image at the registry may take.
const RESOLVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

#[derive(Clone)]
pub struct Images {
    store: Store,
    clock: Clock,
    keys: Arc<DataKeys>,
    http: reqwest::Client,
}

/// A catalog entry to add: the team's own (`team_id`), or platform-wide (`None`).
#[derive(Debug, Clone, Default)]
pub struct NewCatalogImage {
    pub team_id: Option<Uuid>,
    pub name: String,
    pub reference: String,
}

/// The image a workload runs in, as chosen from its team's catalog.
#[derive(Debug, Clone)]
pub struct Chosen {
    /// The catalog entry.
    pub id: Uuid,
    pub pinned: String,
    pub requires_cuda: Option<CudaVersion>,
}

fn view(r: CatalogRow) -> CatalogImage {
    CatalogImage {
        id: r.id,
        team_id: r.team_id.map(|t| t.0),
        team_name: r.team_name,
        name: r.name,
        reference: r.reference,
        pinned: r.pinned,
        requires_cuda: r
            .requires_cuda
            .as_deref()
            .and_then(|c| CudaVersion::parse(c).ok()),
        added_by: r.added_by,
        created_at: r.created_at,
    }
}

fn login_context(team: Uuid, registry: &str) -> String {
    format!("registry_logins.secret:{team}:{registry}")
}

/// A registry login's host: `ghcr.io`, `127.0.0.1:5000` (no repository part).
fn parse_registry_host(text: &str) -> Result<String, AppError> {
    let entry = parse_allowed_entry(text)?;
    if entry.contains('/') {
        return Err(AppError::invalid(
            "registry",
            "a login is for a whole registry: give its host only, e.g. ghcr.io",
        ));
    }
    Ok(entry)
}

impl Images {
    pub fn new(store: Store) -> Self {
        Images {
            store,
            clock: Clock::system(),
            keys: Arc::new(DataKeys::ephemeral()),
            http: Self::http(None).unwrap_or_default(),
        }
    }

    /// Reads the time from `clock` instead of the system's.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The client catalog entries are resolved with: the system's and Mozilla's roots,
    /// plus `extra_ca_pem` (a PEM bundle, `TESSERA_REGISTRY_CA`).
    pub fn http(extra_ca_pem: Option<&[u8]>) -> Result<reqwest::Client, String> {
        tessera_registry::client::http_client_builder(extra_ca_pem)?
            .timeout(RESOLVE_TIMEOUT)
            .user_agent(concat!("tessera/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| e.to_string())
    }

    /// Seals logins under the server's data keys (else under a key that dies with the
    /// process).
    pub fn with_data_keys(mut self, keys: Arc<DataKeys>) -> Self {
        self.keys = keys;
        self
    }

    /// Resolves catalog entries with this client (e.g. one that trusts a private CA).
    pub fn with_http(mut self, http: reqwest::Client) -> Self {
        self.http = http;
        self
    }

    /// The catalog: of one team (its readers: platform entries and the team's own), or
    /// everything the caller sees (`team: None`: platform entries and every team of
    /// theirs; all entries for a platform admin).
    pub async fn catalog(
        &self,
        p: &Principal,
        team: Option<TeamId>,
    ) -> Result<Vec<CatalogImage>, AppError> {
        let rows = match team {
            Some(t) => {
                authz::team(&self.store, p, t, Need::Read).await?;
                self.store.catalog_images(Some(&[t])).await
            }
            None if p.is_admin() => self.store.catalog_images(None).await,
            None => {
                let teams = self.member_teams(p).await?;
                self.store.catalog_images(Some(&teams)).await
            }
        }
        .map_err(internal("loading the image catalog"))?;
        Ok(rows.into_iter().map(view).collect())
    }

    async fn member_teams(&self, p: &Principal) -> Result<Vec<TeamId>, AppError> {
        let (rows, _) = self
            .store
            .list_user_teams(p.user_id(), 0, 1000)
            .await
            .map_err(internal("loading teams"))?;
        Ok(rows.into_iter().map(|t| t.id).collect())
    }

    /// Adds an entry, pinned to the digest its reference names now (the team's login to
    /// the registry is used for a team's entry). A platform entry needs a platform admin;
    /// a team's, its admin.
    pub async fn add(
        &self,
        p: &Principal,
        req: &NewCatalogImage,
    ) -> Result<CatalogImage, AppError> {
        match req.team_id {
            Some(t) => {
                authz::team(&self.store, p, TeamId(t), Need::ManageMembers).await?;
            }
            None => {
                authz::admin(p)?;
            }
        }
        let name = parse_catalog_name(&req.name)?;
        let reference = ImageRef::parse(&req.reference)?;
        self.check_allowed(&reference).await?;
        let login = match req.team_id {
            Some(t) => self.login(t, reference.registry()).await?,
            None => None,
        };
        let creds = login.as_ref().map(|l| tessera_registry::Credentials {
            username: l.username.clone(),
            password: l.password.clone(),
        });
        let resolved = tessera_registry::resolve(&self.http, &reference, creds.as_ref())
            .await
            .map_err(|e| {
                tracing::info!(image = %reference, error = %e, "resolving a catalog image failed");
                let hint = match &e {
                    tessera_registry::PullError::Unauthorized { .. } if req.team_id.is_some() => {
                        " (set or fix the team's login to this registry)"
                    }
                    tessera_registry::PullError::Unauthorized { .. } => {
                        " (platform entries are public images: add private ones to a team)"
                    }
                    _ => "",
                };
                AppError::invalid("image", format!("{reference} cannot be used: {e}{hint}"))
            })?;
        let row = CatalogRow {
            id: Uuid::now_v7(),
            team_id: req.team_id.map(TeamId),
            team_name: None,
            name: name.clone(),
            reference: reference.to_string(),
            pinned: resolved.pinned.to_string(),
            requires_cuda: resolved.requires_cuda.map(|c| c.to_string()),
            added_by: p.username().as_str().to_owned(),
            created_at: self.clock.now(),
        };
        let inserted = self
            .store
            .insert_catalog_image(&row)
            .await
            .map_err(internal("storing a catalog image"))?;
        if !inserted {
            return Err(AppError::conflict(format!(
                "the catalog already has an image named {name:?}; remove it first or choose another name"
            )));
        }
        self.audit(
            p,
            AuditAction::ImageAdd,
            row.id,
            row.team_id,
            &format!("{name}: {} → {}", row.reference, row.pinned),
        )
        .await;
        let stored = self
            .store
            .catalog_image(row.id)
            .await
            .map_err(internal("loading a catalog image"))?
            .ok_or(AppError::Internal)?;
        Ok(view(stored))
    }

    /// Removes an entry (its team's admins, or a platform admin; a platform entry only a
    /// platform admin). Workloads already running in it keep running; profiles that named
    /// it fall back to the node's environment.
    pub async fn remove(&self, p: &Principal, id: Uuid) -> Result<(), AppError> {
        let row = found(
            "loading a catalog image",
            self.store.catalog_image(id).await,
        )?;
        match row.team_id {
            Some(t) => {
                authz::team(&self.store, p, t, Need::ManageMembers).await?;
            }
            None => {
                authz::admin(p)?;
            }
        }
        if !self
            .store
            .delete_catalog_image(id)
            .await
            .map_err(internal("deleting a catalog image"))?
        {
            return Err(AppError::NotFound);
        }
        self.audit(p, AuditAction::ImageRemove, id, row.team_id, &row.name)
            .await;
        Ok(())
    }

    /// The registry allow-list (anyone signed in may read it: it says what can be added).
    pub async fn allowlist(&self, _p: &Principal) -> Result<Vec<String>, AppError> {
        self.store
            .registry_allowlist()
            .await
            .map_err(internal("loading the registry allow-list"))
    }

    /// Allows images from `entry` (`registry` or `registry/repository prefix`); platform
    /// admins. Returns the list.
    pub async fn allow(&self, p: &Principal, entry: &str) -> Result<Vec<String>, AppError> {
        authz::admin(p)?;
        let entry = parse_allowed_entry(entry)?;
        let added = self
            .store
            .allow_registry(&entry, p.username().as_str(), self.clock.now())
            .await
            .map_err(internal("storing the registry allow-list"))?;
        if added {
            self.audit(p, AuditAction::RegistryAllow, Uuid::nil(), None, &entry)
                .await;
        }
        self.allowlist(p).await
    }

    /// Stops allowing `entry`; platform admins. Catalog entries from it stay listed but
    /// no new workload runs in them. Returns the list.
    pub async fn disallow(&self, p: &Principal, entry: &str) -> Result<Vec<String>, AppError> {
        authz::admin(p)?;
        let gone = self
            .store
            .disallow_registry(entry.trim())
            .await
            .map_err(internal("storing the registry allow-list"))?;
        if !gone {
            return Err(AppError::NotFound);
        }
        self.audit(
            p,
            AuditAction::RegistryDisallow,
            Uuid::nil(),
            None,
            entry.trim(),
        )
        .await;
        self.allowlist(p).await
    }

    async fn check_allowed(&self, image: &ImageRef) -> Result<(), AppError> {
        let list = self
            .store
            .registry_allowlist()
            .await
            .map_err(internal("loading the registry allow-list"))?;
        image::allowed_by(&list, image)
    }

    /// A team's registry logins, without secrets (its admins).
    pub async fn logins(
        &self,
        p: &Principal,
        team: TeamId,
    ) -> Result<Vec<RegistryLoginView>, AppError> {
        authz::team(&self.store, p, team, Need::ManageMembers).await?;
        let rows = self
            .store
            .registry_logins(team)
            .await
            .map_err(internal("loading registry logins"))?;
        Ok(rows
            .into_iter()
            .map(|r| RegistryLoginView {
                team_id: r.team_id,
                registry: r.registry,
                username: r.username,
                updated_at: r.updated_at,
            })
            .collect())
    }

    /// Sets a team's login to `registry` (its admins); the password is sealed and never
    /// shown back.
    pub async fn set_login(
        &self,
        p: &Principal,
        team: TeamId,
        registry: &str,
        username: &str,
        password: &str,
    ) -> Result<RegistryLoginView, AppError> {
        authz::team(&self.store, p, team, Need::ManageMembers).await?;
        let registry = parse_registry_host(registry)?;
        let username = username.trim();
        if username.is_empty()
            || username.chars().count() > 255
            || username.chars().any(char::is_control)
        {
            return Err(AppError::invalid(
                "username",
                "1 to 255 characters, no control characters",
            ));
        }
        if password.is_empty() || password.len() > 8192 || password.chars().any(char::is_control) {
            return Err(AppError::invalid(
                "password",
                "1 to 8192 characters, no line breaks or control characters",
            ));
        }
        let sealed = self
            .keys
            .seal(&login_context(team.0, &registry), password)
            .map_err(|e| {
                tracing::error!(error = %e, "sealing a registry login");
                AppError::Internal
            })?;
        let now = self.clock.now();
        self.store
            .set_registry_login(team, &registry, username, &sealed, now)
            .await
            .map_err(internal("storing a registry login"))?;
        self.audit(
            p,
            AuditAction::RegistryLoginSet,
            Uuid::nil(),
            Some(team),
            &format!("{registry} as {username}"),
        )
        .await;
        Ok(RegistryLoginView {
            team_id: team,
            registry,
            username: username.to_owned(),
            updated_at: now,
        })
    }

    /// Removes a team's login to `registry` (its admins).
    pub async fn remove_login(
        &self,
        p: &Principal,
        team: TeamId,
        registry: &str,
    ) -> Result<(), AppError> {
        authz::team(&self.store, p, team, Need::ManageMembers).await?;
        let registry = registry.trim();
        if !self
            .store
            .delete_registry_login(team, registry)
            .await
            .map_err(internal("deleting a registry login"))?
        {
            return Err(AppError::NotFound);
        }
        self.audit(
            p,
            AuditAction::RegistryLoginRemove,
            Uuid::nil(),
            Some(team),
            registry,
        )
        .await;
        Ok(())
    }

    /// Team `team`'s login to `registry`, opened; `None` when it has none.
    pub(crate) async fn login(
        &self,
        team: Uuid,
        registry: &str,
    ) -> Result<Option<RegistryLogin>, AppError> {
        let Some((username, sealed)) = self
            .store
            .registry_login_secret(TeamId(team), registry)
            .await
            .map_err(internal("loading a registry login"))?
        else {
            return Ok(None);
        };
        let password = self
            .keys
            .open(&login_context(team, registry), &sealed)
            .map_err(|e| {
                tracing::error!(%team, registry, error = %e, "a registry login does not open");
                AppError::Internal
            })?;
        Ok(Some(RegistryLogin { username, password }))
    }

    /// The image a workload of `team` asked for: an entry of the catalog the team sees,
    /// named by its id, its name or its pinned reference, from a registry still allowed.
    pub(crate) async fn choose(&self, team: TeamId, text: &str) -> Result<Chosen, AppError> {
        let text = text.trim();
        let rows = self
            .store
            .catalog_images(Some(&[team]))
            .await
            .map_err(internal("loading the image catalog"))?;
        let id = Uuid::parse_str(text).ok();
        let own_first = |r: &&CatalogRow| r.team_id.is_none();
        let found = rows
            .iter()
            .find(|r| Some(r.id) == id || r.pinned == text)
            .or_else(|| {
                // A name: the team's own entry wins over a platform one of the same name.
                let mut named: Vec<&CatalogRow> = rows.iter().filter(|r| r.name == text).collect();
                named.sort_by_key(own_first);
                named.into_iter().next()
            })
            .ok_or_else(|| {
                AppError::invalid(
                    "image",
                    format!(
                        "{text:?} is not in your team's image catalog; choose one of its images \
                         (GET /api/v1/images) or ask a team admin to add it"
                    ),
                )
            })?;
        let pinned = ImageRef::parse(&found.pinned)?;
        self.check_allowed(&pinned).await?;
        Ok(Chosen {
            id: found.id,
            pinned: found.pinned.clone(),
            requires_cuda: found
                .requires_cuda
                .as_deref()
                .and_then(|c| CudaVersion::parse(c).ok()),
        })
    }

    async fn audit(
        &self,
        p: &Principal,
        action: AuditAction,
        id: Uuid,
        team: Option<TeamId>,
        note: &str,
    ) {
        Entry::new(Some(p.username().as_str()), action, "image", id)
            .team(team)
            .note(note)
            .record(&self.store, self.clock.now())
            .await;
    }
}
