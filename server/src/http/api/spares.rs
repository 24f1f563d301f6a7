//! Hot spares: per GPU model, the GPUs platform admins keep idle for high-priority work
//! displaced by a GPU fault or a lost node (docs/operations.md, "Hot spares").

use super::*;
use tessera_domain::spares::{SpareRequest, SpareView};

#[utoipa::path(get, path = "/api/v1/spares", tag = "nodes",
    description = "Each GPU model's hot-spare rule (`gpus` or `percent`), how many spares it \
        asks for now and the GPUs kept idle as spares (as of the last scheduler pass). \
        Capacity shown to teams leaves them out.",
    responses((status = 200, description = "OK", body = Vec<SpareView>), Unauthorized))]
pub(super) async fn list_spares(Call(s, p): Call) -> ApiResult<Vec<SpareView>> {
    ok(s.allocations.spares(&p).await)
}

#[utoipa::path(put, path = "/api/v1/spares/{model}", tag = "nodes",
    request_body = SpareRequest,
    params(("model" = String, Path, description = "A GPU model of the catalog (`H100-80GB`)")),
    description = "Keeps `gpus` GPUs, or `percent` (0–50, rounded up) of the model's \
        in-service GPUs, idle as hot spares (platform admins). Ordinary work is not placed \
        on them; a high-priority allocation on a GPU that turns unhealthy, or on a node that \
        is lost, is moved onto one at once.",
    responses((status = 200, description = "OK", body = Vec<SpareView>), Forbidden, Invalid))]
pub(super) async fn set_spares(
    Call(s, p): Call,
    Path(model): Path<String>,
    JsonBody(b): JsonBody<SpareRequest>,
) -> ApiResult<Vec<SpareView>> {
    ok(s.allocations.set_spares(&p, &model, &b).await)
}

#[utoipa::path(delete, path = "/api/v1/spares/{model}", tag = "nodes",
    params(("model" = String, Path, description = "A GPU model of the catalog")),
    description = "Keeps no spares of the model any more (platform admins); also 204 when it \
        kept none.",
    responses((status = 204, description = "Done"), Forbidden, Invalid))]
pub(super) async fn clear_spares(
    Call(s, p): Call,
    Path(model): Path<String>,
) -> Result<StatusCode, ApiError> {
    s.allocations.clear_spares(&p, &model).await?;
    Ok(StatusCode::NO_CONTENT)
}
