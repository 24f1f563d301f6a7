//! Images: the catalog, the registry allow-list and teams' registry logins (issue 36).

use super::*;
use tessera_core::services::images::NewCatalogImage;
use tessera_domain::image::{CatalogImage, RegistryLoginView};

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub(super) struct CatalogQuery {
    /// Only what this team sees (platform entries and its own).
    team: Option<Uuid>,
}

#[utoipa::path(get, path = "/api/v1/images", tag = "images", params(CatalogQuery),
    description = "The image catalog the caller sees: platform-wide entries and their teams' own \
        (platform admins: every entry). Each is pinned to a digest (`pinned`); a workload names \
        one by id, name or pinned reference in its `image`.",
    responses((status = 200, description = "OK", body = Vec<CatalogImage>), NotFound))]
pub(super) async fn list_images(
    Call(s, p): Call,
    Query(q): Query<CatalogQuery>,
) -> ApiResult<Vec<CatalogImage>> {
    ok(s.images.catalog(&p, q.team.map(TeamId)).await)
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct NewImageBody {
    /// The team whose catalog it joins (its admins); absent: platform-wide (platform admins).
    #[serde(default)]
    team_id: Option<Uuid>,
    /// What people pick it by, e.g. `PyTorch 2.3 (CUDA 12.4)`; unique in its catalog.
    name: String,
    /// `registry/repository:tag` or `…@sha256:…`, from an allowed registry. Resolved to its
    /// digest now (with the team's login to the registry, for a team entry) and pinned.
    reference: String,
}

#[utoipa::path(post, path = "/api/v1/images", tag = "images", request_body = NewImageBody,
    description = "Adds an image to a catalog, pinned to the digest its reference names now. \
        Refused (422 naming `image`) when the registry is not allowed or the image cannot be \
        fetched; 409 when the catalog has an image of that name.",
    responses((status = 201, description = "Created", body = CatalogImage), Forbidden, NotFound, Conflict, Invalid))]
pub(super) async fn add_image(
    Call(s, p): Call,
    JsonBody(b): JsonBody<NewImageBody>,
) -> Created<CatalogImage> {
    let req = NewCatalogImage {
        team_id: b.team_id,
        name: b.name,
        reference: b.reference,
    };
    created(s.images.add(&p, &req).await)
}

#[utoipa::path(delete, path = "/api/v1/images/{id}", tag = "images",
    description = "Removes a catalog entry (its team's admins; a platform entry: platform admins). \
        Running workloads keep their image; profiles that named it fall back to the node's environment.",
    responses((status = 204, description = "Done"), Forbidden, NotFound))]
pub(super) async fn remove_image(
    Call(s, p): Call,
    Path(id): Path<Uuid>,
) -> Result<StatusCode, ApiError> {
    s.images.remove(&p, id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/api/v1/registries", tag = "images",
    description = "Where images may come from: registry hosts or `registry/repository` prefixes.",
    responses((status = 200, description = "OK", body = Vec<String>)))]
pub(super) async fn list_registries(Call(s, p): Call) -> ApiResult<Vec<String>> {
    ok(s.images.allowlist(&p).await)
}

#[derive(Deserialize, utoipa::ToSchema, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub(super) struct RegistryEntry {
    /// A registry host (`ghcr.io`, `127.0.0.1:5000`) or a repository prefix under one
    /// (`ghcr.io/acme`, `docker.io/library`).
    entry: String,
}

#[utoipa::path(post, path = "/api/v1/registries", tag = "images", request_body = RegistryEntry,
    description = "Allows images from a registry or repository prefix (platform admins). Returns the list.",
    responses((status = 200, description = "OK", body = Vec<String>), Forbidden, Invalid))]
pub(super) async fn allow_registry(
    Call(s, p): Call,
    JsonBody(b): JsonBody<RegistryEntry>,
) -> ApiResult<Vec<String>> {
    ok(s.images.allow(&p, &b.entry).await)
}

#[utoipa::path(delete, path = "/api/v1/registries", tag = "images", params(RegistryEntry),
    description = "Stops allowing an entry (platform admins): no new workload runs in an image \
        from it. Returns the list.",
    responses((status = 200, description = "OK", body = Vec<String>), Forbidden, NotFound))]
pub(super) async fn disallow_registry(
    Call(s, p): Call,
    Query(q): Query<RegistryEntry>,
) -> ApiResult<Vec<String>> {
    ok(s.images.disallow(&p, &q.entry).await)
}

#[utoipa::path(get, path = "/api/v1/teams/{id}/registry-logins", tag = "images",
    description = "The team's registry logins (team admins, platform admins): registry and \
        username; never the password.",
    responses((status = 200, description = "OK", body = Vec<RegistryLoginView>), Forbidden, NotFound))]
pub(super) async fn list_registry_logins(
    Call(s, p): Call,
    Path(team): Path<Uuid>,
) -> ApiResult<Vec<RegistryLoginView>> {
    ok(s.images.logins(&p, TeamId(team)).await)
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct LoginBody {
    /// The registry host, e.g. `ghcr.io`.
    registry: String,
    username: String,
    /// A password or access token: sealed at rest, sent only to the node (or the
    /// Kubernetes pull secret) that pulls this team's images, never shown back.
    password: String,
}

#[utoipa::path(put, path = "/api/v1/teams/{id}/registry-logins", tag = "images",
    request_body = LoginBody,
    description = "Sets (or replaces) the team's login to a registry (team admins, platform admins).",
    responses((status = 200, description = "OK", body = RegistryLoginView), Forbidden, NotFound, Invalid))]
pub(super) async fn set_registry_login(
    Call(s, p): Call,
    Path(team): Path<Uuid>,
    JsonBody(b): JsonBody<LoginBody>,
) -> ApiResult<RegistryLoginView> {
    ok(s.images
        .set_login(&p, TeamId(team), &b.registry, &b.username, &b.password)
        .await)
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub(super) struct LoginQuery {
    /// The registry host whose login to remove.
    registry: String,
}

#[utoipa::path(delete, path = "/api/v1/teams/{id}/registry-logins", tag = "images",
    params(LoginQuery),
    responses((status = 204, description = "Done"), Forbidden, NotFound))]
pub(super) async fn remove_registry_login(
    Call(s, p): Call,
    Path(team): Path<Uuid>,
    Query(q): Query<LoginQuery>,
) -> Result<StatusCode, ApiError> {
    s.images.remove_login(&p, TeamId(team), &q.registry).await?;
    Ok(StatusCode::NO_CONTENT)
}
