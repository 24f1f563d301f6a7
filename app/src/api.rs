//! Server functions: the UI's only way to the backend.
//!
//! Each is a thin adapter over one use case of `tessera-core`: [`ssr::call`] takes the
//! services and the signed-in principal from context, runs the closure (parse the form's
//! strings, call one service method) and maps the result. Errors travel as [`UiError`],
//! which carries the domain [`AppError`] (so forms can put messages next to fields) and an
//! echo of non-secret inputs, so a form posted without JavaScript comes back with what the
//! user typed.

// A server function takes one argument per form field, so a long form means many.
#![allow(clippy::too_many_arguments)]

use leptos::prelude::*;
use leptos::server_fn::codec::JsonEncoding;
use leptos::server_fn::error::{FromServerFnError, ServerFnErrorErr};
use serde::{Deserialize, Serialize};
#[cfg(feature = "ssr")]
use ssr::{id, number, optional_number};
use std::collections::BTreeMap;
use tessera_domain::account::{Me, SetupChecklist, SignInOptions};
use tessera_domain::alloc::{AllocationView, QuotaView};
use tessera_domain::billing::{BudgetView, LedgerEntryView, RateView, Statement, UsageReport};
#[cfg(feature = "ssr")]
use tessera_domain::billing::{NewRate, SetBudget};
use tessera_domain::cluster::{ClusterSummary, NodeTelemetry, NodeView, ServerReplicaView};
use tessera_domain::error::AppError;
#[cfg(feature = "ssr")]
use tessera_domain::ids::{AllocationId, TeamId, UserId};
use tessera_domain::tenancy::{
    ApiTokenView, CreatedSecret, JoinTokenView, MemberView, Page, PageRequest, TeamView, UserView,
};
use tessera_domain::wire::DesiredInstance;
#[cfg(feature = "ssr")]
use tessera_domain::wire::MigMode;
use tessera_domain::workload::{LogSlice, NotebookProfile, WorkloadView};

/// An [`AppError`] plus the non-secret form values to show again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UiError {
    pub error: AppError,
    #[serde(default)]
    pub echo: BTreeMap<String, String>,
}

impl UiError {
    /// The message for `field`, if the error belongs to it.
    pub fn for_field(&self, field: &str) -> Option<String> {
        match &self.error {
            AppError::Invalid { field: f, message } if f == field => Some(message.clone()),
            _ => None,
        }
    }

    /// The message for the whole form (anything not tied to a field).
    pub fn general(&self) -> Option<String> {
        self.error.field().is_none().then(|| self.error.to_string())
    }

    pub fn echoed(&self, field: &str) -> Option<String> {
        self.echo.get(field).cloned()
    }
}

impl From<AppError> for UiError {
    fn from(error: AppError) -> Self {
        UiError {
            error,
            echo: BTreeMap::new(),
        }
    }
}

impl FromServerFnError for UiError {
    type Encoder = JsonEncoding;

    fn from_server_fn_error(value: ServerFnErrorErr) -> Self {
        let error = match value {
            ServerFnErrorErr::Args(m)
            | ServerFnErrorErr::MissingArg(m)
            | ServerFnErrorErr::Deserialization(m) => AppError::invalid("form", m),
            _ => AppError::Internal,
        };
        error.into()
    }
}

/// The signed-in user, or `None`.
#[server(prefix = "/fn", endpoint = "current_user")]
pub async fn current_user() -> Result<Option<Me>, UiError> {
    ssr::with_request([], async |s, req| {
        let p = tessera_core::request::principal(s, req).await?;
        Ok(p.as_ref().map(Me::from))
    })
    .await
}

/// What the sign-in page offers besides a password (single sign-on's provider name).
#[server(prefix = "/fn", endpoint = "login_options")]
pub async fn login_options() -> Result<SignInOptions, UiError> {
    ssr::with_request([], async |s, _| Ok(s.accounts.sign_in_options())).await
}

#[server(prefix = "/fn", endpoint = "login")]
pub async fn login(
    username: String,
    password: String,
    next: Option<String>,
) -> Result<(), UiError> {
    ssr::with_request([("username", username.clone())], async |s, req| {
        tessera_core::request::sign_in(s, req, &username, &password).await?;
        leptos_axum::redirect(&tessera_domain::account::after_sign_in(next.as_deref()));
        Ok(())
    })
    .await
}

/// A platform admin's first-run checklist.
#[server(prefix = "/fn", endpoint = "setup_checklist")]
pub async fn get_setup_checklist() -> Result<SetupChecklist, UiError> {
    ssr::call([], async |s, p| s.accounts.setup_checklist(p).await).await
}

/// Puts the first-run checklist away for this admin.
#[server(prefix = "/fn", endpoint = "dismiss_setup")]
pub async fn dismiss_setup() -> Result<SetupChecklist, UiError> {
    ssr::call([], async |s, p| s.accounts.dismiss_setup(p).await).await
}

#[server(prefix = "/fn", endpoint = "logout")]
pub async fn logout() -> Result<(), UiError> {
    ssr::with_request([], async |_, req| {
        tessera_core::request::sign_out(req).await?;
        leptos_axum::redirect("/login");
        Ok(())
    })
    .await
}

#[server(prefix = "/fn", endpoint = "change_password")]
pub async fn change_password(
    current_password: String,
    new_password: String,
    confirm_password: String,
) -> Result<(), UiError> {
    ssr::with_request([], async |s, req| {
        let who = tessera_core::request::principal(s, req)
            .await?
            .ok_or(AppError::Unauthorized)?;
        tessera_core::request::change_password(
            s,
            req,
            &who,
            &current_password,
            &new_password,
            &confirm_password,
        )
        .await?;
        leptos_axum::redirect("/account?changed=1");
        Ok(())
    })
    .await
}

// ---- account: API tokens ----

#[server(prefix = "/fn", endpoint = "list_tokens")]
pub async fn list_tokens(page: PageRequest) -> Result<Page<ApiTokenView>, UiError> {
    ssr::call([], async |s, p| s.tokens.list(p, page).await).await
}

#[server(prefix = "/fn", endpoint = "create_token")]
pub async fn create_token(
    name: String,
    expires_in_days: Option<String>,
) -> Result<CreatedSecret<ApiTokenView>, UiError> {
    let echo = [
        ("name", name.clone()),
        (
            "expires_in_days",
            expires_in_days.clone().unwrap_or_default(),
        ),
    ];
    ssr::call(echo, async |s, p| {
        let days = optional_number(expires_in_days.as_deref(), "expires_in_days")?;
        s.tokens.create(p, &name, days).await
    })
    .await
}

#[server(prefix = "/fn", endpoint = "revoke_token")]
pub async fn revoke_token(id: String) -> Result<(), UiError> {
    ssr::call([], async |s, p| s.tokens.revoke(p, ssr::id(&id)?).await).await
}

// ---- users (platform admin) ----

#[server(prefix = "/fn", endpoint = "list_users")]
pub async fn list_users(page: PageRequest) -> Result<Page<UserView>, UiError> {
    ssr::call([], async |s, p| s.tenancy.list_users(p, page).await).await
}

#[server(prefix = "/fn", endpoint = "create_user")]
pub async fn create_user(
    username: String,
    password: String,
    is_admin: Option<String>,
) -> Result<UserView, UiError> {
    let admin = is_admin.is_some_and(|v| !v.is_empty() && v != "false");
    ssr::call([("username", username.clone())], async |s, p| {
        s.tenancy.create_user(p, &username, &password, admin).await
    })
    .await
}

#[server(prefix = "/fn", endpoint = "set_user_disabled")]
pub async fn set_user_disabled(user_id: String, disabled: bool) -> Result<UserView, UiError> {
    ssr::call([], async |s, p| {
        let user = UserId(id(&user_id)?);
        s.tenancy.set_user_disabled(p, user, disabled).await
    })
    .await
}

#[server(prefix = "/fn", endpoint = "reset_password")]
pub async fn reset_password(user_id: String, password: String) -> Result<UserView, UiError> {
    ssr::call([], async |s, p| {
        let user = UserId(id(&user_id)?);
        s.tenancy.reset_password(p, user, &password).await
    })
    .await
}

// ---- teams ----

#[server(prefix = "/fn", endpoint = "list_teams")]
pub async fn list_teams(page: PageRequest) -> Result<Page<TeamView>, UiError> {
    ssr::call([], async |s, p| s.tenancy.list_teams(p, page).await).await
}

#[server(prefix = "/fn", endpoint = "get_team")]
pub async fn get_team(team_id: String) -> Result<TeamView, UiError> {
    ssr::call([], async |s, p| {
        s.tenancy.team(p, TeamId(id(&team_id)?)).await
    })
    .await
}

#[server(prefix = "/fn", endpoint = "create_team")]
pub async fn create_team(name: String) -> Result<TeamView, UiError> {
    ssr::call([("name", name.clone())], async |s, p| {
        s.tenancy.create_team(p, &name).await
    })
    .await
}

#[server(prefix = "/fn", endpoint = "rename_team")]
pub async fn rename_team(team_id: String, name: String) -> Result<TeamView, UiError> {
    ssr::call([("name", name.clone())], async |s, p| {
        s.tenancy.rename_team(p, TeamId(id(&team_id)?), &name).await
    })
    .await
}

#[server(prefix = "/fn", endpoint = "set_team_archived")]
pub async fn set_team_archived(team_id: String, archived: bool) -> Result<TeamView, UiError> {
    ssr::call([], async |s, p| {
        let team = TeamId(id(&team_id)?);
        s.tenancy.set_team_archived(p, team, archived).await
    })
    .await
}

#[server(prefix = "/fn", endpoint = "list_members")]
pub async fn list_members(team_id: String, page: PageRequest) -> Result<Page<MemberView>, UiError> {
    ssr::call([], async |s, p| {
        s.tenancy.list_members(p, TeamId(id(&team_id)?), page).await
    })
    .await
}

#[server(prefix = "/fn", endpoint = "add_member")]
pub async fn add_member(
    team_id: String,
    username: String,
    role: String,
) -> Result<MemberView, UiError> {
    let echo = [("username", username.clone()), ("role", role.clone())];
    ssr::call(echo, async |s, p| {
        let team = TeamId(id(&team_id)?);
        s.tenancy.add_member(p, team, &username, &role).await
    })
    .await
}

#[server(prefix = "/fn", endpoint = "change_role")]
pub async fn change_role(
    team_id: String,
    user_id: String,
    role: String,
) -> Result<MemberView, UiError> {
    ssr::call([], async |s, p| {
        let (team, user) = (TeamId(id(&team_id)?), UserId(id(&user_id)?));
        s.tenancy.change_role(p, team, user, &role).await
    })
    .await
}

#[server(prefix = "/fn", endpoint = "remove_member")]
pub async fn remove_member(team_id: String, user_id: String) -> Result<(), UiError> {
    ssr::call([], async |s, p| {
        let (team, user) = (TeamId(id(&team_id)?), UserId(id(&user_id)?));
        s.tenancy.remove_member(p, team, user).await
    })
    .await
}

// ---- nodes ----

/// The server replicas and which one leads (platform admins).
#[server(prefix = "/fn", endpoint = "list_servers")]
pub async fn list_servers() -> Result<Vec<ServerReplicaView>, UiError> {
    ssr::call([], async |s, p| s.nodes.replicas(p).await).await
}

#[server(prefix = "/fn", endpoint = "cluster_summary")]
pub async fn get_cluster_summary() -> Result<ClusterSummary, UiError> {
    ssr::call([], async |s, p| s.nodes.summary(p).await).await
}

#[server(prefix = "/fn", endpoint = "list_nodes")]
pub async fn list_nodes(page: PageRequest) -> Result<Page<NodeView>, UiError> {
    ssr::call([], async |s, p| s.nodes.list(p, page).await).await
}

#[server(prefix = "/fn", endpoint = "revoke_node")]
pub async fn revoke_node(node_id: String) -> Result<NodeView, UiError> {
    ssr::call([], async |s, p| s.nodes.revoke(p, id(&node_id)?).await).await
}

/// Drains a node (or one GPU, `gpu` non-empty) within `minutes` (platform admins).
#[server(prefix = "/fn", endpoint = "drain_node")]
pub async fn drain_node(
    node_id: String,
    minutes: String,
    reason: String,
    #[server(default)] gpu: String,
) -> Result<NodeView, UiError> {
    let echo = [("minutes", minutes.clone()), ("reason", reason.clone())];
    ssr::call(echo, async |s, p| {
        let minutes = optional_number(Some(&minutes), "minutes")?.map(i64::from);
        let req = tessera_domain::drain::DrainRequest {
            gpu: (!gpu.is_empty()).then_some(gpu),
            deadline: None,
            minutes,
            reason,
        };
        s.nodes.drain(p, id(&node_id)?, &req).await
    })
    .await
}

/// Marks a repaired GPU healthy again (platform admins).
#[server(prefix = "/fn", endpoint = "clear_gpu_health")]
pub async fn clear_gpu_health(node_id: String, gpu_uuid: String) -> Result<NodeView, UiError> {
    ssr::call([], async |s, p| {
        s.nodes.clear_health(p, id(&node_id)?, &gpu_uuid).await
    })
    .await
}

/// Ends a node's drain (platform admins).
#[server(prefix = "/fn", endpoint = "undrain_node")]
pub async fn undrain_node(node_id: String) -> Result<NodeView, UiError> {
    ssr::call([], async |s, p| {
        s.nodes.undrain(p, id(&node_id)?, None).await
    })
    .await
}

/// Each GPU model's hot spares (anyone signed in).
#[server(prefix = "/fn", endpoint = "list_spares")]
pub async fn list_spares() -> Result<Vec<tessera_domain::spares::SpareView>, UiError> {
    ssr::call([], async |s, p| s.allocations.spares(p).await).await
}

/// Keeps `gpus` GPUs, or `percent` of them, of `model` as hot spares (platform admins);
/// one of the two filled in.
#[server(prefix = "/fn", endpoint = "set_spares")]
pub async fn set_spares(
    model: String,
    #[server(default)] gpus: String,
    #[server(default)] percent: String,
) -> Result<Vec<tessera_domain::spares::SpareView>, UiError> {
    let echo = [
        ("model", model.clone()),
        ("gpus", gpus.clone()),
        ("percent", percent.clone()),
    ];
    ssr::call(echo, async |s, p| {
        let req = tessera_domain::spares::SpareRequest {
            gpus: optional_number(Some(&gpus), "gpus")?.map(i64::from),
            percent: optional_number(Some(&percent), "percent")?.map(i64::from),
        };
        s.allocations.set_spares(p, &model, &req).await
    })
    .await
}

/// Keeps no spares of `model` any more (platform admins).
#[server(prefix = "/fn", endpoint = "clear_spares")]
pub async fn clear_spares(model: String) -> Result<(), UiError> {
    ssr::call([], async |s, p| s.allocations.clear_spares(p, &model).await).await
}

/// Recent telemetry of a node (newest `limit` samples, oldest first).
#[server(prefix = "/fn", endpoint = "node_telemetry")]
pub async fn get_node_telemetry(node_id: String, limit: u32) -> Result<NodeTelemetry, UiError> {
    ssr::call([], async |s, p| {
        s.nodes.telemetry(p, id(&node_id)?, limit).await
    })
    .await
}

/// `layout` is written like `3g.40gb@0, 2g.20gb@4, 1g.10gb@6` (profile@start); `mode` is
/// `enabled` or `disabled`.
#[server(prefix = "/fn", endpoint = "set_gpu_layout")]
pub async fn set_gpu_layout(
    node_id: String,
    gpu_uuid: String,
    mode: String,
    layout: String,
) -> Result<NodeView, UiError> {
    let echo = [("layout", layout.clone()), ("mode", mode.clone())];
    ssr::call(echo, async |s, p| {
        let node = id(&node_id)?;
        let mode = match mode.as_str() {
            "enabled" => MigMode::Enabled,
            "disabled" => MigMode::Disabled,
            _ => return Err(AppError::invalid("mode", "must be enabled or disabled")),
        };
        let instances = parse_layout(&layout)?;
        s.nodes
            .set_desired_layout(p, node, &gpu_uuid, mode, instances)
            .await
    })
    .await
}

/// Shares a GPU (`mps`, `time_slice`) or stops sharing it (`off`) (platform admin).
#[server(prefix = "/fn", endpoint = "set_gpu_sharing")]
pub async fn set_gpu_sharing(
    node_id: String,
    gpu_uuid: String,
    sharing: String,
) -> Result<NodeView, UiError> {
    let echo = [("sharing", sharing.clone())];
    ssr::call(echo, async |s, p| {
        let node = id(&node_id)?;
        let method = tessera_domain::cluster::parse_sharing(&sharing)?;
        s.nodes.set_gpu_sharing(p, node, &gpu_uuid, method).await
    })
    .await
}

/// Parses `3g.40gb@0, 1g.10gb@6` into instances.
pub fn parse_layout(text: &str) -> Result<Vec<DesiredInstance>, AppError> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|item| {
            let (profile, start) = item.split_once('@').ok_or_else(|| {
                AppError::invalid(
                    "layout",
                    format!("'{item}': write profile@start, e.g. 1g.10gb@0"),
                )
            })?;
            let start = start.trim().parse::<u8>().map_err(|_| {
                AppError::invalid("layout", format!("'{item}': start must be a slice number"))
            })?;
            Ok(DesiredInstance {
                profile: profile.trim().to_owned(),
                start,
            })
        })
        .collect()
}

#[server(prefix = "/fn", endpoint = "list_join_tokens")]
pub async fn list_join_tokens(page: PageRequest) -> Result<Page<JoinTokenView>, UiError> {
    ssr::call([], async |s, p| s.nodes.list_join_tokens(p, page).await).await
}

#[server(prefix = "/fn", endpoint = "create_join_token")]
pub async fn create_join_token(
    note: String,
    max_uses: String,
    expires_in_hours: String,
) -> Result<CreatedSecret<JoinTokenView>, UiError> {
    let echo = [
        ("note", note.clone()),
        ("max_uses", max_uses.clone()),
        ("expires_in_hours", expires_in_hours.clone()),
    ];
    ssr::call(echo, async |s, p| {
        let uses = number(&max_uses, "max_uses")?;
        let hours = number(&expires_in_hours, "expires_in_hours")?;
        s.nodes.create_join_token(p, &note, uses, hours).await
    })
    .await
}

#[server(prefix = "/fn", endpoint = "revoke_join_token")]
pub async fn revoke_join_token(id: String) -> Result<(), UiError> {
    ssr::call([], async |s, p| {
        s.nodes.revoke_join_token(p, ssr::id(&id)?).await
    })
    .await
}

// ---- allocations ----

/// Allocations the caller may see, newest first. `team`: a team id or empty for all;
/// `state`: a state, or `pending`, `current`, `ended`, empty for all; `mine`: only the
/// caller's own.
#[server(prefix = "/fn", endpoint = "list_allocations")]
pub async fn list_allocations(
    team: String,
    state: String,
    mine: bool,
    page: PageRequest,
) -> Result<Page<AllocationView>, UiError> {
    ssr::call([], async |s, p| {
        // Empty: every team the caller may read; not an id: no team of theirs.
        let team = match team.trim() {
            "" => None,
            t => Some(TeamId::parse(t).ok_or(AppError::NotFound)?),
        };
        let filter = tessera_core::services::allocations::ListFilter {
            team,
            state: Some(state),
            mine,
        };
        s.allocations.list(p, &filter, page).await
    })
    .await
}

/// Requests an allocation (the request form). `duration_hours` may be empty (default).
#[server(prefix = "/fn", endpoint = "request_allocation")]
pub async fn request_allocation(
    team_id: String,
    kind: String,
    count: String,
    duration_hours: String,
    starts_at: String,
    priority: String,
    purpose: String,
    idempotency_key: String,
) -> Result<AllocationView, UiError> {
    let echo = [
        ("team_id", team_id.clone()),
        ("kind", kind.clone()),
        ("count", count.clone()),
        ("duration_hours", duration_hours.clone()),
        ("starts_at", starts_at.clone()),
        ("priority", priority.clone()),
        ("purpose", purpose.clone()),
    ];
    ssr::call(echo, async |s, p| {
        let input = tessera_domain::alloc::NewAllocation::from_form(
            tessera_domain::alloc::AllocationForm {
                team_id,
                kind,
                count,
                duration_hours,
                starts_at,
                priority,
                purpose,
            },
        )?;
        let key = Some(idempotency_key.as_str()).filter(|k| !k.is_empty());
        let v = s.allocations.request(p, &input, key).await?;
        leptos_axum::redirect(&format!("/allocations/{}", v.id));
        Ok(v)
    })
    .await
}

#[server(prefix = "/fn", endpoint = "get_allocation")]
pub async fn get_allocation(id: String) -> Result<AllocationView, UiError> {
    ssr::call([], async |s, p| s.allocations.get(p, ssr::id(&id)?).await).await
}

/// Releases an active allocation or cancels a pending one.
#[server(prefix = "/fn", endpoint = "release_allocation")]
pub async fn release_allocation(id: String) -> Result<AllocationView, UiError> {
    ssr::call([], async |s, p| {
        s.allocations.release(p, ssr::id(&id)?).await
    })
    .await
}

/// Devices free right now per kind string, without re-partitioning.
#[server(prefix = "/fn", endpoint = "free_now")]
pub async fn free_now() -> Result<std::collections::BTreeMap<String, u32>, UiError> {
    ssr::call([], async |s, p| Ok(s.allocations.free_now(p))).await
}

/// Extends an active allocation by `hours`.
#[server(prefix = "/fn", endpoint = "extend_allocation")]
pub async fn extend_allocation(id: String, hours: String) -> Result<AllocationView, UiError> {
    ssr::call([("hours", hours.clone())], async |s, p| {
        let minutes = number(&hours, "hours")
            .map_err(|_| AppError::invalid("minutes", "hours must be a whole number"))?
            .saturating_mul(60);
        s.allocations.extend(p, ssr::id(&id)?, minutes).await
    })
    .await
}

/// Approves (`approve` = true) or denies a request waiting for approval.
#[server(prefix = "/fn", endpoint = "decide_allocation")]
pub async fn decide_allocation(
    id: String,
    approve: bool,
    reason: String,
    #[server(default)] overrides: bool,
) -> Result<AllocationView, UiError> {
    ssr::call([("reason", reason.clone())], async |s, p| {
        let decision = tessera_core::services::allocations::Decision {
            approve,
            reason: &reason,
            overrides,
        };
        s.allocations.decide(p, ssr::id(&id)?, decision).await
    })
    .await
}

#[server(prefix = "/fn", endpoint = "list_quotas")]
pub async fn list_quotas(team_id: String) -> Result<Vec<QuotaView>, UiError> {
    ssr::call([], async |s, p| {
        s.allocations.quotas(p, TeamId(id(&team_id)?)).await
    })
    .await
}

/// Sets a team's quota on a model, in units (compute slices; a whole H100 is 7).
#[server(prefix = "/fn", endpoint = "set_quota")]
pub async fn set_quota(
    team_id: String,
    model: String,
    guaranteed: String,
    limit: String,
    per_user: String,
) -> Result<Vec<QuotaView>, UiError> {
    let echo = [
        ("model", model.clone()),
        ("guaranteed", guaranteed.clone()),
        ("limit", limit.clone()),
        ("per_user", per_user.clone()),
    ];
    ssr::call(echo, async |s, p| {
        let team = TeamId(id(&team_id)?);
        let g = number(&guaranteed, "guaranteed")?;
        let l = number(&limit, "limit")?;
        let u = number(&per_user, "per_user")?;
        s.allocations.set_quota(p, team, &model, g, l, u).await
    })
    .await
}

/// Grants a team `high` priority (`high` = "true", with an optional `cap` in units; empty
/// for none) or withdraws it (platform admin).
#[server(prefix = "/fn", endpoint = "set_team_priority")]
pub async fn set_team_priority(
    team_id: String,
    #[server(default)] high: bool,
    #[server(default)] cap: String,
) -> Result<TeamView, UiError> {
    ssr::call([("cap", cap.clone())], async |s, p| {
        let team = TeamId(id(&team_id)?);
        let cap = match cap.trim() {
            "" => None,
            c => Some(number(c, "cap")?),
        };
        let grant = high.then_some(tessera_domain::alloc::HighGrant { cap });
        s.allocations.set_high_priority(p, team, grant).await?;
        s.tenancy.team(p, team).await
    })
    .await
}

/// The audit trail (platform admin); `action` empty for all.
#[server(prefix = "/fn", endpoint = "audit_log")]
pub async fn audit_log(
    action: String,
    page: PageRequest,
) -> Result<Page<tessera_domain::audit::AuditEntryView>, UiError> {
    ssr::call([], async |s, p| {
        s.allocations.audit_log(p, Some(&action), page).await
    })
    .await
}

// ---- billing ----

/// Every price: current, past and scheduled (any signed-in user).
#[server(prefix = "/fn", endpoint = "list_rates")]
pub async fn list_rates() -> Result<Vec<RateView>, UiError> {
    ssr::call([], async |s, p| s.billing.rates(p).await).await
}

/// Sets a price (platform admin). `price` is a decimal amount per hour (`2.50`);
/// `effective_from` is `YYYY-MM-DDTHH:MM` in UTC (a full hour), empty for the next hour.
#[server(prefix = "/fn", endpoint = "set_rate")]
pub async fn set_rate(
    kind: String,
    price: String,
    preemptible_discount_pct: String,
    #[server(default)] high_premium_pct: String,
    effective_from: String,
) -> Result<RateView, UiError> {
    let echo = [
        ("kind", kind.clone()),
        ("price", price.clone()),
        ("preemptible_discount_pct", preemptible_discount_pct.clone()),
        ("high_premium_pct", high_premium_pct.clone()),
        ("effective_from", effective_from.clone()),
    ];
    ssr::call(echo, async |s, p| {
        let input = NewRate::from_form(
            kind,
            &price,
            &preemptible_discount_pct,
            &high_premium_pct,
            &effective_from,
            s.billing.currency(),
        )?;
        s.billing.set_rate(p, &input).await
    })
    .await
}

/// A team's monthly budget and this month's spend.
#[server(prefix = "/fn", endpoint = "team_budget")]
pub async fn team_budget(team_id: String) -> Result<BudgetView, UiError> {
    ssr::call([], async |s, p| {
        s.billing.budget(p, TeamId(id(&team_id)?)).await
    })
    .await
}

/// A team's grace before an early stop of its work (the deadline channel), with the
/// platform maximum (any member).
#[server(prefix = "/fn", endpoint = "team_grace")]
pub async fn team_grace(team_id: String) -> Result<tessera_domain::drain::TeamGrace, UiError> {
    ssr::call([], async |s, p| {
        s.allocations.team_grace(p, TeamId(id(&team_id)?)).await
    })
    .await
}

/// Sets a team's grace in seconds (team admin or platform admin); empty goes back to the
/// platform maximum.
#[server(prefix = "/fn", endpoint = "set_team_grace")]
pub async fn set_team_grace(
    team_id: String,
    #[server(default)] secs: String,
) -> Result<tessera_domain::drain::TeamGrace, UiError> {
    ssr::call([("secs", secs.clone())], async |s, p| {
        let team = TeamId(id(&team_id)?);
        let secs = match secs.trim() {
            "" => None,
            v => Some(v.parse::<i64>().map_err(|_| {
                AppError::invalid("preemption_grace_secs", "must be a whole number of seconds")
            })?),
        };
        let req = tessera_domain::drain::GraceRequest {
            preemption_grace_secs: secs,
        };
        s.allocations.set_team_grace(p, team, &req).await
    })
    .await
}

/// Every team's budget and spend this month (platform admin).
#[server(prefix = "/fn", endpoint = "list_budgets")]
pub async fn list_budgets() -> Result<Vec<BudgetView>, UiError> {
    ssr::call([], async |s, p| s.billing.budgets(p).await).await
}

/// Sets a team's monthly budget (platform admin): `amount` decimal, empty removes it;
/// `hard` = "on" makes requests beyond it wait for approval.
#[server(prefix = "/fn", endpoint = "save_budget")]
pub async fn save_budget(
    team_id: String,
    amount: String,
    #[server(default)] hard: Option<String>,
) -> Result<BudgetView, UiError> {
    let echo = [("amount", amount.clone())];
    ssr::call(echo, async |s, p| {
        let monthly = match amount.trim() {
            "" => None,
            a => Some(tessera_domain::billing::parse_money(
                a,
                s.billing.currency(),
                "amount",
            )?),
        };
        let input = SetBudget {
            monthly_minor: monthly,
            hard: hard.is_some_and(|h| h != "false" && h != "off"),
        };
        s.billing.set_budget(p, TeamId(id(&team_id)?), &input).await
    })
    .await
}

/// Usage and cost per day, kind, user and team over `[from, to]` (`YYYY-MM-DD`; empty:
/// this month so far). `team_id` empty: every team (platform admin).
#[server(prefix = "/fn", endpoint = "usage")]
pub async fn usage(team_id: String, from: String, to: String) -> Result<UsageReport, UiError> {
    let echo = [("from", from.clone()), ("to", to.clone())];
    ssr::call(echo, async |s, p| {
        let q = tessera_core::services::billing::UsageQuery::parse(
            Some(&team_id),
            Some(&from),
            Some(&to),
        )?;
        s.billing.usage(p, &q).await
    })
    .await
}

/// The caller's own usage and cost this month so far, across their teams.
#[server(prefix = "/fn", endpoint = "own_usage")]
pub async fn own_usage() -> Result<UsageReport, UiError> {
    ssr::call([], async |s, p| s.billing.own_usage(p, s.clock.now()).await).await
}

/// A team's statement for a month (`YYYY-MM`).
#[server(prefix = "/fn", endpoint = "team_statement")]
pub async fn team_statement(team_id: String, month: String) -> Result<Statement, UiError> {
    ssr::call([("month", month.clone())], async |s, p| {
        s.billing.statement(p, TeamId(id(&team_id)?), &month).await
    })
    .await
}

/// Ledger entries for hours in `[from, to]`; `team_id` empty: every team (platform admin).
#[server(prefix = "/fn", endpoint = "ledger_entries")]
pub async fn ledger_entries(
    team_id: String,
    from: String,
    to: String,
    page: PageRequest,
) -> Result<Page<LedgerEntryView>, UiError> {
    ssr::call([], async |s, p| {
        let q = tessera_core::services::billing::UsageQuery::parse(
            Some(&team_id),
            Some(&from),
            Some(&to),
        )?;
        s.billing.ledger(p, &q, page).await
    })
    .await
}

/// Reverses one charge with a reason (platform admin).
#[server(prefix = "/fn", endpoint = "reverse_charge")]
pub async fn reverse_charge(
    txn_id: String,
    reason: String,
) -> Result<Vec<LedgerEntryView>, UiError> {
    ssr::call([("reason", reason.clone())], async |s, p| {
        s.billing.reverse(p, id(&txn_id)?, &reason).await
    })
    .await
}

/// What a request would cost at today's prices, e.g. `12.00 USD` (empty when unpriced).
#[server(prefix = "/fn", endpoint = "estimate_cost")]
pub async fn estimate_cost(
    kind: String,
    count: String,
    duration_hours: String,
    priority: String,
) -> Result<String, UiError> {
    ssr::call([], async |s, p| {
        // A kind still being typed has no estimate yet rather than an error.
        let Ok(kind) = kind.parse() else {
            return Ok(String::new());
        };
        let query = tessera_domain::billing::EstimateQuery {
            kind,
            count: number(&count, "count").unwrap_or(1).max(1),
            duration_hours: number(&duration_hours, "duration_hours").unwrap_or(0),
            priority: priority.parse().unwrap_or_default(),
        };
        match s.billing.quote(p, &query, s.clock.now()).await {
            Ok(e) => Ok(e.text),
            Err(AppError::Invalid { .. }) => Ok(String::new()),
            Err(e) => Err(e),
        }
    })
    .await
}

// ---- workloads: notebooks and jobs ----

/// Notebooks and jobs the caller may see, newest first. `kind`: `notebook`, `job` or
/// empty for both; `team`, `allocation`: ids or empty for all; `mine`: only the caller's
/// own; `live`: only those not ended.
#[server(prefix = "/fn", endpoint = "list_workloads")]
pub async fn list_workloads(
    #[server(default)] kind: Option<String>,
    #[server(default)] team: Option<String>,
    #[server(default)] allocation: Option<String>,
    mine: bool,
    live: bool,
    page: PageRequest,
) -> Result<Page<WorkloadView>, UiError> {
    ssr::call([], async |s, p| {
        let given = |v: Option<String>| v.filter(|v| !v.trim().is_empty());
        let filter = tessera_core::services::workloads::WorkloadFilter {
            kind: given(kind).map(|k| k.parse()).transpose()?,
            team: given(team).map(|t| id(&t).map(TeamId)).transpose()?,
            allocation: given(allocation).map(|a| id(&a)).transpose()?,
            mine,
            live,
        };
        s.workloads.list(p, &filter, page).await
    })
    .await
}

#[server(prefix = "/fn", endpoint = "get_workload")]
pub async fn get_workload(id: String) -> Result<WorkloadView, UiError> {
    ssr::call([], async |s, p| s.workloads.get(p, ssr::id(&id)?).await).await
}

/// The allocation as the form sends it: a missing choice is the field's error, not a 404.
#[cfg(feature = "ssr")]
fn allocation_field(raw: &str) -> Result<AllocationId, AppError> {
    if raw.trim().is_empty() {
        return Err(AppError::invalid(
            "allocation_id",
            "choose one of your active allocations",
        ));
    }
    id(raw).map_err(|_| AppError::invalid("allocation_id", "no such allocation"))
}

/// The form's "Run on" choice: one of the caller's active allocations, or
/// [`NEW_GPU`] with a GPU kind, hours and priority for a request of the workload's own
/// (jobs: on `nodes` nodes at once, `count` each; empty or 1 is one node).
#[cfg(feature = "ssr")]
fn run_on(
    allocation_id: &str,
    gpu: Option<String>,
    count: Option<String>,
    hours: Option<String>,
    priority: Option<String>,
    team_id: Option<String>,
    nodes: Option<String>,
) -> Result<
    (
        Option<AllocationId>,
        Option<tessera_domain::alloc::NewAllocation>,
    ),
    AppError,
> {
    if allocation_id.trim() != NEW_GPU {
        return Ok((Some(allocation_field(allocation_id)?), None));
    }
    let kind = gpu.unwrap_or_default();
    if kind.trim().is_empty() {
        return Err(AppError::invalid("gpu", "choose a GPU"));
    }
    let count = match count.as_deref().map(str::trim).filter(|c| !c.is_empty()) {
        None => 1,
        Some(c) => c
            .parse::<u32>()
            .ok()
            .filter(|c| *c >= 1)
            .ok_or_else(|| AppError::invalid("count", "a whole number, 1 or more"))?,
    };
    let duration_minutes = match hours.as_deref().map(str::trim).filter(|h| !h.is_empty()) {
        None => None,
        Some(h) => Some(
            h.parse::<u32>()
                .ok()
                .filter(|h| (1..=24 * 30).contains(h))
                .ok_or_else(|| AppError::invalid("hours", "a whole number of hours, 1 or more"))?
                * 60,
        ),
    };
    let nodes = gang_nodes(nodes.as_deref())?;
    Ok((
        None,
        Some(tessera_domain::alloc::NewAllocation {
            team_id: team_id.unwrap_or_default(),
            kind,
            count,
            duration_minutes,
            starts_at: None,
            priority,
            purpose: String::new(),
            needs_cuda: None,
            nodes,
        }),
    ))
}

/// The form's "Nodes": empty or 1 is a single-node request (`None`); more, a gang. 0 and
/// too many are the request's own 422 on `nodes`.
#[cfg(feature = "ssr")]
fn gang_nodes(raw: Option<&str>) -> Result<Option<u32>, AppError> {
    Ok(ssr::optional_number(raw, "nodes")?.filter(|n| *n != 1))
}

/// The "Run on" value that asks for a GPU of the workload's own.
pub const NEW_GPU: &str = "new";
/// A "Run on" value `profile:<id>`: a team's notebook profile.
pub const PROFILE_PREFIX: &str = "profile:";

/// Notebook profiles: of one team, or (`team` empty) of all the caller's teams.
#[server(prefix = "/fn", endpoint = "notebook_profiles")]
pub async fn notebook_profiles(
    #[server(default)] team: String,
) -> Result<Vec<NotebookProfile>, UiError> {
    ssr::call([], async |s, p| {
        let team = Some(team)
            .filter(|t| !t.trim().is_empty())
            .map(|t| ssr::id(&t).map(TeamId))
            .transpose()?;
        s.workloads.profiles(p, team).await
    })
    .await
}

/// Adds (or replaces by name) a team's notebook profile.
#[server(prefix = "/fn", endpoint = "save_notebook_profile")]
pub async fn save_notebook_profile(
    team_id: String,
    name: String,
    kind: String,
    hours: String,
    #[server(default)] image: Option<String>,
) -> Result<NotebookProfile, UiError> {
    let echo = [
        ("name", name.clone()),
        ("kind", kind.clone()),
        ("hours", hours.clone()),
        ("image", image.clone().unwrap_or_default()),
    ];
    ssr::call(echo, async |s, p| {
        let hours = hours
            .trim()
            .parse::<u32>()
            .map_err(|_| AppError::invalid("hours", "a whole number of hours, 1 or more"))?;
        s.workloads
            .save_profile(
                p,
                TeamId(ssr::id(&team_id)?),
                &name,
                &kind,
                hours,
                image.as_deref(),
            )
            .await
    })
    .await
}

/// Removes a team's notebook profile.
#[server(prefix = "/fn", endpoint = "delete_notebook_profile")]
pub async fn delete_notebook_profile(team_id: String, id: String) -> Result<(), UiError> {
    ssr::call([], async |s, p| {
        s.workloads
            .delete_profile(p, TeamId(ssr::id(&team_id)?), ssr::id(&id)?)
            .await
    })
    .await
}

/// Launches a JupyterLab on one of the caller's active allocations; goes to its page.
#[server(prefix = "/fn", endpoint = "launch_notebook")]
pub async fn launch_notebook(
    allocation_id: String,
    name: String,
    env: String,
    #[server(default)] gpu: Option<String>,
    #[server(default)] count: Option<String>,
    #[server(default)] hours: Option<String>,
    #[server(default)] team_id: Option<String>,
    #[server(default)] image: Option<String>,
    #[server(default)] idempotency_key: Option<String>,
) -> Result<WorkloadView, UiError> {
    // `env` is not echoed: values may be secrets, and a plain form post carries the echo
    // in the address it returns to.
    let echo = [
        ("allocation_id", allocation_id.clone()),
        ("name", name.clone()),
        ("image", image.clone().unwrap_or_default()),
    ];
    ssr::call(echo, async |s, p| {
        let profile_id = match allocation_id.trim().strip_prefix(PROFILE_PREFIX) {
            Some(p) => {
                Some(id(p).map_err(|_| AppError::invalid("allocation_id", "no such profile"))?)
            }
            None => None,
        };
        let (allocation_id, gpu) = if profile_id.is_some() {
            (None, None)
        } else {
            run_on(&allocation_id, gpu, count, hours, None, team_id, None)?
        };
        let req = tessera_core::services::workloads::NewNotebook {
            allocation_id,
            gpu,
            profile_id,
            name,
            env: tessera_domain::workload::parse_env(&env)?,
            image,
            idempotency_key,
        };
        let v = s.workloads.launch_notebook(p, &req).await?;
        leptos_axum::redirect(&format!("/workloads/{}", v.id));
        Ok(v)
    })
    .await
}

/// Submits a training job on one of the caller's active allocations; goes to its page.
/// (`env` is not echoed, as for notebooks.)
#[server(prefix = "/fn", endpoint = "submit_job")]
pub async fn submit_job(
    allocation_id: String,
    name: String,
    command: String,
    workdir: String,
    env: String,
    retries: String,
    #[server(default)] gpu: Option<String>,
    #[server(default)] count: Option<String>,
    #[server(default)] hours: Option<String>,
    #[server(default)] priority: Option<String>,
    #[server(default)] team_id: Option<String>,
    #[server(default)] image: Option<String>,
    #[server(default)] idempotency_key: Option<String>,
    #[server(default)] nodes: Option<String>,
    #[server(default)] launcher: Option<String>,
    #[server(default)] ranks: Option<String>,
) -> Result<WorkloadView, UiError> {
    let echo = [
        ("allocation_id", allocation_id.clone()),
        ("name", name.clone()),
        ("command", command.clone()),
        ("workdir", workdir.clone()),
        ("retries", retries.clone()),
        ("image", image.clone().unwrap_or_default()),
    ];
    ssr::call(echo, async |s, p| {
        let (allocation_id, gpu) =
            run_on(&allocation_id, gpu, count, hours, priority, team_id, nodes)?;
        // The form always sends its launcher and ranks; they mean something for a gang only.
        let given = |v: &Option<String>| {
            v.as_deref()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_owned)
        };
        let (launcher, ranks) = match gpu.as_ref().and_then(|g| g.nodes) {
            Some(_) => (
                given(&launcher)
                    .as_deref()
                    .map(tessera_domain::wire::GangLauncher::parse)
                    .transpose()?,
                given(&ranks)
                    .as_deref()
                    .map(tessera_domain::alloc::Ranks::parse)
                    .transpose()?,
            ),
            None => (None, None),
        };
        let req = tessera_core::services::workloads::NewJob {
            allocation_id,
            gpu,
            array_index: None,
            name,
            command,
            workdir,
            env: tessera_domain::workload::parse_env(&env)?,
            retries: tessera_domain::workload::parse_retries(&retries)?,
            image,
            launcher,
            ranks,
            idempotency_key,
        };
        let v = s.workloads.submit_job(p, &req).await?;
        leptos_axum::redirect(&format!("/workloads/{}", v.id));
        Ok(v)
    })
    .await
}

/// Stops a notebook or cancels a job.
#[server(prefix = "/fn", endpoint = "stop_workload")]
pub async fn stop_workload(id: String) -> Result<WorkloadView, UiError> {
    ssr::call([], async |s, p| s.workloads.stop(p, ssr::id(&id)?).await).await
}

/// Most log bytes one `workload_logs` call returns.
pub const LOG_SLICE_MAX: u64 = 64 * 1024;

/// A workload's log from byte `from` (`None`: its last [`LOG_SLICE_MAX`] bytes); of a
/// multi-node job's member `rank` (`None` or 0: the job itself).
#[server(prefix = "/fn", endpoint = "workload_logs")]
pub async fn workload_logs(
    id: String,
    #[server(default)] from: Option<u64>,
    #[server(default)] rank: Option<u32>,
) -> Result<LogSlice, UiError> {
    ssr::call([], async |s, p| {
        let id = match rank {
            None | Some(0) => ssr::id(&id)?,
            Some(r) => s.workloads.rank_id(p, ssr::id(&id)?, r).await?,
        };
        s.workloads.logs(p, id, from, LOG_SLICE_MAX).await
    })
    .await
}

// ---- bookings (docs/operations.md) ----

/// The booking calendar from `from` to `to` (RFC 3339; at most 62 days), every team's;
/// `model` empty for every model. Another team's booking shows only that it is taken.
#[server(prefix = "/fn", endpoint = "list_bookings")]
pub async fn list_bookings(
    from: String,
    to: String,
    #[server(default)] model: String,
) -> Result<Vec<tessera_domain::booking::BookingView>, UiError> {
    ssr::call([], async |s, p| {
        let time = |field: &str, raw: &str| {
            chrono::DateTime::parse_from_rfc3339(raw.trim())
                .map(|t| t.with_timezone(&chrono::Utc))
                .map_err(|_| AppError::invalid(field, "must be an RFC 3339 time"))
        };
        let (from, to) = (time("from", &from)?, time("to", &to)?);
        let model = Some(model.trim()).filter(|m| !m.is_empty());
        s.allocations.bookings(p, from, to, model).await
    })
    .await
}

/// Books capacity for a team (the booking form; team admins and platform admins).
/// `count` empty: 1. Times are UTC (`YYYY-MM-DDTHH:MM`, as a datetime-local input sends).
#[server(prefix = "/fn", endpoint = "book_capacity")]
pub async fn book_capacity(
    team_id: String,
    kind: String,
    #[server(default)] count: String,
    starts_at: String,
    ends_at: String,
    #[server(default)] purpose: String,
) -> Result<tessera_domain::booking::BookingView, UiError> {
    let echo = [
        ("team_id", team_id.clone()),
        ("kind", kind.clone()),
        ("count", count.clone()),
        ("starts_at", starts_at.clone()),
        ("ends_at", ends_at.clone()),
        ("purpose", purpose.clone()),
    ];
    ssr::call(echo, async |s, p| {
        let input = tessera_domain::booking::NewBooking {
            team_id,
            kind,
            count: optional_number(Some(&count), "count")?.unwrap_or(1),
            starts_at,
            ends_at,
            purpose,
        };
        s.allocations.book(p, &input).await
    })
    .await
}

/// Cancels a booking (team admins of its team, platform admins): the capacity is free again.
#[server(prefix = "/fn", endpoint = "cancel_booking")]
pub async fn cancel_booking(id: String) -> Result<tessera_domain::booking::BookingView, UiError> {
    ssr::call([], async |s, p| {
        s.allocations.cancel_booking(p, ssr::id(&id)?).await
    })
    .await
}

// ---- notifications (docs/notifications.md) ----

/// The caller's notification address and preferences.
#[server(prefix = "/fn", endpoint = "my_notifications")]
pub async fn my_notifications() -> Result<tessera_domain::notify::NotificationSettings, UiError> {
    ssr::call([], async |s, p| s.notifications.settings(p).await).await
}

/// Sets (or, empty, removes) the caller's notification address.
#[server(prefix = "/fn", endpoint = "set_notification_email")]
pub async fn set_notification_email(
    email: String,
) -> Result<tessera_domain::notify::NotificationSettings, UiError> {
    let echo = [("email", email.clone())];
    ssr::call(echo, async |s, p| {
        let input = tessera_domain::notify::NotificationSettingsInput {
            email: Some(email),
            preferences: Vec::new(),
        };
        s.notifications.update_settings(p, &input).await
    })
    .await
}

/// Sets how the caller gets one kind of event.
#[server(prefix = "/fn", endpoint = "set_notification_preference")]
pub async fn set_notification_preference(
    kind: String,
    mode: String,
) -> Result<tessera_domain::notify::NotificationSettings, UiError> {
    ssr::call([], async |s, p| {
        use tessera_domain::notify::{EventKind, NotifyMode, PreferenceInput};
        let input = tessera_domain::notify::NotificationSettingsInput {
            email: None,
            preferences: vec![PreferenceInput {
                kind: EventKind::parse(&kind)?,
                mode: NotifyMode::parse(&mode)?,
            }],
        };
        s.notifications.update_settings(p, &input).await
    })
    .await
}

/// A team's webhooks (team admins).
#[server(prefix = "/fn", endpoint = "team_webhooks")]
pub async fn team_webhooks(
    team_id: String,
) -> Result<Vec<tessera_domain::notify::WebhookView>, UiError> {
    ssr::call([], async |s, p| {
        s.notifications
            .webhooks(p, ssr::id::<TeamId>(&team_id)?)
            .await
    })
    .await
}

/// Adds a team webhook for every event of the team; answers its secret once.
#[server(prefix = "/fn", endpoint = "add_team_webhook")]
pub async fn add_team_webhook(
    team_id: String,
    url: String,
) -> Result<tessera_domain::notify::WebhookCreated, UiError> {
    let echo = [("url", url.clone())];
    ssr::call(echo, async |s, p| {
        let input = tessera_domain::notify::WebhookInput {
            url,
            events: Vec::new(),
            enabled: true,
        };
        s.notifications
            .create_webhook(p, ssr::id::<TeamId>(&team_id)?, &input)
            .await
    })
    .await
}

/// Removes a team webhook.
#[server(prefix = "/fn", endpoint = "delete_team_webhook")]
pub async fn delete_team_webhook(team_id: String, id: String) -> Result<(), UiError> {
    ssr::call([], async |s, p| {
        s.notifications
            .delete_webhook(p, ssr::id::<TeamId>(&team_id)?, ssr::id::<uuid::Uuid>(&id)?)
            .await
    })
    .await
}

/// A team webhook's latest deliveries, newest first (team admins).
#[server(prefix = "/fn", endpoint = "team_webhook_deliveries")]
pub async fn team_webhook_deliveries(
    team_id: String,
    id: String,
) -> Result<Vec<tessera_domain::notify::DeliveryView>, UiError> {
    ssr::call([], async |s, p| {
        s.notifications
            .webhook_deliveries(p, ssr::id::<TeamId>(&team_id)?, ssr::id::<uuid::Uuid>(&id)?)
            .await
    })
    .await
}

/// Turns a team webhook off or on again (on again clears its failures); its URL and
/// events stay.
#[server(prefix = "/fn", endpoint = "set_team_webhook_enabled")]
pub async fn set_team_webhook_enabled(
    team_id: String,
    id: String,
    enabled: bool,
) -> Result<tessera_domain::notify::WebhookView, UiError> {
    ssr::call([], async |s, p| {
        let (team, id) = (ssr::id::<TeamId>(&team_id)?, ssr::id::<uuid::Uuid>(&id)?);
        let hook = s.notifications.webhook(p, team, id).await?;
        let input = tessera_domain::notify::WebhookInput {
            url: hook.url,
            events: hook.events,
            enabled,
        };
        s.notifications.update_webhook(p, team, id, &input).await
    })
    .await
}

/// Posts a test event to a team webhook now and answers what its receiver said, as
/// `POST /api/v1/teams/{id}/webhooks/{hook}/test` does (the server's sender, from
/// context).
#[server(prefix = "/fn", endpoint = "test_team_webhook")]
pub async fn test_team_webhook(
    team_id: String,
    id: String,
) -> Result<tessera_domain::notify::WebhookTestResult, UiError> {
    use tessera_core::services::notifications::WebhookTestSender;
    ssr::call([], async |s, p| {
        let sender = use_context::<std::sync::Arc<dyn WebhookTestSender>>().ok_or_else(|| {
            leptos::logging::error!("no webhook test sender in context");
            AppError::Internal
        })?;
        s.notifications
            .test_webhook(
                p,
                ssr::id::<TeamId>(&team_id)?,
                ssr::id::<uuid::Uuid>(&id)?,
                sender.as_ref(),
            )
            .await
    })
    .await
}

// ---- images (issue 36) ----

/// The image catalog: what team `team` sees (platform entries and its own), or with `team`
/// empty everything the caller sees. Platform entries first, then teams' (each by name).
#[server(prefix = "/fn", endpoint = "list_images")]
pub async fn list_images(
    #[server(default)] team: String,
) -> Result<Vec<tessera_domain::image::CatalogImage>, UiError> {
    ssr::call([], async |s, p| {
        let team = Some(team)
            .filter(|t| !t.trim().is_empty())
            .map(|t| ssr::id(&t).map(TeamId))
            .transpose()?;
        let mut list = s.images.catalog(p, team).await?;
        list.sort_by(|a, b| {
            (a.team_id.is_some(), &a.team_name, &a.name).cmp(&(
                b.team_id.is_some(),
                &b.team_name,
                &b.name,
            ))
        });
        Ok(list)
    })
    .await
}

/// Adds an image to a catalog, pinned to its digest now: team `team_id`'s (its admins) or,
/// with `team_id` empty, the platform's (platform admins).
#[server(prefix = "/fn", endpoint = "add_image")]
pub async fn add_image(
    #[server(default)] team_id: String,
    name: String,
    reference: String,
) -> Result<tessera_domain::image::CatalogImage, UiError> {
    let echo = [("name", name.clone()), ("reference", reference.clone())];
    ssr::call(echo, async |s, p| {
        let team_id = Some(team_id)
            .filter(|t| !t.trim().is_empty())
            .map(|t| ssr::id(&t))
            .transpose()?;
        let req = tessera_core::services::images::NewCatalogImage {
            team_id,
            name: name.trim().to_owned(),
            reference: reference.trim().to_owned(),
        };
        s.images.add(p, &req).await
    })
    .await
}

/// Removes a catalog entry (its team's admins; a platform entry: platform admins).
#[server(prefix = "/fn", endpoint = "remove_image")]
pub async fn remove_image(id: String) -> Result<(), UiError> {
    ssr::call([], async |s, p| s.images.remove(p, ssr::id(&id)?).await).await
}

/// Where images may come from: registry hosts or `registry/repository` prefixes.
#[server(prefix = "/fn", endpoint = "registry_allowlist")]
pub async fn registry_allowlist() -> Result<Vec<String>, UiError> {
    ssr::call([], async |s, p| s.images.allowlist(p).await).await
}

/// Allows images from a registry or repository prefix (platform admins).
#[server(prefix = "/fn", endpoint = "allow_registry")]
pub async fn allow_registry(entry: String) -> Result<Vec<String>, UiError> {
    ssr::call([("entry", entry.clone())], async |s, p| {
        s.images.allow(p, entry.trim()).await
    })
    .await
}

/// Stops allowing an entry (platform admins).
#[server(prefix = "/fn", endpoint = "disallow_registry")]
pub async fn disallow_registry(entry: String) -> Result<Vec<String>, UiError> {
    ssr::call([], async |s, p| s.images.disallow(p, &entry).await).await
}

/// A team's registry logins, never with the password (its admins).
#[server(prefix = "/fn", endpoint = "registry_logins")]
pub async fn registry_logins(
    team_id: String,
) -> Result<Vec<tessera_domain::image::RegistryLoginView>, UiError> {
    ssr::call([], async |s, p| {
        s.images.logins(p, TeamId(ssr::id(&team_id)?)).await
    })
    .await
}

/// Sets (or replaces) a team's login to a registry (its admins). The password is not
/// echoed back to the form.
#[server(prefix = "/fn", endpoint = "set_registry_login")]
pub async fn set_registry_login(
    team_id: String,
    registry: String,
    username: String,
    password: String,
) -> Result<tessera_domain::image::RegistryLoginView, UiError> {
    let echo = [
        ("registry", registry.clone()),
        ("username", username.clone()),
    ];
    ssr::call(echo, async |s, p| {
        s.images
            .set_login(
                p,
                TeamId(ssr::id(&team_id)?),
                &registry,
                &username,
                &password,
            )
            .await
    })
    .await
}

/// Removes a team's login to a registry (its admins).
#[server(prefix = "/fn", endpoint = "remove_registry_login")]
pub async fn remove_registry_login(team_id: String, registry: String) -> Result<(), UiError> {
    ssr::call([], async |s, p| {
        s.images
            .remove_login(p, TeamId(ssr::id(&team_id)?), &registry)
            .await
    })
    .await
}

#[cfg(feature = "ssr")]
mod ssr {
    use super::UiError;
    use http::request::Parts;
    use leptos::prelude::*;
    use leptos_axum::ResponseOptions;
    use std::sync::Arc;
    use tessera_core::Services;
    use tessera_core::auth::Principal;
    use tessera_domain::error::AppError;

    /// Ids that do not parse name nothing that exists.
    /// An id from a page's route or form, as the type the service wants (an unknown
    /// id is a 404, whatever it names).
    pub fn id<T: From<uuid::Uuid>>(raw: &str) -> Result<T, AppError> {
        uuid::Uuid::parse_str(raw.trim())
            .map(T::from)
            .map_err(|_| AppError::NotFound)
    }

    pub fn number(raw: &str, field: &str) -> Result<u32, AppError> {
        raw.trim()
            .parse()
            .map_err(|_| AppError::invalid(field, "must be a whole number"))
    }

    pub fn optional_number(raw: Option<&str>, field: &str) -> Result<Option<u32>, AppError> {
        match raw.map(str::trim) {
            None | Some("") => Ok(None),
            Some(v) => number(v, field).map(Some),
        }
    }

    /// Runs a use case for the signed-in caller (401 without a valid session), with the
    /// services and principal the server put in context, and maps its result.
    pub async fn call<T, const N: usize>(
        echo: [(&str, String); N],
        use_case: impl AsyncFnOnce(&Services, &Principal) -> Result<T, AppError>,
    ) -> Result<T, UiError> {
        with_request(echo, async |s, req| {
            let p = tessera_core::request::principal(s, req)
                .await?
                .ok_or(AppError::Unauthorized)?;
            use_case(s, &p).await
        })
        .await
    }

    /// Runs a use case that reads the request itself (the session: sign-in, sign-out).
    pub async fn with_request<T, const N: usize>(
        echo: [(&str, String); N],
        use_case: impl AsyncFnOnce(&Services, &Parts) -> Result<T, AppError>,
    ) -> Result<T, UiError> {
        let result = match (use_context::<Arc<Services>>(), use_context::<Parts>()) {
            (Some(services), Some(req)) => use_case(&services, &req).await,
            _ => {
                leptos::logging::error!("server function called without the services in context");
                Err(AppError::Internal)
            }
        };
        finish(result, echo)
    }

    /// Maps a use case's result to the server function's: sets the HTTP status for
    /// programmatic callers (a plain form post keeps the redirect leptos sets up, which
    /// carries the error in the URL) and attaches the echoed form values.
    fn finish<T, const N: usize>(
        result: Result<T, AppError>,
        echo: [(&str, String); N],
    ) -> Result<T, UiError> {
        let error = match result {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if let Some(res) = use_context::<ResponseOptions>() {
            if let AppError::RateLimited { retry_after_secs } = &error
                && let Ok(v) = http::HeaderValue::from_str(&retry_after_secs.to_string())
            {
                res.insert_header(http::header::RETRY_AFTER, v);
            }
            let plain_form = use_context::<Parts>()
                .and_then(|p| p.headers.get(http::header::ACCEPT).cloned())
                .and_then(|v| v.to_str().ok().map(|s| s.contains("text/html")))
                .unwrap_or(false);
            if !plain_form && let Ok(code) = http::StatusCode::from_u16(error.status()) {
                res.set_status(code);
            }
        }
        Err(UiError {
            error,
            echo: echo.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        })
    }
}
