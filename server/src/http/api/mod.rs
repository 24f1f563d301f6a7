//! The REST API under `/api/v1`, documented by the OpenAPI document it generates
//! (`/api/v1/openapi.json`). Handlers are a few lines: extract, call the service, map.

use super::auth::{Call, Caller};
use super::error::{
    ApiError, Conflict, ErrorBody, Forbidden, Invalid, JsonBody, NotFound, Path, Query,
    Unauthorized,
};
use crate::AppState;
use axum::Json;
use http::StatusCode;
use serde::Deserialize;
use tessera_core::services::allocations::ListFilter;
use tessera_core::services::billing::UsageQuery;
use tessera_core::services::workloads::{NewJob, NewNotebook, WorkloadFilter};
use tessera_domain::account::{Me, SetupChecklist};
use tessera_domain::alloc::{AllocationView, NewAllocation, QuotaView};
use tessera_domain::audit::AuditEntryView;
use tessera_domain::billing::{
    BudgetView, CostEstimate, EstimateQuery, LedgerEntryView, NewRate, RateView, SetBudget,
    Statement, UsageReport,
};
use tessera_domain::cluster::{ClusterSummary, NodeTelemetry, NodeView, ServerReplicaView};
use tessera_domain::drain::DrainRequest;
use tessera_domain::error::AppError;
use tessera_domain::ids::{TeamId, UserId};
use tessera_domain::tenancy::{
    ApiTokenView, CreatedSecret, JoinTokenView, MemberView, Page, PageRequest, TeamView, UserView,
};
use tessera_domain::workload::{LogSlice, NotebookProfile, WorkloadKind, WorkloadView};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

mod allocations;
mod billing;
mod bookings;
mod images;
mod nodes;
mod notifications;
mod spares;
mod teams;
mod tokens;
mod users;
mod workloads;

use allocations::*;
use billing::*;
use bookings::*;
use images::*;
use nodes::*;
use notifications::*;
use spares::*;
use teams::*;
use tokens::*;
use users::*;
use workloads::*;

type ApiResult<T> = Result<Json<T>, ApiError>;
type Created<T> = Result<(StatusCode, Json<T>), ApiError>;

/// A use case's result as a 200 response.
fn ok<T>(result: Result<T, AppError>) -> ApiResult<T> {
    Ok(Json(result?))
}

/// The page size a list query gets when it names none.
fn default_limit() -> u32 {
    PageRequest::default().limit
}

/// A use case's result as a 201 response.
fn created<T>(result: Result<T, AppError>) -> Created<T> {
    Ok((StatusCode::CREATED, Json(result?)))
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Tessera API",
        description = "Self-service GPU portal. Authenticate with a personal API token \
                       (`Authorization: Bearer tsk_…`, created under My account) or a browser \
                       session. Errors share one shape (`ErrorBody`); lists take `offset` and \
                       `limit` (≤ 200) and return `{items, total, offset, limit}`. Another \
                       team's object answers exactly like a missing one (404)."
    ),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
    components(schemas(ErrorBody, tessera_domain::notify::WebhookBody))
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        if let Some(c) = openapi.components.as_mut() {
            c.add_security_scheme(
                "bearer",
                SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
            );
        }
    }
}

/// The `/api/v1` routes and their OpenAPI document.
pub fn router() -> (axum::Router<AppState>, utoipa::openapi::OpenApi) {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(me))
        .routes(routes!(setup_checklist))
        .routes(routes!(dismiss_setup))
        .routes(routes!(list_users, create_user))
        .routes(routes!(disable_user))
        .routes(routes!(enable_user))
        .routes(routes!(reset_password))
        .routes(routes!(list_teams, create_team))
        .routes(routes!(get_team, rename_team))
        .routes(routes!(get_team_grace, set_team_grace))
        .routes(routes!(archive_team))
        .routes(routes!(unarchive_team))
        .routes(routes!(list_members, add_member))
        .routes(routes!(change_role, remove_member))
        .routes(routes!(list_tokens, create_token))
        .routes(routes!(revoke_token))
        .routes(routes!(list_join_tokens, create_join_token))
        .routes(routes!(revoke_join_token))
        .routes(routes!(list_nodes))
        .routes(routes!(get_node))
        .routes(routes!(revoke_node))
        .routes(routes!(drain_node, undrain_node))
        .routes(routes!(set_node_group))
        .routes(routes!(node_telemetry))
        .routes(routes!(set_gpu_layout))
        .routes(routes!(set_gpu_sharing))
        .routes(routes!(clear_gpu_health))
        .routes(routes!(list_spares))
        .routes(routes!(set_spares, clear_spares))
        .routes(routes!(cluster_summary))
        .routes(routes!(list_servers))
        .routes(routes!(free_now))
        .routes(routes!(list_allocations, request_allocation))
        .routes(routes!(get_allocation))
        .routes(routes!(release_allocation))
        .routes(routes!(extend_allocation))
        .routes(routes!(approve_allocation))
        .routes(routes!(deny_allocation))
        .routes(routes!(list_bookings, create_booking))
        .routes(routes!(get_booking))
        .routes(routes!(cancel_booking))
        .routes(routes!(list_quotas))
        .routes(routes!(set_quota))
        .routes(routes!(set_team_priority))
        .routes(routes!(audit_log))
        .routes(routes!(list_rates, set_rate))
        .routes(routes!(estimate_cost))
        .routes(routes!(list_budgets))
        .routes(routes!(get_budget, set_budget))
        .routes(routes!(ledger))
        .routes(routes!(reverse_charge))
        .routes(routes!(usage))
        .routes(routes!(statement))
        .routes(routes!(chargeback_csv))
        .routes(routes!(usage_csv))
        .routes(routes!(list_workloads))
        .routes(routes!(launch_notebook))
        .routes(routes!(list_notebook_profiles, save_notebook_profile))
        .routes(routes!(delete_notebook_profile))
        .routes(routes!(submit_job))
        .routes(routes!(list_images, add_image))
        .routes(routes!(remove_image))
        .routes(routes!(list_registries, allow_registry, disallow_registry))
        .routes(routes!(
            list_registry_logins,
            set_registry_login,
            remove_registry_login
        ))
        .routes(routes!(get_workload))
        .routes(routes!(stop_workload))
        .routes(routes!(super::exec::exec_workload))
        .routes(routes!(workload_logs))
        .routes(routes!(workload_log_file))
        .routes(routes!(my_notifications, set_my_notifications))
        .routes(routes!(resend_email_verification))
        .routes(routes!(verify_email))
        .routes(routes!(list_webhooks, create_webhook))
        .routes(routes!(get_webhook, update_webhook, delete_webhook))
        .routes(routes!(webhook_deliveries))
        .routes(routes!(test_webhook))
        .routes(routes!(list_platform_webhooks, create_platform_webhook))
        .routes(routes!(
            get_platform_webhook,
            update_platform_webhook,
            delete_platform_webhook
        ))
        .routes(routes!(platform_webhook_deliveries))
        .routes(routes!(test_platform_webhook))
        .split_for_parts()
}

#[utoipa::path(get, path = "/api/v1/me", tag = "account",
    responses((status = 200, description = "OK", body = Me), Unauthorized))]
async fn me(Caller(p): Caller) -> ApiResult<Me> {
    Ok(Json(Me::from(&p)))
}

#[utoipa::path(get, path = "/api/v1/setup", tag = "accounts",
    description = "A platform admin's first-run checklist: create a team, give it a quota, add \
                   people (or single sign-on), add GPU nodes, set prices; each step ticked once done.",
    responses((status = 200, description = "OK", body = SetupChecklist), Forbidden))]
async fn setup_checklist(Call(s, p): Call) -> ApiResult<SetupChecklist> {
    ok(s.accounts.setup_checklist(&p).await)
}

#[utoipa::path(post, path = "/api/v1/setup/dismiss", tag = "accounts",
    description = "Puts the first-run checklist away for the calling platform admin.",
    responses((status = 200, description = "OK", body = SetupChecklist), Forbidden))]
async fn dismiss_setup(Call(s, p): Call) -> ApiResult<SetupChecklist> {
    ok(s.accounts.dismiss_setup(&p).await)
}
