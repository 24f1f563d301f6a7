//! Metering and money: the metering job, rate cards, the ledger, budgets, usage reports,
//! statements and the chargeback export.
//!
//! The arithmetic (hours, GPU fractions, prices, rounding, postings, alerts) is pure and
//! lives in `tessera_domain::billing`; this service authorizes, reads allocation histories
//! and telemetry, and writes each metered (allocation, hour) with its ledger entries in one
//! idempotent transaction ([`Billing::meter`]), which the server runs every minute.

use super::authz::{self, Need};
use super::internal;
use super::tenancy::paged;
use crate::auth::{Principal, SystemActor};
use crate::clock::Clock;
use crate::services::audit::Entry;
use crate::store::{
    AllocationRow, BudgetRow, ChargeRow, LedgerRow, MeterRow, OpenAllocation, RateRow, Standing,
    Store, UsageGroupRow,
};
use chrono::{DateTime, Duration, NaiveDate, Utc};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use tessera_domain::alloc::{AllocState, AllocatedDevice, Committed, GpuKind, PriorityClass};
use tessera_domain::audit::AuditAction;
use tessera_domain::billing::{
    self as b, BudgetView, CostEstimate, EstimateQuery, LedgerEntryView, NewRate, Rate, RateCard,
    RateView, SetBudget, Statement, StatementLine, UsageReport, UsageRow, UsageTotals,
};
use tessera_domain::error::AppError;
use tessera_domain::ids::{AllocationId, NodeId, TeamId, UserId};
use tessera_domain::mig::Catalog;
use tessera_domain::tenancy::{Page, PageRequest, TeamRole};
use tessera_domain::wire::TelemetrySample;
use uuid::Uuid;

/// Utilisation (percent) at or above which a telemetry sample counts as busy.
pub const DEFAULT_BUSY_PCT: u32 = 5;
/// Allocations metered per batch (one query each for histories and metered hours).
const BATCH: u32 = 200;
/// Rows per page the chargeback export reads from the ledger.
const EXPORT_PAGE: u32 = 5_000;
/// The largest monthly budget accepted (minor units).
const BUDGET_MAX_MINOR: i64 = 10_000_000_000_000;

#[derive(Clone)]
pub struct Billing {
    store: Store,
    clock: Clock,
    catalog: Arc<Catalog>,
    currency: Arc<str>,
    busy_pct: u32,
}

/// The rate card as of one moment, pricing what the admission rule weighs against a hard
/// budget: at today's rates, whatever rate applies when the hours are metered.
#[derive(Debug, Clone)]
pub struct Pricer {
    card: RateCard,
    catalog: Arc<Catalog>,
    currency: Arc<str>,
    at: DateTime<Utc>,
}

impl Pricer {
    /// What `count` × `kind` for `ms` at `priority` costs at most (0 for a kind with no
    /// rate, which is metered at no cost).
    pub fn cost(&self, kind: &GpuKind, count: u32, ms: i64, priority: PriorityClass) -> i64 {
        self.card
            .price(kind, &self.catalog, self.at)
            .map_or(0, |p| b::cost(&p, count, ms.max(0), priority).1)
    }

    /// What an open allocation may still cost: its whole time (an active one's, extensions
    /// included, from activation to its end) less what the ledger holds for it already.
    pub fn remaining(&self, a: &OpenAllocation) -> i64 {
        let ms = match (a.state, a.active_at, a.ends_at) {
            (AllocState::Active, Some(from), Some(to)) => (to - from).num_milliseconds(),
            _ => a.duration_minutes.saturating_mul(60_000),
        };
        let count = u32::try_from(a.count).unwrap_or(u32::MAX);
        (self.cost(&a.kind, count, ms, a.priority) - a.posted).max(0)
    }

    /// The team's hard budget with its committed spend (this month's ledger plus what its
    /// open allocations may still cost), or `None` without a hard budget.
    pub fn committed(&self, s: &Standing) -> Option<Committed> {
        let budget = s.budget.as_ref().filter(|b| b.hard)?;
        let open: i64 = s.open.iter().map(|a| self.remaining(a)).sum();
        Some(Committed {
            budget: budget.monthly_minor,
            committed: s.month_spent.saturating_add(open),
            currency: self.currency.to_string(),
        })
    }

    /// The month whose spend counts against a budget at this moment.
    pub fn month(&self) -> (DateTime<Utc>, DateTime<Utc>) {
        b::month_bounds(b::month_of(self.at))
    }
}

/// What one metering pass wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MeterReport {
    /// Allocations looked at.
    pub allocations: u32,
    /// (allocation, hour) rows written, each with its two ledger entries.
    pub hours: u32,
    /// Allocations whose every hour is now metered.
    pub closed: u32,
}

/// Which usage to report.
#[derive(Debug, Clone, Default)]
pub struct UsageQuery {
    /// One team; `None`: every team (platform admins only).
    pub team: Option<TeamId>,
    /// The first day; default the first of this month.
    pub from: Option<NaiveDate>,
    /// The last day, inclusive; default today.
    pub to: Option<NaiveDate>,
}

impl UsageQuery {
    /// From the edge's text (empty or absent: none). A team id that does not parse is a
    /// 404, as an unknown team is; a day that does not parse is a 422 naming `from` or
    /// `to`.
    pub fn parse(
        team: Option<&str>,
        from: Option<&str>,
        to: Option<&str>,
    ) -> Result<Self, AppError> {
        let team = match team.map(str::trim).filter(|t| !t.is_empty()) {
            Some(t) => Some(TeamId::parse(t).ok_or(AppError::NotFound)?),
            None => None,
        };
        Ok(UsageQuery {
            team,
            from: b::parse_day(from, "from")?,
            to: b::parse_day(to, "to")?,
        })
    }
}

/// A chargeback export being read: [`ChargebackCsv::next_chunk`] yields the header, then
/// pages of rows, then `None`.
pub struct ChargebackCsv {
    store: Store,
    team: Option<TeamId>,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    cursor: Option<(DateTime<Utc>, Uuid)>,
    header_sent: bool,
    done: bool,
    cache: LineCache,
    /// The next page, already being read while this one is written out.
    next: Option<tokio::task::JoinHandle<Result<Vec<ChargeRow>, crate::store::StoreError>>>,
    /// The file name to offer.
    pub filename: String,
}

impl Billing {
    pub fn new(store: Store, catalog: Arc<Catalog>) -> Self {
        Self {
            store,
            clock: Clock::system(),
            catalog,
            currency: Arc::from("USD"),
            busy_pct: DEFAULT_BUSY_PCT,
        }
    }

    /// Reads the time from `clock` instead of the system's.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Sets the currency prices and charges are in (ISO 4217, e.g. `EUR`).
    pub fn with_currency(mut self, currency: &str) -> Self {
        self.currency = Arc::from(currency);
        self
    }

    pub fn currency(&self) -> &str {
        &self.currency
    }

    // ---- metering ----

    /// Meters every complete hour (and the last partial hour of an allocation that ended)
    /// not metered yet, up to `now`. Idempotent: running it again, concurrently, or after
    /// a crash at any point writes nothing twice. `max_allocations` stops after that many
    /// allocations (tests use it to stop part-way, like a crash). Only the platform runs it.
    pub async fn meter(
        &self,
        _: &SystemActor,
        now: DateTime<Utc>,
        max_allocations: Option<u32>,
    ) -> Result<MeterReport, AppError> {
        let card = self.rate_card().await?;
        let mut report = MeterReport::default();
        let mut after: Option<(DateTime<Utc>, AllocationId)> = None;
        loop {
            let batch = self
                .store
                .billing_candidates(after, BATCH)
                .await
                .map_err(internal("loading allocations to meter"))?;
            let Some(last) = batch.last() else { break };
            after = Some((last.active_at.unwrap_or(now), last.id));
            let ids: Vec<AllocationId> = batch.iter().map(|a| a.id).collect();
            let mut histories: HashMap<AllocationId, Vec<(DateTime<Utc>, AllocState)>> =
                HashMap::new();
            for (id, at, to) in self
                .store
                .histories(&ids)
                .await
                .map_err(internal("loading histories"))?
            {
                histories.entry(id).or_default().push((at, to));
            }
            let metered: HashSet<(AllocationId, DateTime<Utc>)> = self
                .store
                .metered_hours(&ids)
                .await
                .map_err(internal("loading metered hours"))?
                .into_iter()
                .collect();
            for a in &batch {
                if max_allocations.is_some_and(|m| report.allocations >= m) {
                    return Ok(report);
                }
                report.allocations += 1;
                let history = histories.remove(&a.id).unwrap_or_default();
                let (rows, close) = self.meter_one(a, &history, &metered, &card, now).await?;
                if rows.is_empty() && !close {
                    continue;
                }
                report.hours += self
                    .store
                    .write_meter(a.id, &rows, close, self.clock.now())
                    .await
                    .map_err(internal("writing metered hours"))?;
                report.closed += u32::from(close);
            }
            if batch.len() < BATCH as usize {
                break;
            }
        }
        Ok(report)
    }

    /// The hours of one allocation that are due and not metered, and whether it is done
    /// (no longer active, so nothing more will ever be metered).
    async fn meter_one(
        &self,
        a: &AllocationRow,
        history: &[(DateTime<Utc>, AllocState)],
        metered: &HashSet<(AllocationId, DateTime<Utc>)>,
        card: &RateCard,
        now: DateTime<Utc>,
    ) -> Result<(Vec<MeterRow>, bool), AppError> {
        // Left `active` for good (it never returns) by `now`: every hour may be billed.
        let done = history.last().is_some_and(|(at, s)| {
            *at <= now && *s != AllocState::Active && *s != AllocState::Placing
        });
        let intervals = b::active_intervals(history, now);
        let hours: Vec<(DateTime<Utc>, i64)> = b::wall_ms_per_hour(&intervals)
            .into_iter()
            .filter(|(h, _)| done || *h + Duration::hours(1) <= now)
            .filter(|(h, _)| !metered.contains(&(a.id, *h)))
            .collect();
        if hours.is_empty() {
            return Ok((Vec::new(), done));
        }
        let kind = &a.kind;
        let slices = kind.units_per_gpu(&self.catalog);
        let units = u32::try_from(a.units).unwrap_or(0);
        let count = u32::try_from(a.count).unwrap_or(0);
        let devices = &a.devices;
        let resource_id = devices
            .iter()
            .map(|d| d.mig_uuid.clone().unwrap_or_else(|| d.gpu_uuid.clone()))
            .collect::<Vec<_>>()
            .join(";");
        let resource_name = devices
            .iter()
            .map(|d| match &d.profile {
                Some(p) => format!("{}/{} {p}", d.hostname, short(&d.gpu_uuid)),
                None => format!("{}/{}", d.hostname, short(&d.gpu_uuid)),
            })
            .collect::<Vec<_>>()
            .join(";");
        let busy = self.busy_samples(devices, &intervals, &hours).await?;
        let rows = hours
            .iter()
            .map(|&(hour, wall_ms)| {
                let priced = card.price(kind, &self.catalog, hour);
                let (list, billed) = priced
                    .as_ref()
                    .map_or((0, 0), |p| b::cost(p, count, wall_ms, a.priority));
                let gpu_ms = b::gpu_ms(units, wall_ms, slices);
                let (busy_n, valued) = busy.get(&hour).copied().unwrap_or((0, 0));
                let active_gpu_ms = if valued == 0 {
                    0
                } else {
                    gpu_ms * busy_n / valued
                };
                MeterRow {
                    allocation_id: a.id,
                    hour_start: hour,
                    day: hour.format("%Y-%m-%d").to_string(),
                    team_id: a.team_id,
                    user_id: a.user_id,
                    kind: a.kind.clone(),
                    model: a.model.clone(),
                    priority: a.priority,
                    count: a.count,
                    resource_id: resource_id.clone(),
                    resource_name: resource_name.clone(),
                    wall_ms,
                    gpu_ms,
                    active_gpu_ms,
                    samples: valued,
                    rate_id: priced.map(|p| p.rate.id),
                    list_minor: list,
                    billed_minor: billed,
                    currency: self.currency.to_string(),
                    txn_id: Uuid::now_v7(),
                    metered_at: now,
                }
            })
            .collect();
        Ok((rows, done))
    }

    /// Per hour: `(busy, valued)` device samples taken while the allocation was active,
    /// where the device's utilisation was known and at or above the threshold.
    async fn busy_samples(
        &self,
        devices: &[AllocatedDevice],
        intervals: &[b::Interval],
        hours: &[(DateTime<Utc>, i64)],
    ) -> Result<HashMap<DateTime<Utc>, (i64, i64)>, AppError> {
        let mut out: HashMap<DateTime<Utc>, (i64, i64)> = HashMap::new();
        let (Some(first), Some(last)) = (hours.first(), hours.last()) else {
            return Ok(out);
        };
        let (from, to) = (first.0, last.0 + Duration::hours(1));
        let due: HashSet<DateTime<Utc>> = hours.iter().map(|h| h.0).collect();
        for (at, util) in readings(&self.store, devices, from, to).await? {
            if !intervals.iter().any(|iv| iv.start <= at && at < iv.end) {
                continue;
            }
            let hour = b::hour_floor(at);
            if !due.contains(&hour) {
                continue;
            }
            let e = out.entry(hour).or_default();
            e.1 += 1;
            e.0 += i64::from(util >= self.busy_pct);
        }
        Ok(out)
    }

    // ---- rate cards ----

    async fn rate_card(&self) -> Result<RateCard, AppError> {
        let rows = self
            .store
            .rates()
            .await
            .map_err(internal("loading rates"))?;
        Ok(RateCard::new(rows.iter().map(rate_of)))
    }

    /// Every rate, current and past and scheduled: any signed-in user may see prices.
    pub async fn rates(&self, _p: &Principal) -> Result<Vec<RateView>, AppError> {
        let rows = self
            .store
            .rates()
            .await
            .map_err(internal("loading rates"))?;
        let now = self.clock.now();
        let card = RateCard::new(rows.iter().map(rate_of));
        let mut views: Vec<RateView> = rows
            .iter()
            .map(|r| {
                let current = card
                    .exact(&r.kind.to_string(), now)
                    .is_some_and(|c| c.id == r.id);
                self.rate_view(r, current)
            })
            .collect();
        views.sort_by(|a, b| {
            a.kind
                .cmp(&b.kind)
                .then(b.effective_from.cmp(&a.effective_from))
        });
        Ok(views)
    }

    /// Sets a price (platform admins) from a full hour on, not before the current one.
    /// Metered rows keep the price they were billed at, so nothing billed changes.
    pub async fn set_rate(&self, p: &Principal, input: &NewRate) -> Result<RateView, AppError> {
        let admin = authz::admin(p)?;
        let now = self.clock.now();
        let (kind, from) = b::validate_rate(input, &self.catalog, now)?;
        let kind_str = kind.to_string();
        let before = self.rate_card().await?.exact(&kind_str, from).cloned();
        let row = RateRow {
            id: Uuid::new_v4(),
            kind: kind.clone(),
            model: kind.model().to_owned(),
            price_minor_per_hour: input.price_minor_per_hour,
            preemptible_discount_pct: i64::from(input.preemptible_discount_pct),
            high_premium_pct: i64::from(input.high_premium_pct),
            effective_from: from,
            created_at: now,
            created_by: Some(admin.0.username().to_string()),
        };
        // A scheduled rate may be corrected until its hour begins; from then on it may have
        // priced something, so it stays as it is.
        let replace = from > b::hour_floor(now);
        let stored = self
            .store
            .set_rate(&row, admin.0.user_id(), replace)
            .await
            .map_err(internal("setting rate"))?;
        if !stored {
            return Err(AppError::invalid(
                "effective_from",
                format!(
                    "a price for {} already starts at {}; it may have been billed, so set the new price from a later hour",
                    kind.label(),
                    from.format("%Y-%m-%d %H:%M UTC")
                ),
            ));
        }
        let json = |r: &Rate| {
            serde_json::json!({"kind": r.kind, "price_minor_per_hour": r.price_minor_per_hour,
                "preemptible_discount_pct": r.preemptible_discount_pct,
                "high_premium_pct": r.high_premium_pct,
                "effective_from": r.effective_from, "currency": &*self.currency})
        };
        self.audit(
            p,
            AuditAction::RateSet,
            "rate_card",
            &kind_str,
            None,
            before.as_ref().map(json),
            Some(json(&rate_of(&row))),
        )
        .await;
        Ok(self.rate_view(&row, from <= now))
    }

    fn rate_view(&self, r: &RateRow, current: bool) -> RateView {
        RateView {
            id: r.id,
            kind: r.kind.to_string(),
            kind_label: r.kind.label(),
            price_minor_per_hour: r.price_minor_per_hour,
            price: b::format_minor(r.price_minor_per_hour, &self.currency),
            currency: self.currency.to_string(),
            preemptible_discount_pct: u8::try_from(r.preemptible_discount_pct).unwrap_or(0),
            high_premium_pct: u16::try_from(r.high_premium_pct).unwrap_or(0),
            effective_from: r.effective_from,
            current,
            created_by: r.created_by.clone(),
            created_at: r.created_at,
        }
    }

    /// What a request would cost at today's rates, for the request form and scripts. Any
    /// signed-in user may ask: the rate card is theirs to read too (`rates`).
    pub async fn quote(
        &self,
        _p: &Principal,
        q: &EstimateQuery,
        now: DateTime<Utc>,
    ) -> Result<CostEstimate, AppError> {
        if q.count == 0 {
            return Err(AppError::invalid("count", "must be at least 1"));
        }
        let kind = q.kind.canonical(&self.catalog)?;
        let minor = self
            .estimate(
                &kind,
                q.count,
                q.duration_hours.saturating_mul(60),
                q.priority,
                now,
            )
            .await?;
        let text = if minor == 0 {
            String::new()
        } else {
            format!(
                "{} {}",
                b::format_minor(minor, &self.currency),
                self.currency
            )
        };
        Ok(CostEstimate {
            minor,
            currency: self.currency.to_string(),
            text,
        })
    }

    /// The estimated cost of a request at today's rates (minor units; 0 when unpriced).
    pub async fn estimate(
        &self,
        kind: &GpuKind,
        count: u32,
        minutes: u32,
        priority: PriorityClass,
        at: DateTime<Utc>,
    ) -> Result<i64, AppError> {
        let card = self.rate_card().await?;
        Ok(card.price(kind, &self.catalog, at).map_or(0, |p| {
            b::cost(&p, count, i64::from(minutes) * 60_000, priority).1
        }))
    }

    /// Today's prices, for the admission rule's committed spend (`Pricer::committed`).
    pub async fn pricer(&self, now: DateTime<Utc>) -> Result<Pricer, AppError> {
        Ok(Pricer {
            card: self.rate_card().await?,
            catalog: self.catalog.clone(),
            currency: self.currency.clone(),
            at: now,
        })
    }

    async fn month_spend(&self, team: TeamId, now: DateTime<Utc>) -> Result<i64, AppError> {
        let (from, to) = b::month_bounds(b::month_of(now));
        Ok(self
            .store
            .team_charges(Some(team), from, to)
            .await
            .map_err(internal("loading spend"))?
            .first()
            .map_or(0, |r| r.1))
    }

    // ---- budgets ----

    /// A team's budget and this month's spend: anyone who can see the team.
    pub async fn budget(&self, p: &Principal, team: TeamId) -> Result<BudgetView, AppError> {
        let access = authz::team(&self.store, p, team, Need::Read).await?;
        let row = self
            .store
            .budget(team)
            .await
            .map_err(internal("loading budget"))?;
        let spent = self.month_spend(team, self.clock.now()).await?;
        Ok(self.budget_view(team, access.team.name, row.as_ref(), spent))
    }

    /// Sets or removes (`monthly_minor: null`) a team's monthly budget: platform admins.
    pub async fn set_budget(
        &self,
        p: &Principal,
        team: TeamId,
        input: &SetBudget,
    ) -> Result<BudgetView, AppError> {
        let admin = authz::admin(p)?;
        let access = authz::team(&self.store, p, team, Need::Read).await?;
        if let Some(m) = input.monthly_minor
            && !(0..=BUDGET_MAX_MINOR).contains(&m)
        {
            return Err(AppError::invalid(
                "monthly_minor",
                "must be between 0 and 10^13 minor units",
            ));
        }
        let before = self
            .store
            .budget(team)
            .await
            .map_err(internal("loading budget"))?;
        self.store
            .set_budget(
                team,
                input.monthly_minor.map(|m| (m, input.hard)),
                admin.0.user_id(),
                self.clock.now(),
            )
            .await
            .map_err(internal("setting budget"))?;
        let json =
            |r: &BudgetRow| serde_json::json!({"monthly_minor": r.monthly_minor, "hard": r.hard});
        let after = input.monthly_minor.map(|m| BudgetRow {
            team_id: team,
            monthly_minor: m,
            hard: input.hard,
        });
        self.audit(
            p,
            AuditAction::BudgetSet,
            "team",
            &team.to_string(),
            Some(team),
            before.as_ref().map(json),
            after.as_ref().map(json),
        )
        .await;
        let spent = self.month_spend(team, self.clock.now()).await?;
        Ok(self.budget_view(team, access.team.name, after.as_ref(), spent))
    }

    /// Every team's budget and spend this month (teams without a budget included when
    /// they spent something): platform admins.
    pub async fn budgets(&self, p: &Principal) -> Result<Vec<BudgetView>, AppError> {
        authz::admin(p)?;
        self.all_budgets(self.clock.now()).await
    }

    /// [`Billing::budgets`] without a caller, for metrics.
    pub async fn all_budgets(&self, now: DateTime<Utc>) -> Result<Vec<BudgetView>, AppError> {
        let (from, to) = b::month_bounds(b::month_of(now));
        let budgets: HashMap<TeamId, BudgetRow> = self
            .store
            .budgets()
            .await
            .map_err(internal("loading budgets"))?
            .into_iter()
            .map(|r| (r.team_id, r))
            .collect();
        let spend: HashMap<TeamId, i64> = self
            .store
            .team_charges(None, from, to)
            .await
            .map_err(internal("loading spend"))?
            .into_iter()
            .collect();
        let teams = self
            .store
            .team_names()
            .await
            .map_err(internal("loading teams"))?;
        let mut out: Vec<BudgetView> = teams
            .into_iter()
            .filter(|(id, _)| budgets.contains_key(id) || spend.contains_key(id))
            .map(|(id, name)| {
                let spent = spend.get(&id).copied().unwrap_or(0);
                self.budget_view(id, name, budgets.get(&id), spent)
            })
            .collect();
        out.sort_by(|a, b| {
            b.used_pct
                .cmp(&a.used_pct)
                .then(a.team_name.cmp(&b.team_name))
        });
        Ok(out)
    }

    fn budget_view(
        &self,
        team: TeamId,
        name: String,
        row: Option<&BudgetRow>,
        spent: i64,
    ) -> BudgetView {
        let monthly = row.map(|r| r.monthly_minor);
        BudgetView {
            team_id: team,
            team_name: name,
            monthly_minor: monthly,
            hard: row.is_some_and(|r| r.hard),
            spent_minor: spent,
            currency: self.currency.to_string(),
            used_pct: monthly.map_or(0, |m| b::used_pct(spent, m)),
            alert: monthly.and_then(|m| b::alert_level(spent, m)),
        }
    }

    // ---- ledger ----

    /// Ledger entries for hours in the period: platform admins see all, team admins their
    /// team's (a team must be given).
    pub async fn ledger(
        &self,
        p: &Principal,
        query: &UsageQuery,
        page: PageRequest,
    ) -> Result<Page<LedgerEntryView>, AppError> {
        let team = self.finance_scope(p, query.team).await?;
        let (from, to) = b::parse_period(query.from, query.to, self.clock.now())?;
        let page = page.clamped();
        let (rows, total) = self
            .store
            .ledger_page(team, from, to, page.offset, page.limit)
            .await
            .map_err(internal("loading ledger"))?;
        Ok(paged(rows.iter().map(entry_view).collect(), total, page))
    }

    /// Reverses one charge (a credit to the team, with a reason): platform admins. A charge
    /// is reversed at most once.
    pub async fn reverse(
        &self,
        p: &Principal,
        txn: Uuid,
        reason: &str,
    ) -> Result<Vec<LedgerEntryView>, AppError> {
        authz::admin(p)?;
        let reason = reason.trim();
        if reason.is_empty() || reason.chars().count() > 500 {
            return Err(AppError::invalid(
                "reason",
                "give a reason (at most 500 characters)",
            ));
        }
        let memo = format!("{reason} (by {})", p.username());
        match self
            .store
            .reverse_charge(txn, self.clock.now(), &memo)
            .await
            .map_err(internal("reversing charge"))?
        {
            None => Err(AppError::NotFound),
            Some((false, _)) => Err(AppError::conflict("this charge was reversed already")),
            Some((true, rows)) => {
                let team = rows.first().map(|r| r.team_id);
                let amount = rows
                    .iter()
                    .find(|r| r.account != "platform")
                    .map_or(0, |r| r.amount_minor);
                self.audit(
                    p,
                    AuditAction::LedgerReverse,
                    "ledger_txn",
                    &txn.to_string(),
                    team,
                    None,
                    Some(serde_json::json!({"amount_minor": amount, "reason": reason})),
                )
                .await;
                Ok(rows.iter().map(entry_view).collect())
            }
        }
    }

    // ---- usage, statements, exports ----

    /// Usage and cost over a period, per day, kind, user and team. Platform admins see
    /// every team (or one); team admins their team; members their own usage in a team.
    pub async fn usage(&self, p: &Principal, query: &UsageQuery) -> Result<UsageReport, AppError> {
        let (from, to) = b::parse_period(query.from, query.to, self.clock.now())?;
        let (team, own_only) = self.usage_scope(p, query.team).await?;
        let user = own_only.then_some(p.user_id());
        let groups = self
            .store
            .usage_groups(team, user, from, to, true)
            .await
            .map_err(internal("loading usage"))?;
        Ok(self.report(groups, from, to, team, own_only))
    }

    /// The caller's own usage this month so far, in every team they used GPUs for (the
    /// dashboard's "my GPU-hours and spend"): anyone signed in, only their own rows,
    /// whatever their roles.
    /// `now`: the clock (the month of `now`, up to the end of its day).
    pub async fn own_usage(
        &self,
        p: &Principal,
        now: DateTime<Utc>,
    ) -> Result<UsageReport, AppError> {
        let (from, to) = b::parse_period(None, None, now)?;
        let groups = self
            .store
            .usage_groups(None, Some(p.user_id()), from, to, true)
            .await
            .map_err(internal("loading usage"))?;
        Ok(self.report(groups, from, to, None, true))
    }

    fn report(
        &self,
        groups: Vec<UsageGroupRow>,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        team: Option<TeamId>,
        own_only: bool,
    ) -> UsageReport {
        let mut days: BTreeMap<String, UsageTotals> = BTreeMap::new();
        let mut d = from;
        while d < to {
            days.insert(d.format("%Y-%m-%d").to_string(), UsageTotals::default());
            d += Duration::days(1);
        }
        // A kind's text, with its label.
        let mut kinds: BTreeMap<String, (String, UsageTotals)> = BTreeMap::new();
        let mut users: BTreeMap<(String, String), UsageTotals> = BTreeMap::new();
        let mut teams: BTreeMap<(String, String), UsageTotals> = BTreeMap::new();
        let mut total = UsageTotals::default();
        for g in &groups {
            let t = totals_of(g);
            days.entry(g.day.clone()).or_default().add(&t);
            kinds
                .entry(g.kind.to_string())
                .or_insert_with(|| (g.kind.label(), UsageTotals::default()))
                .1
                .add(&t);
            users
                .entry((g.user_id.to_string(), g.username.clone()))
                .or_default()
                .add(&t);
            teams
                .entry((g.team_id.to_string(), g.team_name.clone()))
                .or_default()
                .add(&t);
            total.add(&t);
        }
        let by_cost = |mut v: Vec<UsageRow>| {
            v.sort_by(|a, b| {
                b.totals
                    .cost_minor
                    .cmp(&a.totals.cost_minor)
                    .then(b.totals.gpu_ms.cmp(&a.totals.gpu_ms))
                    .then(a.label.cmp(&b.label))
            });
            v
        };
        UsageReport {
            from,
            to,
            currency: self.currency.to_string(),
            team_id: team,
            own_only,
            days: days
                .into_iter()
                .map(|(k, totals)| UsageRow {
                    label: k.clone(),
                    key: k,
                    totals,
                })
                .collect(),
            kinds: by_cost(
                kinds
                    .into_iter()
                    .map(|(k, (label, totals))| UsageRow {
                        label,
                        key: k,
                        totals,
                    })
                    .collect(),
            ),
            users: by_cost(
                users
                    .into_iter()
                    .map(|((key, label), totals)| UsageRow { key, label, totals })
                    .collect(),
            ),
            teams: by_cost(
                teams
                    .into_iter()
                    .map(|((key, label), totals)| UsageRow { key, label, totals })
                    .collect(),
            ),
            total,
        }
    }

    /// Usage per day as CSV (the chart's data).
    pub async fn usage_csv(&self, p: &Principal, query: &UsageQuery) -> Result<String, AppError> {
        let r = self.usage(p, query).await?;
        let c = &r.currency;
        let mut out = String::from("day,gpu_hours,active_gpu_hours,efficiency_pct,cost,currency\n");
        for d in &r.days {
            out.push_str(&format!(
                "{},{},{},{},{},{c}\n",
                d.key,
                b::gpu_hours(d.totals.gpu_ms),
                b::gpu_hours(d.totals.active_gpu_ms),
                d.totals.efficiency_pct(),
                b::format_minor(d.totals.cost_minor, c)
            ));
        }
        Ok(out)
    }

    /// What a team owes for a month (`YYYY-MM`): team admins of the team, platform admins.
    pub async fn statement(
        &self,
        p: &Principal,
        team: TeamId,
        month: &str,
    ) -> Result<Statement, AppError> {
        let access = authz::team(&self.store, p, team, Need::ManageMembers).await?;
        let first = b::parse_month(month)?;
        let (from, to) = b::month_bounds(first);
        let groups = self
            .store
            .usage_groups(Some(team), None, from, to, false)
            .await
            .map_err(internal("loading usage"))?;
        let mut lines: Vec<StatementLine> = groups
            .iter()
            .map(|g| StatementLine {
                kind: g.kind.to_string(),
                kind_label: g.kind.label(),
                username: g.username.clone(),
                allocations: u32::try_from(g.allocations).unwrap_or(0),
                wall_ms: g.wall_ms,
                totals: totals_of(g),
                list_minor: g.list_minor,
            })
            .collect();
        lines.sort_by(|a, b| a.kind.cmp(&b.kind).then(a.username.cmp(&b.username)));
        let adjustments = self
            .store
            .team_adjustments(team, from, to)
            .await
            .map_err(internal("loading adjustments"))?;
        let total = self
            .store
            .team_charges(Some(team), from, to)
            .await
            .map_err(internal("loading charges"))?
            .first()
            .map_or(0, |r| r.1);
        let budget_row = self
            .store
            .budget(team)
            .await
            .map_err(internal("loading budget"))?;
        let budget = budget_row
            .as_ref()
            .map(|r| self.budget_view(team, access.team.name.clone(), Some(r), total));
        Ok(Statement {
            team_id: team,
            team_name: access.team.name,
            month: first.format("%Y-%m").to_string(),
            from,
            to,
            currency: self.currency.to_string(),
            lines,
            adjustments_minor: adjustments,
            total_minor: total,
            budget,
        })
    }

    /// The FOCUS-aligned chargeback CSV for hours in the period, read from the ledger in
    /// pages: platform admins (every team or one), team admins (their team only).
    pub async fn chargeback(
        &self,
        p: &Principal,
        query: &UsageQuery,
    ) -> Result<ChargebackCsv, AppError> {
        let team = self.finance_scope(p, query.team).await?;
        let (from, to) = b::parse_period(query.from, query.to, self.clock.now())?;
        let filename = format!(
            "tessera-chargeback-{}-{}.csv",
            from.format("%Y%m%d"),
            (to - Duration::days(1)).format("%Y%m%d")
        );
        // Names once, not joined into every row of a long export.
        let teams = self
            .store
            .team_names()
            .await
            .map_err(internal("loading teams"))?
            .into_iter()
            .collect();
        let users = self
            .store
            .user_names()
            .await
            .map_err(internal("loading users"))?
            .into_iter()
            .collect();
        Ok(ChargebackCsv {
            store: self.store.clone(),
            team,
            from,
            to,
            cursor: None,
            header_sent: false,
            done: false,
            next: None,
            cache: LineCache {
                kinds: HashMap::new(),
                teams,
                users,
                hour: None,
            },
            filename,
        })
    }

    /// Which team a finance query covers: `None` (all) for a platform admin who names
    /// none; a named team for its team admins; otherwise `Forbidden` (or `NotFound` for a
    /// team the caller can't see).
    async fn finance_scope(
        &self,
        p: &Principal,
        team: Option<TeamId>,
    ) -> Result<Option<TeamId>, AppError> {
        match team {
            Some(id) => {
                authz::team(&self.store, p, id, Need::ManageMembers).await?;
                Ok(Some(id))
            }
            None if p.is_admin() => Ok(None),
            None => Err(AppError::invalid("team", "choose a team")),
        }
    }

    /// Which usage a caller sees: `(team, own_only)`.
    async fn usage_scope(
        &self,
        p: &Principal,
        team: Option<TeamId>,
    ) -> Result<(Option<TeamId>, bool), AppError> {
        match team {
            Some(id) => {
                let access = authz::team(&self.store, p, id, Need::Read).await?;
                let sees_team = p.is_admin() || access.role.is_some_and(TeamRole::manages_members);
                Ok((Some(id), !sees_team))
            }
            None if p.is_admin() => Ok((None, false)),
            None => Err(AppError::invalid("team", "choose a team")),
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn audit(
        &self,
        p: &Principal,
        action: AuditAction,
        object_type: &str,
        object_id: &str,
        team: Option<TeamId>,
        before: Option<serde_json::Value>,
        after: Option<serde_json::Value>,
    ) {
        Entry::new(Some(p.username().as_str()), action, object_type, object_id)
            .team(team)
            .before(before.map(|v| v.to_string()))
            .after(after.map(|v| v.to_string()))
            .record(&self.store, self.clock.now())
            .await;
    }
}

/// The chargeback CSV's columns, FinOps FOCUS names first, Tessera's own as `x-…`.
pub const CHARGEBACK_COLUMNS: [&str; 27] = [
    "BillingPeriodStart",
    "BillingPeriodEnd",
    "ChargePeriodStart",
    "ChargePeriodEnd",
    "ChargeCategory",
    "ChargeDescription",
    "BilledCost",
    "EffectiveCost",
    "ListCost",
    "BillingCurrency",
    "ConsumedQuantity",
    "ConsumedUnit",
    "PricingQuantity",
    "PricingUnit",
    "ResourceId",
    "ResourceName",
    "ResourceType",
    "ServiceName",
    "SubAccountId",
    "SubAccountName",
    "Tags",
    "x-user",
    "x-allocation",
    "x-gpu-profile",
    "x-gpu-model",
    "x-priority",
    "x-ledger-entry",
];

impl ChargebackCsv {
    /// The next piece of the file: the header, then up to 5,000 rows at a time; `None` at
    /// the end.
    pub async fn next_chunk(&mut self) -> Result<Option<String>, AppError> {
        if !self.header_sent {
            self.header_sent = true;
            return Ok(Some(format!("{}\n", CHARGEBACK_COLUMNS.join(","))));
        }
        if self.done {
            return Ok(None);
        }
        let rows = match self.next.take() {
            Some(page) => page.await.map_err(|_| AppError::Internal)?,
            None => {
                self.store
                    .charges_after(self.team, self.from, self.to, self.cursor, EXPORT_PAGE)
                    .await
            }
        }
        .map_err(internal("reading the ledger for export"))?;
        if rows.len() < EXPORT_PAGE as usize {
            self.done = true;
        }
        let Some(last) = rows.last() else {
            return Ok(None);
        };
        self.cursor = Some((last.hour_start, last.id));
        // The database reads the next page while this one is formatted (a second core's
        // worth of the export's time). A reader that goes away leaves one page unread.
        if !self.done {
            let (store, team, from, to, cursor) = (
                self.store.clone(),
                self.team,
                self.from,
                self.to,
                self.cursor,
            );
            self.next = Some(tokio::spawn(async move {
                store
                    .charges_after(team, from, to, cursor, EXPORT_PAGE)
                    .await
            }));
        }
        let mut out = String::with_capacity(rows.len() * 480);
        for r in &rows {
            chargeback_line(&mut out, r, &mut self.cache);
        }
        Ok(Some(out))
    }
}

/// What the CSV says about a kind: (label, profile column, ResourceType).
type KindCols = (String, String, &'static str);

/// What many rows share: kinds' columns, team and user names, and the period columns of
/// the current hour (rows come in hour order).
struct LineCache {
    kinds: HashMap<GpuKind, KindCols>,
    teams: HashMap<TeamId, String>,
    users: HashMap<UserId, String>,
    hour: Option<(DateTime<Utc>, String)>,
}

fn kind_columns(k: &GpuKind) -> KindCols {
    let (profile, rtype) = match k {
        GpuKind::Mig { profile, .. } => (profile.clone(), "MIG instance"),
        GpuKind::Whole { .. } => ("whole".into(), "GPU"),
        GpuKind::Share { milli, .. } => (format!("share:{milli}"), "GPU share"),
    };
    (k.label(), profile, rtype)
}

fn chargeback_line(out: &mut String, r: &ChargeRow, cache: &mut LineCache) {
    use std::fmt::Write as _;
    let c = &r.currency;
    if cache.hour.as_ref().is_none_or(|(h, _)| *h != r.hour_start) {
        const RFC: &str = "%Y-%m-%dT%H:%M:%SZ";
        let (bp_start, bp_end) = b::month_bounds(b::month_of(r.hour_start));
        let text = format!(
            "{},{},{},{},",
            bp_start.format(RFC),
            bp_end.format(RFC),
            r.hour_start.format(RFC),
            (r.hour_start + Duration::hours(1)).format(RFC),
        );
        cache.hour = Some((r.hour_start, text));
    }
    if let Some((_, period)) = &cache.hour {
        out.push_str(period);
    }
    let reversal = r.entry_type == tessera_domain::billing::EntryType::Reversal;
    let (label, profile, rtype) = cache
        .kinds
        .entry(r.kind.clone())
        .or_insert_with(|| kind_columns(&r.kind));
    let (consumed, pricing, list) = if reversal {
        (0, 0, 0)
    } else {
        (r.gpu_ms, r.wall_ms * r.count, r.list_minor)
    };
    let amount = b::format_minor(r.amount_minor, c);
    let _ = write!(out, "{},", if reversal { "Adjustment" } else { "Usage" });
    let description = format!(
        "{} × {label}{}",
        r.count,
        if reversal { " (reversal)" } else { "" }
    );
    csv_field(out, &description);
    let _ = write!(
        out,
        ",{amount},{amount},{},{c},{},GPU-Hours,{},Hours,",
        b::format_minor(list, c),
        micro_hours(consumed),
        micro_hours(pricing),
    );
    csv_field(out, &r.resource_id);
    out.push(',');
    csv_field(out, &r.resource_name);
    let _ = write!(out, ",{rtype},Tessera GPU,{},", r.team_id);
    csv_field(out, cache.teams.get(&r.team_id).map_or("", String::as_str));
    out.push(',');
    let tags = format!(
        "{{\"tessera/priority\":\"{}\",\"tessera/model\":\"{}\"}}",
        r.priority, r.model
    );
    csv_field(out, &tags);
    out.push(',');
    csv_field(out, cache.users.get(&r.user_id).map_or("", String::as_str));
    let _ = write!(out, ",{},", r.allocation_id);
    csv_field(out, profile);
    out.push(',');
    csv_field(out, &r.model);
    out.push(',');
    csv_field(out, r.priority.as_str());
    let _ = writeln!(out, ",{}", r.id);
}

/// Milliseconds as hours with six decimals (`3_600_000` → `1.000000`), rounded half up.
fn micro_hours(ms: i64) -> String {
    let micro = (ms * 10 + 18) / 36; // ms / 3600 × 1000, rounded (ms ≥ 0)
    format!("{}.{:06}", micro / 1_000_000, micro % 1_000_000)
}

/// Appends `s` as one CSV field (RFC 4180), neutralising spreadsheet formulas.
fn csv_field(out: &mut String, s: &str) {
    let formula =
        s.starts_with(['=', '+', '@']) || (s.starts_with('-') && s.parse::<f64>().is_err());
    let needs_quotes = formula || s.contains([',', '"', '\n', '\r']);
    if !needs_quotes {
        out.push_str(s);
        return;
    }
    out.push('"');
    if formula {
        out.push('\'');
    }
    out.push_str(&s.replace('"', "\"\""));
    out.push('"');
}

fn totals_of(g: &UsageGroupRow) -> UsageTotals {
    UsageTotals {
        gpu_ms: g.gpu_ms,
        active_gpu_ms: g.active_gpu_ms,
        cost_minor: g.cost_minor,
    }
}

fn rate_of(r: &RateRow) -> Rate {
    Rate {
        id: r.id,
        kind: r.kind.to_string(),
        price_minor_per_hour: r.price_minor_per_hour,
        preemptible_discount_pct: u8::try_from(r.preemptible_discount_pct).unwrap_or(0),
        high_premium_pct: u16::try_from(r.high_premium_pct).unwrap_or(0),
        effective_from: r.effective_from,
    }
}

fn entry_view(r: &LedgerRow) -> LedgerEntryView {
    LedgerEntryView {
        id: r.id,
        txn_id: r.txn_id,
        account: r.account.clone(),
        team_id: r.team_id,
        team_name: r.team_name.clone(),
        amount_minor: r.amount_minor,
        currency: r.currency.clone(),
        entry_type: r.entry_type,
        allocation_id: r.allocation_id,
        hour_start: r.hour_start,
        posted_at: r.posted_at,
        memo: r.memo.clone(),
    }
}

/// A device's utilisation in a sample: the MIG instance's SM utilisation, or the whole
/// GPU's; `None` when the driver could not tell.
/// Every known utilisation reading (percent) of `devices` in the telemetry samples taken
/// from `from` to `to`, with the sample's time; node by node, each node's oldest first.
pub(crate) async fn readings(
    store: &Store,
    devices: &[AllocatedDevice],
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Vec<(DateTime<Utc>, u32)>, AppError> {
    let mut nodes: BTreeMap<NodeId, Vec<&AllocatedDevice>> = BTreeMap::new();
    for d in devices {
        nodes.entry(d.node_id).or_default().push(d);
    }
    let mut out = Vec::new();
    for (node, devs) in nodes {
        let samples = store
            .samples_between(node, from, to)
            .await
            .map_err(internal("loading telemetry"))?;
        for s in samples {
            let known = devs.iter().filter_map(|d| utilisation(&s.payload, d));
            out.extend(known.map(|u| (s.at, u)));
        }
    }
    Ok(out)
}

fn utilisation(s: &TelemetrySample, d: &AllocatedDevice) -> Option<u32> {
    let gpu = s.gpus.iter().find(|g| g.gpu_uuid == d.gpu_uuid)?;
    match &d.mig_uuid {
        Some(mig) => {
            gpu.mig_devices
                .iter()
                .find(|m| &m.mig_uuid == mig)?
                .sm_util_pct
        }
        None => gpu.utilization_pct,
    }
}

fn short(uuid: &str) -> &str {
    uuid.get(..12).unwrap_or(uuid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_fields_are_quoted_and_formulas_neutralised() {
        let mut s = String::new();
        csv_field(&mut s, "plain");
        s.push('|');
        csv_field(&mut s, "a,b \"c\"");
        s.push('|');
        csv_field(&mut s, "=cmd()");
        s.push('|');
        csv_field(&mut s, "-1.50");
        assert_eq!(s, "plain|\"a,b \"\"c\"\"\"|\"'=cmd()\"|-1.50");
    }

    #[test]
    fn quantities_in_hours() {
        assert_eq!(micro_hours(3_600_000), "1.000000");
        assert_eq!(micro_hours(514_286), "0.142857");
        assert_eq!(micro_hours(0), "0.000000");
    }
}
