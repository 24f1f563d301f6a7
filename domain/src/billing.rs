//! Metering and money: how long an allocation held its GPUs, per hour; what that costs
//! under the rate card in force; the ledger postings that record it; budgets and alerts.
//!
//! # Units
//!
//! | quantity | unit | exact? |
//! |---|---|---|
//! | wall time an allocation was `active` in an hour | milliseconds (`wall_ms`) | yes |
//! | allocated GPU-time | **milli-GPU-seconds** (`gpu_ms`): one whole GPU for one millisecond | rounded once per (allocation, hour) |
//! | money | minor units of the configured currency (cents for USD) | rounded once per (allocation, hour) |
//!
//! The GPU fraction of a kind is its compute slices over the model's: `1g.10gb` on an
//! H100 is 1/7 of a GPU, a whole H100 is 7/7, a 250-milli share 250/1000. So an hour of one
//! `1g.10gb` is `3_600_000 / 7 = 514_285` milli-GPU-seconds (0.1429 GPU-hours). Every sum
//! is a sum of stored integers; nothing is a float.
//!
//! # Prices
//!
//! A [`Rate`] prices one kind per hour per unit of the kind (one MIG instance, one whole
//! GPU), in minor units, from its `effective_from` on (always at a full hour, never before
//! the current one). Each metered row records the rate it was billed at and is never
//! recomputed, so a change never reprices anything billed. A kind without a rate of its
//! own is priced **pro rata from its model's whole-GPU rate by compute slices**: with a
//! whole H100 at 7.00/h, a `1g.10gb` costs 1.00/h and a `3g.40gb` 3.00/h. Preemptible
//! allocations get the rate's discount (percent).
//!
//! For one (allocation, hour) with `wall_ms` of activity and `count` units:
//!
//! ```text
//! list   = round(price × count × wall_ms × num / (3_600_000 × den))
//! billed = round(price × count × wall_ms × num × (100 − discount) / (3_600_000 × den × 100))
//! ```
//!
//! where `num/den` is 1 for a kind's own rate and, for a pro-rata one, the profile's
//! compute slices over the model's (`unit_cost/slices`) or a share's `milli/1000`;
//! `round` is half away from zero, applied once to the exact quotient.
//!
//! # Ledger
//!
//! Double entry: a charge debits the team (`+billed` on `team:<id>`) and credits the
//! platform (`−billed` on `platform`); a correction is a reversing pair, never an edit.
//! All entries sum to zero at all times.

use crate::alloc::{AllocState, GpuKind, PriorityClass};
use crate::error::AppError;
use crate::ids::{AllocationId, TeamId};
use crate::mig::Catalog;
use chrono::{DateTime, Datelike, NaiveDate, TimeDelta, TimeZone, Timelike, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use uuid::Uuid;

pub const HOUR_MS: i64 = 3_600_000;

// ---------------------------------------------------------------------------------------
// Metering
// ---------------------------------------------------------------------------------------

/// A half-open span `[start, end)` during which an allocation was active.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
}

/// The spans an allocation was active, from its history `(at, to_state)` in order. An
/// allocation still active is closed at `until`; nothing after `until` counts.
pub fn active_intervals(
    history: &[(DateTime<Utc>, AllocState)],
    until: DateTime<Utc>,
) -> Vec<Interval> {
    let mut out = Vec::new();
    let mut open: Option<DateTime<Utc>> = None;
    for &(at, to) in history {
        match (open, to == AllocState::Active) {
            (None, true) => open = Some(at),
            (Some(start), false) => {
                push_clipped(&mut out, start, at, until);
                open = None;
            }
            // active → active is an extension; other → other changes nothing.
            _ => {}
        }
    }
    if let Some(start) = open {
        push_clipped(&mut out, start, until, until);
    }
    out
}

fn push_clipped(
    out: &mut Vec<Interval>,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
    until: DateTime<Utc>,
) {
    let end = end.min(until);
    if end > start {
        out.push(Interval { start, end });
    }
}

/// The start of the hour `t` is in.
pub fn hour_floor(t: DateTime<Utc>) -> DateTime<Utc> {
    let secs = t.timestamp().div_euclid(3600) * 3600;
    Utc.timestamp_opt(secs, 0).single().unwrap_or(t)
}

/// Whether `t` is at a full hour.
pub fn is_full_hour(t: DateTime<Utc>) -> bool {
    t.minute() == 0 && t.second() == 0 && t.nanosecond() == 0
}

/// Milliseconds of activity in each hour (keyed by the hour's start) the intervals touch.
pub fn wall_ms_per_hour(intervals: &[Interval]) -> BTreeMap<DateTime<Utc>, i64> {
    let mut out: BTreeMap<DateTime<Utc>, i64> = BTreeMap::new();
    for iv in intervals {
        let mut t = iv.start;
        while t < iv.end {
            let hour = hour_floor(t);
            let next = (hour + TimeDelta::hours(1)).min(iv.end);
            *out.entry(hour).or_default() += (next - t).num_milliseconds();
            t = next;
        }
    }
    out
}

/// Milli-GPU-seconds of `units` compute slices held for `wall_ms` on a model with
/// `slices` compute slices per GPU (rounded half up).
pub fn gpu_ms(units: u32, wall_ms: i64, slices: u32) -> i64 {
    div_round(
        i128::from(units) * i128::from(wall_ms),
        i128::from(slices.max(1)),
    )
}

/// `n / d` rounded half away from zero (`d > 0`).
fn div_round(n: i128, d: i128) -> i64 {
    let q = if n >= 0 {
        (2 * n + d) / (2 * d)
    } else {
        -((-2 * n + d) / (2 * d))
    };
    i64::try_from(q).unwrap_or(if q > 0 { i64::MAX } else { i64::MIN })
}

/// GPU-hours as a decimal string with two places (display only).
pub fn gpu_hours(gpu_ms: i64) -> String {
    let centi = div_round(i128::from(gpu_ms), i128::from(HOUR_MS / 100));
    format!("{}.{:02}", centi / 100, (centi % 100).abs())
}

// ---------------------------------------------------------------------------------------
// Rates
// ---------------------------------------------------------------------------------------

/// One price of a rate card, in force from `effective_from` until a later rate of the
/// same kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rate {
    pub id: Uuid,
    /// Canonical kind string: `H100-80GB:1g.10gb`, `H100-80GB:whole`, ….
    pub kind: String,
    pub price_minor_per_hour: i64,
    pub preemptible_discount_pct: u8,
    /// What `high` priority costs on top, in percent (0–1000).
    #[serde(default)]
    pub high_premium_pct: u16,
    pub effective_from: DateTime<Utc>,
}

/// The price that applies to one kind at one time, and how it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Priced<'r> {
    pub rate: &'r Rate,
    /// The fraction of the rate's unit one of the kind is: 1/1 for its own rate,
    /// `unit_cost / slices` when priced pro rata from the whole GPU.
    pub num: u32,
    pub den: u32,
}

/// Every rate ever set (history included).
#[derive(Debug, Clone, Default)]
pub struct RateCard {
    by_kind: BTreeMap<String, Vec<Rate>>,
}

impl RateCard {
    pub fn new(rates: impl IntoIterator<Item = Rate>) -> Self {
        let mut by_kind: BTreeMap<String, Vec<Rate>> = BTreeMap::new();
        for r in rates {
            by_kind.entry(r.kind.clone()).or_default().push(r);
        }
        for v in by_kind.values_mut() {
            v.sort_by_key(|r| r.effective_from);
        }
        Self { by_kind }
    }

    /// The rate of exactly `kind` in force at `at`.
    pub fn exact(&self, kind: &str, at: DateTime<Utc>) -> Option<&Rate> {
        self.by_kind
            .get(kind)?
            .iter()
            .rev()
            .find(|r| r.effective_from <= at)
    }

    /// The price of `kind` at `at`: its own rate, else pro rata from its model's
    /// whole-GPU rate; `None` when neither is set (the hour is metered at no cost).
    pub fn price(
        &self,
        kind: &GpuKind,
        catalog: &Catalog,
        at: DateTime<Utc>,
    ) -> Option<Priced<'_>> {
        if let Some(rate) = self.exact(&kind.to_string(), at) {
            return Some(Priced {
                rate,
                num: 1,
                den: 1,
            });
        }
        let whole = GpuKind::Whole {
            model: kind.model().to_owned(),
        };
        let rate = self.exact(&whole.to_string(), at)?;
        // A share is its milli-GPU of the whole; a MIG profile its compute slices.
        let (num, den) = match kind {
            GpuKind::Share { milli, .. } => (*milli, 1000),
            _ => (
                kind.unit_cost(catalog).ok()?,
                whole.unit_cost(catalog).ok()?,
            ),
        };
        Some(Priced { rate, num, den })
    }
}

/// Cost of one (allocation, hour): `(list, billed)` in minor units (see the module docs):
/// `preemptible` gets the rate's discount, `high` pays its premium.
pub fn cost(priced: &Priced<'_>, count: u32, wall_ms: i64, priority: PriorityClass) -> (i64, i64) {
    let base = i128::from(priced.rate.price_minor_per_hour)
        * i128::from(count)
        * i128::from(wall_ms)
        * i128::from(priced.num);
    let den = i128::from(HOUR_MS) * i128::from(priced.den.max(1));
    let list = div_round(base, den);
    let pct = match priority {
        PriorityClass::Preemptible => {
            100 - i128::from(priced.rate.preemptible_discount_pct.min(100))
        }
        PriorityClass::Normal => 100,
        PriorityClass::High => 100 + i128::from(priced.rate.high_premium_pct.min(HIGH_PREMIUM_MAX)),
    };
    let billed = if pct == 100 {
        list
    } else {
        div_round(base * pct, den * 100)
    };
    (list, billed)
}

/// The highest premium a rate may put on `high` priority, in percent.
pub const HIGH_PREMIUM_MAX: u16 = 1000;

/// What an admin asks to set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NewRate {
    /// `H100-80GB:1g.10gb`, `H100-80GB:whole`, ….
    pub kind: String,
    /// Per unit of the kind and hour, in minor units of the currency (cents).
    pub price_minor_per_hour: i64,
    /// Discount for preemptible allocations, 0–100 %.
    #[serde(default)]
    pub preemptible_discount_pct: u8,
    /// Premium for `high` priority (teams granted it), 0–1000 %.
    #[serde(default)]
    pub high_premium_pct: u16,
    /// From when it applies: a full hour, not in the past; default the next full hour.
    #[serde(default)]
    pub effective_from: Option<DateTime<Utc>>,
}

impl NewRate {
    /// The rate form's fields as typed: `price` a decimal amount in `currency`, the
    /// discount a whole percentage (empty: 0), `effective_from` a UTC date and hour
    /// like `2026-12-01T00:00` (empty: the next full hour). Errors name the field;
    /// [`validate_rate`] checks the rest.
    pub fn from_form(
        kind: String,
        price: &str,
        preemptible_discount_pct: &str,
        high_premium_pct: &str,
        effective_from: &str,
        currency: &str,
    ) -> Result<NewRate, AppError> {
        let premium = match high_premium_pct.trim() {
            "" => 0,
            t => t.parse().map_err(|_| {
                AppError::invalid(
                    "high_premium_pct",
                    "must be a whole number between 0 and 1000",
                )
            })?,
        };
        let discount = match preemptible_discount_pct.trim() {
            "" => 0,
            t => t.parse().map_err(|_| {
                AppError::invalid(
                    "preemptible_discount_pct",
                    "must be a whole number between 0 and 100",
                )
            })?,
        };
        let effective_from = match effective_from.trim() {
            "" => None,
            t => Some(
                chrono::NaiveDateTime::parse_from_str(t, "%Y-%m-%dT%H:%M")
                    .map_err(|_| {
                        AppError::invalid(
                            "effective_from",
                            "must be a date and hour like 2026-12-01T00:00",
                        )
                    })?
                    .and_utc(),
            ),
        };
        Ok(NewRate {
            kind,
            price_minor_per_hour: parse_money(price, currency, "price")?,
            preemptible_discount_pct: discount,
            high_premium_pct: premium,
            effective_from,
        })
    }
}

/// The most a rate may charge per hour (minor units): keeps every product in range.
pub const PRICE_MAX_MINOR: i64 = 100_000_000;

/// A checked rate: canonical kind, price in range, effective from a full hour not before
/// the current one.
pub fn validate_rate(
    input: &NewRate,
    catalog: &Catalog,
    now: DateTime<Utc>,
) -> Result<(GpuKind, DateTime<Utc>), AppError> {
    let kind: GpuKind = input.kind.trim().parse()?;
    let kind = kind.canonical(catalog)?;
    if !(0..=PRICE_MAX_MINOR).contains(&input.price_minor_per_hour) {
        return Err(AppError::invalid(
            "price_minor_per_hour",
            format!("must be between 0 and {PRICE_MAX_MINOR}"),
        ));
    }
    if input.preemptible_discount_pct > 100 {
        return Err(AppError::invalid(
            "preemptible_discount_pct",
            "must be between 0 and 100",
        ));
    }
    if input.high_premium_pct > HIGH_PREMIUM_MAX {
        return Err(AppError::invalid(
            "high_premium_pct",
            format!("must be between 0 and {HIGH_PREMIUM_MAX}"),
        ));
    }
    let current = hour_floor(now);
    let from = input
        .effective_from
        .unwrap_or(current + TimeDelta::hours(1));
    if !is_full_hour(from) {
        return Err(AppError::invalid(
            "effective_from",
            "must be at a full hour (e.g. 14:00 UTC)",
        ));
    }
    if from < current {
        return Err(AppError::invalid(
            "effective_from",
            "cannot be in the past: hours already billed keep their price",
        ));
    }
    Ok((kind, from))
}

// ---------------------------------------------------------------------------------------
// Money
// ---------------------------------------------------------------------------------------

/// Digits after the decimal point of an ISO 4217 currency (0 for JPY, KRW, …; else 2).
pub fn minor_digits(currency: &str) -> u32 {
    match currency {
        "JPY" | "KRW" | "VND" | "CLP" | "ISK" | "UGX" | "XAF" | "XOF" => 0,
        "BHD" | "KWD" | "OMR" | "JOD" | "TND" => 3,
        _ => 2,
    }
}

/// Whether `code` looks like an ISO 4217 code (three capital letters).
pub fn is_currency_code(code: &str) -> bool {
    code.len() == 3 && code.bytes().all(|b| b.is_ascii_uppercase())
}

/// `1234` USD → `12.34`; `-5` → `-0.05`.
pub fn format_minor(amount: i64, currency: &str) -> String {
    let digits = minor_digits(currency);
    if digits == 0 {
        return amount.to_string();
    }
    let scale = 10i64.pow(digits);
    let sign = if amount < 0 { "-" } else { "" };
    let a = amount.unsigned_abs();
    let s = scale.unsigned_abs();
    format!("{sign}{}.{:0width$}", a / s, a % s, width = digits as usize)
}

/// `12.34` → `1234` (for USD); at most the currency's digits after the point.
pub fn parse_money(text: &str, currency: &str, field: &str) -> Result<i64, AppError> {
    let digits = minor_digits(currency) as usize;
    let t = text.trim();
    let bad = || AppError::invalid(field, format!("must be an amount like 12.50 {currency}"));
    let (whole, frac) = t.split_once('.').unwrap_or((t, ""));
    if whole.is_empty() && frac.is_empty()
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(bad());
    }
    if frac.len() > digits {
        return Err(AppError::invalid(
            field,
            format!("has more than {digits} digits after the point"),
        ));
    }
    let whole: i64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| bad())?
    };
    let frac_val: i64 = if frac.is_empty() {
        0
    } else {
        frac.parse().map_err(|_| bad())?
    };
    let scale = 10i64.pow(digits as u32);
    let frac_scaled = frac_val * 10i64.pow((digits - frac.len()) as u32);
    whole
        .checked_mul(scale)
        .and_then(|w| w.checked_add(frac_scaled))
        .ok_or_else(|| AppError::invalid(field, "is too large"))
}

// ---------------------------------------------------------------------------------------
// Ledger
// ---------------------------------------------------------------------------------------

/// A ledger account.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Account {
    Team(TeamId),
    Platform,
}

impl Account {
    pub fn key(&self) -> String {
        match self {
            Account::Team(t) => format!("team:{}", t.0),
            Account::Platform => "platform".into(),
        }
    }
}

/// What a ledger entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum EntryType {
    /// An hour of use charged.
    Charge,
    /// A charge undone (an admin's reversal).
    Reversal,
}

impl EntryType {
    pub fn as_str(self) -> &'static str {
        match self {
            EntryType::Charge => "charge",
            EntryType::Reversal => "reversal",
        }
    }
}

impl std::str::FromStr for EntryType {
    type Err = AppError;
    fn from_str(s: &str) -> Result<Self, AppError> {
        match s {
            "charge" => Ok(EntryType::Charge),
            "reversal" => Ok(EntryType::Reversal),
            other => Err(AppError::invalid(
                "entry_type",
                format!("unknown ledger entry type {other}"),
            )),
        }
    }
}

/// One posting of a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Posting {
    pub account: Account,
    /// Positive: debit (the team owes); negative: credit.
    pub amount_minor: i64,
}

/// The two postings of a charge of `amount` to `team`; they sum to zero.
pub fn charge(team: TeamId, amount: i64) -> [Posting; 2] {
    [
        Posting {
            account: Account::Team(team),
            amount_minor: amount,
        },
        Posting {
            account: Account::Platform,
            amount_minor: -amount,
        },
    ]
}

/// The postings that undo `postings` exactly.
pub fn reverse(postings: &[Posting]) -> Vec<Posting> {
    postings
        .iter()
        .map(|p| Posting {
            account: p.account,
            amount_minor: -p.amount_minor,
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Budgets and periods
// ---------------------------------------------------------------------------------------

/// The alert thresholds of a budget, in percent.
pub const BUDGET_ALERTS: [u8; 3] = [50, 80, 100];

/// The highest threshold `spent` has reached of `budget` (`None` below 50 % or without a
/// budget).
pub fn alert_level(spent: i64, budget: i64) -> Option<u8> {
    if budget <= 0 {
        return (spent > 0 && budget == 0).then_some(100);
    }
    BUDGET_ALERTS
        .iter()
        .rev()
        .find(|&&pct| i128::from(spent) * 100 >= i128::from(budget) * i128::from(pct))
        .copied()
}

/// Percent of the budget spent, rounded down (0 without a budget).
pub fn used_pct(spent: i64, budget: i64) -> u32 {
    if budget <= 0 {
        return 0;
    }
    u32::try_from((i128::from(spent.max(0)) * 100 / i128::from(budget)).min(100_000)).unwrap_or(0)
}

/// Whether a request estimated at `estimate` needs a platform admin because of a hard
/// budget: it would take this month's spend beyond the budget.
pub fn over_hard_budget(budget: i64, hard: bool, spent: i64, estimate: i64) -> bool {
    hard && spent.saturating_add(estimate) > budget
}

/// Calendar month `YYYY-MM` as its first day.
pub fn parse_month(text: &str) -> Result<NaiveDate, AppError> {
    NaiveDate::parse_from_str(&format!("{}-01", text.trim()), "%Y-%m-%d")
        .map_err(|_| AppError::invalid("month", "must be a month like 2026-11"))
}

/// `[first day 00:00, first day of next month 00:00)` in UTC.
pub fn month_bounds(first: NaiveDate) -> (DateTime<Utc>, DateTime<Utc>) {
    let start = first.with_day(1).unwrap_or(first);
    let next = if start.month() == 12 {
        NaiveDate::from_ymd_opt(start.year() + 1, 1, 1)
    } else {
        NaiveDate::from_ymd_opt(start.year(), start.month() + 1, 1)
    }
    .unwrap_or(start);
    (day_start(start), day_start(next))
}

pub fn day_start(d: NaiveDate) -> DateTime<Utc> {
    Utc.from_utc_datetime(&d.and_hms_opt(0, 0, 0).unwrap_or_default())
}

/// The month `at` is in.
pub fn month_of(at: DateTime<Utc>) -> NaiveDate {
    at.date_naive().with_day(1).unwrap_or(at.date_naive())
}

/// Longest period a usage query or export may span.
pub const PERIOD_MAX_DAYS: i64 = 400;

/// A day given as text (`YYYY-MM-DD`; empty or absent: none), or a 422 naming `field`.
pub fn parse_day(s: Option<&str>, field: &str) -> Result<Option<NaiveDate>, AppError> {
    match s.map(str::trim).filter(|s| !s.is_empty()) {
        Some(s) => NaiveDate::parse_from_str(s, "%Y-%m-%d")
            .map(Some)
            .map_err(|_| AppError::invalid(field, "must be a date like 2026-11-01")),
        None => Ok(None),
    }
}

/// A checked `[from, to)` period from two days (`to` inclusive); defaults to the month of
/// `now` so far.
pub fn parse_period(
    from: Option<NaiveDate>,
    to: Option<NaiveDate>,
    now: DateTime<Utc>,
) -> Result<(DateTime<Utc>, DateTime<Utc>), AppError> {
    let from = match from {
        Some(d) => day_start(d),
        None => month_bounds(month_of(now)).0,
    };
    let to = match to {
        Some(d) => day_start(d) + TimeDelta::days(1),
        None => day_start(now.date_naive()) + TimeDelta::days(1),
    };
    if to <= from {
        return Err(AppError::invalid("to", "must not be before from"));
    }
    if to - from > TimeDelta::days(PERIOD_MAX_DAYS) {
        return Err(AppError::invalid(
            "to",
            format!("the period may span at most {PERIOD_MAX_DAYS} days"),
        ));
    }
    Ok((from, to))
}

// ---------------------------------------------------------------------------------------
// Views
// ---------------------------------------------------------------------------------------

/// What to estimate: a request's kind, how many, for how long, at which priority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EstimateQuery {
    pub kind: GpuKind,
    pub count: u32,
    /// 0: open-ended, which has no estimate.
    pub duration_hours: u32,
    pub priority: PriorityClass,
}

/// What a request would cost at today's rates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CostEstimate {
    /// Minor units of `currency` (cents); 0 when the kind has no rate or no duration
    /// was given.
    pub minor: i64,
    pub currency: String,
    /// e.g. `12.00 USD`; empty when `minor` is 0.
    pub text: String,
}

/// A rate as the UI and REST show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RateView {
    pub id: Uuid,
    pub kind: String,
    pub kind_label: String,
    pub price_minor_per_hour: i64,
    /// e.g. `2.50`.
    pub price: String,
    pub currency: String,
    pub preemptible_discount_pct: u8,
    #[serde(default)]
    pub high_premium_pct: u16,
    pub effective_from: DateTime<Utc>,
    /// In force now (not superseded, not in the future).
    pub current: bool,
    pub created_by: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// A team's monthly budget and this month's spend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BudgetView {
    pub team_id: TeamId,
    pub team_name: String,
    /// `None`: no budget set.
    pub monthly_minor: Option<i64>,
    /// New requests that would go beyond the budget need a platform admin's approval.
    pub hard: bool,
    pub spent_minor: i64,
    pub currency: String,
    pub used_pct: u32,
    /// Highest alert threshold reached (50, 80, 100).
    pub alert: Option<u8>,
}

/// What an admin sets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SetBudget {
    /// Per calendar month (UTC), minor units; `null` removes the budget.
    pub monthly_minor: Option<i64>,
    #[serde(default)]
    pub hard: bool,
}

/// One ledger entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LedgerEntryView {
    pub id: Uuid,
    /// Entries of one transaction share it and sum to zero.
    pub txn_id: Uuid,
    /// `team:<id>` or `platform`.
    pub account: String,
    pub team_id: TeamId,
    pub team_name: String,
    /// Positive: the team is debited; negative: credited.
    pub amount_minor: i64,
    pub currency: String,
    pub entry_type: EntryType,
    pub allocation_id: AllocationId,
    /// The hour charged.
    pub hour_start: DateTime<Utc>,
    pub posted_at: DateTime<Utc>,
    pub memo: Option<String>,
}

/// Totals over a period (or a day, a kind, a user).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UsageTotals {
    /// Allocated GPU-time, milli-GPU-seconds.
    pub gpu_ms: i64,
    /// Of that, time the device was busy (utilisation at or above the threshold).
    pub active_gpu_ms: i64,
    /// Billed cost (after discounts and reversals), minor units.
    pub cost_minor: i64,
}

impl UsageTotals {
    pub fn add(&mut self, o: &UsageTotals) {
        self.gpu_ms += o.gpu_ms;
        self.active_gpu_ms += o.active_gpu_ms;
        self.cost_minor += o.cost_minor;
    }

    /// Percent of allocated GPU-time that was busy.
    pub fn efficiency_pct(&self) -> u32 {
        if self.gpu_ms <= 0 {
            return 0;
        }
        u32::try_from(i128::from(self.active_gpu_ms.max(0)) * 100 / i128::from(self.gpu_ms))
            .unwrap_or(0)
    }
}

/// A labelled total: a day (`2026-11-03`), a kind, a user, a team, a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UsageRow {
    pub key: String,
    pub label: String,
    #[serde(flatten)]
    pub totals: UsageTotals,
}

/// Usage over a period: per day, per kind, per user, per team.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UsageReport {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub currency: String,
    /// The team it is limited to, if any.
    pub team_id: Option<TeamId>,
    /// Only the caller's own usage (members who are not team admins).
    pub own_only: bool,
    /// Every day of the period, in order (zero days included).
    pub days: Vec<UsageRow>,
    pub kinds: Vec<UsageRow>,
    /// Most cost first.
    pub users: Vec<UsageRow>,
    pub teams: Vec<UsageRow>,
    pub total: UsageTotals,
}

/// One line of a monthly statement: a kind used by a user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StatementLine {
    pub kind: String,
    pub kind_label: String,
    pub username: String,
    pub allocations: u32,
    pub wall_ms: i64,
    #[serde(flatten)]
    pub totals: UsageTotals,
    pub list_minor: i64,
}

/// What a team owes for a month.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Statement {
    pub team_id: TeamId,
    pub team_name: String,
    /// `2026-11`.
    pub month: String,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub currency: String,
    pub lines: Vec<StatementLine>,
    /// Reversals posted for hours of this month (negative).
    pub adjustments_minor: i64,
    /// Charges plus adjustments: what the ledger says the team owes for the month.
    pub total_minor: i64,
    pub budget: Option<BudgetView>,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_form_is_read_into_a_typed_rate_with_field_errors() {
        let r = NewRate::from_form("H100-80GB:whole".into(), "7.50", "", "", " ", "EUR").unwrap();
        assert_eq!(r.price_minor_per_hour, 750);
        assert_eq!((r.preemptible_discount_pct, r.effective_from), (0, None));
        let r = NewRate::from_form("k".into(), "1", "40", "50", "2026-12-01T13:00", "JPY").unwrap();
        assert_eq!(r.price_minor_per_hour, 1);
        assert_eq!((r.preemptible_discount_pct, r.high_premium_pct), (40, 50));
        assert_eq!(
            r.effective_from,
            Some(Utc.with_ymd_and_hms(2026, 12, 1, 13, 0, 0).unwrap())
        );
        for (price, discount, from, field) in [
            ("seven", "", "", "price"),
            ("7", "-1", "", "preemptible_discount_pct"),
            ("7", "300", "", "preemptible_discount_pct"),
            ("7", "", "tomorrow", "effective_from"),
        ] {
            let e = NewRate::from_form("k".into(), price, discount, "", from, "EUR").unwrap_err();
            assert!(
                matches!(&e, AppError::Invalid { field: f, .. } if f == field),
                "{price}/{discount}/{from}: {e:?}"
            );
        }
    }
    use proptest::prelude::*;

    fn t(s: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_790_000_000 - 1_790_000_000 % 3600 + s, 0)
            .unwrap()
    }

    fn catalog() -> Catalog {
        Catalog::builtin()
    }

    fn rate(kind: &str, price: i64, disc: u8, from: DateTime<Utc>) -> Rate {
        Rate {
            id: Uuid::nil(),
            kind: kind.into(),
            price_minor_per_hour: price,
            preemptible_discount_pct: disc,
            high_premium_pct: 50,
            effective_from: from,
        }
    }

    #[test]
    fn intervals_follow_the_history() {
        use AllocState::*;
        let h = [
            (t(0), Queued),
            (t(10), Placing),
            (t(20), Active),
            (t(50), Active),
            (t(100), Releasing),
            (t(105), Ended),
        ];
        assert_eq!(
            active_intervals(&h, t(1000)),
            vec![Interval {
                start: t(20),
                end: t(100)
            }]
        );
        // Still active: closed at `until`; nothing after it counts.
        let h = [(t(20), Active)];
        assert_eq!(
            active_intervals(&h, t(30)),
            vec![Interval {
                start: t(20),
                end: t(30)
            }]
        );
        assert!(active_intervals(&h, t(10)).is_empty());
    }

    #[test]
    fn wall_time_splits_at_hour_boundaries() {
        let m = wall_ms_per_hour(&[Interval {
            start: t(3000),
            end: t(3600 * 2 + 60),
        }]);
        assert_eq!(
            m.into_iter().collect::<Vec<_>>(),
            vec![(t(0), 600_000), (t(3600), 3_600_000), (t(7200), 60_000)]
        );
    }

    #[test]
    fn one_mig_slice_hour_is_a_seventh_of_a_gpu_hour() {
        assert_eq!(gpu_ms(1, HOUR_MS, 7), 514_286);
        assert_eq!(gpu_ms(7, HOUR_MS, 7), HOUR_MS);
        assert_eq!(gpu_hours(gpu_ms(1, HOUR_MS, 7)), "0.14");
        assert_eq!(gpu_hours(HOUR_MS * 3 / 2), "1.50");
    }

    #[test]
    fn mig_kinds_are_priced_pro_rata_from_the_whole_gpu() {
        let c = catalog();
        let card = RateCard::new([rate("H100-80GB:whole", 700, 50, t(0))]);
        let slice: GpuKind = "H100-80GB:1g.10gb".parse().unwrap();
        let p = card.price(&slice, &c, t(10)).unwrap();
        assert_eq!((p.num, p.den), (1, 7));
        assert_eq!(cost(&p, 1, HOUR_MS, PriorityClass::Normal), (100, 100));
        assert_eq!(
            cost(&p, 3, HOUR_MS / 2, PriorityClass::Preemptible),
            (150, 75)
        );
        // `high` pays the rate's premium (50 % here) on top of the list price.
        assert_eq!(cost(&p, 3, HOUR_MS / 2, PriorityClass::High), (150, 225));
        // Its own rate wins.
        let card = RateCard::new([
            rate("H100-80GB:whole", 700, 0, t(0)),
            rate("H100-80GB:1g.10gb", 130, 0, t(0)),
        ]);
        assert_eq!(
            cost(
                &card.price(&slice, &c, t(10)).unwrap(),
                1,
                HOUR_MS,
                PriorityClass::Normal
            ),
            (130, 130)
        );
        // Nothing set for another model.
        let a100: GpuKind = "A100-40GB:whole".parse().unwrap();
        assert!(card.price(&a100, &c, t(10)).is_none());
    }

    #[test]
    fn a_rate_change_applies_from_its_hour() {
        let c = catalog();
        let card = RateCard::new([
            rate("H100-80GB:whole", 700, 0, t(0)),
            rate("H100-80GB:whole", 1400, 0, t(7200)),
        ]);
        let k: GpuKind = "H100-80GB:whole".parse().unwrap();
        assert_eq!(
            card.price(&k, &c, t(3600))
                .unwrap()
                .rate
                .price_minor_per_hour,
            700
        );
        assert_eq!(
            card.price(&k, &c, t(7200))
                .unwrap()
                .rate
                .price_minor_per_hour,
            1400
        );
        assert!(card.price(&k, &c, t(-1)).is_none());
    }

    #[test]
    fn rates_are_checked() {
        let c = catalog();
        let now = t(1800);
        let ok = NewRate {
            kind: "h100-80gb:1G.10GB".into(),
            price_minor_per_hour: 100,
            preemptible_discount_pct: 30,
            high_premium_pct: 25,
            effective_from: None,
        };
        let (kind, from) = validate_rate(&ok, &c, now).unwrap();
        assert_eq!(kind.to_string(), "H100-80GB:1g.10gb");
        assert_eq!(from, t(3600));
        let field = |r: NewRate| match validate_rate(&r, &c, now) {
            Err(AppError::Invalid { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            field(NewRate {
                price_minor_per_hour: -1,
                ..ok.clone()
            }),
            "price_minor_per_hour"
        );
        assert_eq!(
            field(NewRate {
                preemptible_discount_pct: 101,
                ..ok.clone()
            }),
            "preemptible_discount_pct"
        );
        assert_eq!(
            field(NewRate {
                high_premium_pct: 1001,
                ..ok.clone()
            }),
            "high_premium_pct"
        );
        assert_eq!(
            field(NewRate {
                effective_from: Some(t(3601)),
                ..ok.clone()
            }),
            "effective_from"
        );
        assert_eq!(
            field(NewRate {
                effective_from: Some(t(-3600)),
                ..ok.clone()
            }),
            "effective_from"
        );
        assert_eq!(
            field(NewRate {
                kind: "X:whole".into(),
                ..ok.clone()
            }),
            "kind"
        );
        // The current hour is allowed (it is not billed until it ends).
        assert!(
            validate_rate(
                &NewRate {
                    effective_from: Some(t(0)),
                    ..ok
                },
                &c,
                now
            )
            .is_ok()
        );
    }

    #[test]
    fn money_round_trips() {
        assert_eq!(format_minor(1234, "USD"), "12.34");
        assert_eq!(format_minor(-5, "EUR"), "-0.05");
        assert_eq!(format_minor(1234, "JPY"), "1234");
        assert_eq!(parse_money("12.5", "USD", "p").unwrap(), 1250);
        assert_eq!(parse_money("0.07", "USD", "p").unwrap(), 7);
        assert_eq!(parse_money("3", "USD", "p").unwrap(), 300);
        assert!(parse_money("1.234", "USD", "p").is_err());
        assert!(parse_money("-1", "USD", "p").is_err());
        assert!(parse_money("", "USD", "p").is_err());
        assert!(parse_money("1.5", "JPY", "p").is_err());
    }

    #[test]
    fn budget_alerts_at_50_80_100() {
        assert_eq!(alert_level(49, 100), None);
        assert_eq!(alert_level(50, 100), Some(50));
        assert_eq!(alert_level(99, 100), Some(80));
        assert_eq!(alert_level(150, 100), Some(100));
        assert_eq!(used_pct(150, 100), 150);
        assert!(over_hard_budget(100, true, 90, 11));
        assert!(!over_hard_budget(100, true, 90, 10));
        assert!(!over_hard_budget(100, false, 90, 1000));
    }

    #[test]
    fn periods() {
        let now = Utc.with_ymd_and_hms(2026, 12, 15, 10, 0, 0).unwrap();
        let (a, b) = parse_period(None, None, now).unwrap();
        let day = |s| parse_day(Some(s), "from").unwrap();
        assert_eq!(a, Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap());
        assert_eq!(b, Utc.with_ymd_and_hms(2026, 12, 16, 0, 0, 0).unwrap());
        let (a, b) = month_bounds(parse_month("2026-12").unwrap());
        assert_eq!((a.month(), b.year(), b.month()), (12, 2027, 1));
        assert!(parse_period(day("2026-12-02"), day("2026-12-01"), now).is_err());
        assert!(parse_period(day("2020-01-01"), day("2026-12-01"), now).is_err());
        assert!(parse_day(Some("nope"), "from").is_err());
        assert_eq!(parse_day(Some(" "), "from").unwrap(), None);
        assert_eq!(parse_day(None, "from").unwrap(), None);
    }

    /// Random histories of whole seconds: active, extended, released, re-activated.
    fn history() -> impl Strategy<Value = Vec<(i64, bool)>> {
        proptest::collection::vec((0i64..20_000, any::<bool>()), 0..12).prop_map(|mut v| {
            v.sort_by_key(|e| e.0);
            v
        })
    }

    proptest! {
        /// Metering equals a brute-force count of active seconds, hour by hour.
        #[test]
        fn metering_matches_per_second_ground_truth(events in history(), until in 0i64..25_000, units in 1u32..8) {
            let h: Vec<(DateTime<Utc>, AllocState)> = events.iter()
                .map(|&(s, active)| (t(s), if active { AllocState::Active } else { AllocState::Releasing }))
                .collect();
            let metered = wall_ms_per_hour(&active_intervals(&h, t(until)));
            // Ground truth: second s is active iff the last event at or before it is active.
            let mut truth: BTreeMap<DateTime<Utc>, i64> = BTreeMap::new();
            for s in 0..until {
                let state = events.iter().rev().find(|e| e.0 <= s).map(|e| e.1);
                if state == Some(true) {
                    *truth.entry(hour_floor(t(s))).or_default() += 1000;
                }
            }
            prop_assert_eq!(&metered, &truth);
            let total: i64 = metered.values().map(|&ms| gpu_ms(units * 1000, ms, 1000)).sum();
            prop_assert_eq!(total, truth.values().sum::<i64>() * i64::from(units));
        }

        /// Billing hour by hour at a constant rate never drifts from billing the total by
        /// more than half a minor unit per hour.
        #[test]
        fn per_hour_rounding_is_bounded(ms in proptest::collection::vec(0i64..=HOUR_MS, 1..50), price in 0i64..100_000, disc in 0u8..=100) {
            let r = rate("H100-80GB:whole", price, disc, t(0));
            let p = Priced { rate: &r, num: 1, den: 7 };
            let billed: i64 = ms.iter().map(|&m| cost(&p, 3, m, PriorityClass::Preemptible).1).sum();
            let exact = i128::from(price) * 3 * i128::from(ms.iter().sum::<i64>()) * i128::from(100 - disc);
            let denom = i128::from(HOUR_MS) * 7 * 100;
            let diff = (i128::from(billed) * denom - exact).abs();
            prop_assert!(diff * 2 <= denom * ms.len() as i128);
        }

        #[test]
        fn charges_and_reversals_balance(team in any::<u128>(), amount in -1_000_000i64..1_000_000) {
            let c = charge(TeamId(Uuid::from_u128(team)), amount);
            prop_assert_eq!(c.iter().map(|p| p.amount_minor).sum::<i64>(), 0);
            let r = reverse(&c);
            prop_assert_eq!(c.iter().chain(r.iter()).map(|p| p.amount_minor).sum::<i64>(), 0);
            prop_assert_eq!(r[0].amount_minor, -amount);
        }

        #[test]
        fn money_parses_what_it_formats(a in 0i64..1_000_000_000) {
            prop_assert_eq!(parse_money(&format_minor(a, "USD"), "USD", "x").unwrap(), a);
        }
    }
}
