//! Rates, estimates, budgets, the ledger, usage, statements and the CSV exports.

use super::*;

#[utoipa::path(get, path = "/api/v1/rates", tag = "billing",
    description = "Every price (per unit of a kind and hour, minor units): current, past and \
                   scheduled. A MIG profile without a price of its own costs its model's \
                   whole-GPU price pro rata by compute slices.",
    responses((status = 200, description = "OK", body = Vec<RateView>)))]
pub(super) async fn list_rates(Call(s, p): Call) -> ApiResult<Vec<RateView>> {
    ok(s.billing.rates(&p).await)
}

#[derive(Deserialize, utoipa::IntoParams)]
pub(super) struct EstimateParams {
    /// What would be requested, e.g. `H100-80GB:1g.10gb`, `H100-80GB:whole` or
    /// `T4-16GB:share:250`.
    kind: String,
    /// How many (default 1).
    count: Option<u32>,
    /// For how long; omitted or 0: open-ended, which has no estimate (0).
    duration_hours: Option<u32>,
    /// `high`, `normal` (default) or `preemptible` (discounted where the rate says so).
    priority: Option<String>,
}

#[utoipa::path(get, path = "/api/v1/estimate", tag = "billing", params(EstimateParams),
    description = "What a request would cost at today's rates, as the request form shows it.",
    responses((status = 200, description = "OK", body = CostEstimate), Invalid))]
pub(super) async fn estimate_cost(
    Call(s, p): Call,
    Query(q): Query<EstimateParams>,
) -> ApiResult<CostEstimate> {
    let query = EstimateQuery {
        kind: q.kind.parse()?,
        count: q.count.unwrap_or(1),
        duration_hours: q.duration_hours.unwrap_or(0),
        priority: q
            .priority
            .as_deref()
            .map_or(Ok(Default::default()), str::parse)?,
    };
    ok(s.billing.quote(&p, &query, s.clock.now()).await)
}

#[utoipa::path(post, path = "/api/v1/rates", tag = "billing", request_body = NewRate,
    description = "Sets a price from a full hour on (platform admin); hours already billed keep \
                   their price, so `effective_from` may not be in the past.",
    responses((status = 201, description = "Created", body = RateView), Forbidden, Invalid))]
pub(super) async fn set_rate(
    Call(s, p): Call,
    JsonBody(b): JsonBody<NewRate>,
) -> Created<RateView> {
    created(s.billing.set_rate(&p, &b).await)
}

#[utoipa::path(get, path = "/api/v1/budgets", tag = "billing",
    description = "Every team's monthly budget and spend this month (platform admin).",
    responses((status = 200, description = "OK", body = Vec<BudgetView>), Forbidden))]
pub(super) async fn list_budgets(Call(s, p): Call) -> ApiResult<Vec<BudgetView>> {
    ok(s.billing.budgets(&p).await)
}

#[utoipa::path(get, path = "/api/v1/teams/{id}/budget", tag = "billing",
    responses((status = 200, description = "OK", body = BudgetView), NotFound))]
pub(super) async fn get_budget(Call(s, p): Call, Path(team): Path<Uuid>) -> ApiResult<BudgetView> {
    ok(s.billing.budget(&p, TeamId(team)).await)
}

#[utoipa::path(put, path = "/api/v1/teams/{id}/budget", tag = "billing", request_body = SetBudget,
    description = "Sets (or with `monthly_minor: null` removes) the team's monthly budget \
                   (platform admin). A hard budget sends requests that would exceed it to a \
                   platform admin for approval.",
    responses((status = 200, description = "OK", body = BudgetView), Forbidden, NotFound, Invalid))]
pub(super) async fn set_budget(
    Call(s, p): Call,
    Path(team): Path<Uuid>,
    JsonBody(b): JsonBody<SetBudget>,
) -> ApiResult<BudgetView> {
    ok(s.billing.set_budget(&p, TeamId(team), &b).await)
}

#[derive(Deserialize, utoipa::IntoParams)]
pub(super) struct PeriodQuery {
    /// A team id; omitted: every team (platform admins only).
    team: Option<String>,
    /// First day, `YYYY-MM-DD` (UTC); default the first of this month.
    from: Option<String>,
    /// Last day, inclusive; default today.
    to: Option<String>,
}

impl PeriodQuery {
    fn usage(&self) -> Result<UsageQuery, AppError> {
        UsageQuery::parse(
            self.team.as_deref(),
            self.from.as_deref(),
            self.to.as_deref(),
        )
    }
}

#[derive(Deserialize, utoipa::IntoParams)]
pub(super) struct LedgerQuery {
    /// A team id; omitted: every team (platform admins only).
    team: Option<String>,
    from: Option<String>,
    to: Option<String>,
    #[serde(default)]
    offset: u32,
    #[serde(default = "default_limit")]
    limit: u32,
}

#[utoipa::path(get, path = "/api/v1/ledger", tag = "billing", params(LedgerQuery),
    description = "Ledger entries for hours in the period, newest first: platform admins (all \
                   teams or one), team admins (their team). Each charge is two entries (team \
                   debit, platform credit) sharing a `txn_id`; they sum to zero.",
    responses((status = 200, description = "OK", body = Page<LedgerEntryView>), Forbidden, NotFound, Invalid))]
pub(super) async fn ledger(
    Call(s, p): Call,
    Query(q): Query<LedgerQuery>,
) -> ApiResult<Page<LedgerEntryView>> {
    let page = PageRequest::new(q.offset, q.limit);
    let query = UsageQuery::parse(q.team.as_deref(), q.from.as_deref(), q.to.as_deref())?;
    ok(s.billing.ledger(&p, &query, page).await)
}

#[derive(Deserialize, utoipa::ToSchema)]
pub(super) struct Reversal {
    /// Why (kept in the ledger entry and the audit trail); at most 500 characters.
    reason: String,
}

#[utoipa::path(post, path = "/api/v1/ledger/{txn_id}/reverse", tag = "billing", request_body = Reversal,
    description = "Reverses one charge with a reversing pair of entries (platform admin). A charge \
                   is reversed at most once; entries are never edited.",
    responses((status = 200, description = "The reversing entries", body = Vec<LedgerEntryView>), Forbidden, NotFound, Conflict, Invalid))]
pub(super) async fn reverse_charge(
    Call(s, p): Call,
    Path(txn): Path<Uuid>,
    JsonBody(b): JsonBody<Reversal>,
) -> ApiResult<Vec<LedgerEntryView>> {
    ok(s.billing.reverse(&p, txn, &b.reason).await)
}

#[utoipa::path(get, path = "/api/v1/usage", tag = "billing", params(PeriodQuery),
    description = "GPU-time and cost per day, GPU kind, user and team. Platform admins see every \
                   team; team admins their team; members their own usage in a team.",
    responses((status = 200, description = "OK", body = UsageReport), NotFound, Invalid))]
pub(super) async fn usage(
    Call(s, p): Call,
    Query(q): Query<PeriodQuery>,
) -> ApiResult<UsageReport> {
    let query = q.usage()?;
    ok(s.billing.usage(&p, &query).await)
}

#[utoipa::path(get, path = "/api/v1/teams/{id}/statements/{month}", tag = "billing",
    params(("id" = Uuid, Path), ("month" = String, Path, description = "`YYYY-MM`")),
    description = "What the team owes for a calendar month (UTC): team admins, platform admins.",
    responses((status = 200, description = "OK", body = Statement), Forbidden, NotFound, Invalid))]
pub(super) async fn statement(
    Call(s, p): Call,
    Path((team, month)): Path<(Uuid, String)>,
) -> ApiResult<Statement> {
    ok(s.billing.statement(&p, TeamId(team), &month).await)
}

fn csv_response(filename: &str, body: axum::body::Body) -> axum::response::Response {
    let mut res = axum::response::Response::new(body);
    let h = res.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/csv; charset=utf-8"),
    );
    if let Ok(v) = http::HeaderValue::from_str(&format!("attachment; filename=\"{filename}\"")) {
        h.insert(http::header::CONTENT_DISPOSITION, v);
    }
    res
}

#[utoipa::path(get, path = "/api/v1/exports/chargeback.csv", tag = "billing", params(PeriodQuery),
    description = "The chargeback file for hours in the period, one row per ledger entry of a \
                   team (a metered allocation-hour, or its reversal), with FinOps FOCUS column \
                   names (BilledCost, ChargePeriodStart, ResourceId = MIG or GPU UUID, \
                   SubAccountName = team, …). Streamed; the BilledCost total equals the ledger's \
                   for the period. Platform admins: all teams or one; team admins: their team.",
    responses((status = 200, description = "CSV", content_type = "text/csv", body = String), Forbidden, NotFound, Invalid))]
pub(super) async fn chargeback_csv(
    Call(s, p): Call,
    Query(q): Query<PeriodQuery>,
) -> Result<axum::response::Response, ApiError> {
    let csv = s.billing.chargeback(&p, &q.usage()?).await?;
    let filename = csv.filename.clone();
    let stream = futures_util::stream::unfold(Some(csv), |state| async move {
        let mut csv = state?;
        match csv.next_chunk().await {
            Ok(Some(chunk)) => Some((Ok(bytes::Bytes::from(chunk)), Some(csv))),
            Ok(None) => None,
            // The status is sent already: end the body early so the client sees a
            // truncated (not a silently complete) download.
            Err(e) => Some((Err(std::io::Error::other(e.to_string())), None)),
        }
    });
    Ok(csv_response(
        &filename,
        axum::body::Body::from_stream(stream),
    ))
}

#[utoipa::path(get, path = "/api/v1/exports/usage.csv", tag = "billing", params(PeriodQuery),
    description = "Usage per day (GPU-hours, active GPU-hours, efficiency, cost): the usage \
                   chart's data, with the same visibility as `/api/v1/usage`.",
    responses((status = 200, description = "CSV", content_type = "text/csv", body = String), NotFound, Invalid))]
pub(super) async fn usage_csv(
    Call(s, p): Call,
    Query(q): Query<PeriodQuery>,
) -> Result<axum::response::Response, ApiError> {
    let body = s.billing.usage_csv(&p, &q.usage()?).await?;
    Ok(csv_response(
        "tessera-usage.csv",
        axum::body::Body::from(body),
    ))
}
