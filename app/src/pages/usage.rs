//! Usage and cost: GPU-hours a team held, how much of that time the GPUs were busy, and
//! what it cost, per day (two inline SVG charts with table fallbacks), per GPU kind, per
//! user and, for platform admins looking at every team, per team.

mod chart;

use super::money;
use crate::api::{self, UiError};
use crate::components::Card;
use crate::components::{Authenticated, Empty, Loading, Problem};
use crate::components::{Columns, list_table};
use crate::components::{TeamChoice, load_teams};
use leptos::prelude::*;
use leptos_router::components::Form;
use leptos_router::hooks::use_query_map;
use serde::{Deserialize, Serialize};
use tessera_domain::billing::{UsageReport, UsageRow, gpu_hours};
use tessera_domain::error::AppError;

/// Milli-GPU-seconds in a hundredth of a GPU-hour: the GPU chart's display unit.
const CENTI_GPU_HOUR: i64 = 36_000;
/// Rows of the "Top users" table.
const TOP_USERS: usize = 10;

#[component]
pub fn UsagePage() -> impl IntoView {
    // Created here, outside `Authenticated`, like the nodes page (see the comment there).
    let filter = use_filter();
    let data = Resource::new(move || filter.get(), load_usage);
    view! {
        <Authenticated>
            <h1>"Usage and cost"</h1>
            <p class="hint lead">
                "GPU time held by allocations, how much of it the GPUs were busy, and what it cost. "
                "Days are UTC; the current hour shows once it is metered."
            </p>
            <UsageView filter data />
        </Authenticated>
    }
}

/// The report's filter, from the address: `?team=…&from=YYYY-MM-DD&to=YYYY-MM-DD`. Empty
/// dates mean this month so far; an empty team means every team (platform admins) or the
/// caller's first team.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Filter {
    team: String,
    from: String,
    to: String,
}

fn use_filter() -> Memo<Filter> {
    let query = use_query_map();
    Memo::new(move |_| {
        let q = query.read();
        let get = |k: &str| q.get(k).map(|v| v.trim().to_owned()).unwrap_or_default();
        Filter {
            team: get("team"),
            from: get("from"),
            to: get("to"),
        }
    })
}

/// What the page shows: the team choices, the team actually reported on, and the report
/// (`None` when the caller is in no team at all).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct UsageData {
    admin: bool,
    teams: Vec<TeamChoice>,
    team: String,
    report: Option<Result<UsageReport, UiError>>,
}

async fn load_usage(f: Filter) -> Result<UsageData, UiError> {
    let admin = api::current_user().await?.is_some_and(|me| me.is_admin);
    let teams = load_teams().await?;
    // Members must name a team: the first unarchived one (else any) by default.
    let team = if f.team.is_empty() && !admin {
        teams
            .iter()
            .find(|t| !t.archived)
            .or(teams.first())
            .map(|t| t.id.clone())
            .unwrap_or_default()
    } else {
        f.team.clone()
    };
    let report = if team.is_empty() && !admin {
        None
    } else {
        Some(api::usage(team.clone(), f.from.clone(), f.to.clone()).await)
    };
    Ok(UsageData {
        admin,
        teams,
        team,
        report,
    })
}

#[component]
fn UsageView(filter: Memo<Filter>, data: Resource<Result<UsageData, UiError>>) -> impl IntoView {
    view! {
        <div class="usage" data-testid="usage-page">
            <Transition fallback=Loading>
                {move || Suspend::new(async move {
                    let f = filter.get_untracked();
                    match data.await {
                        Ok(d) => view! { <UsageBody f d /> }.into_any(),
                        Err(e) => view! { <Problem error=e.error /> }.into_any(),
                    }
                })}
            </Transition>
        </div>
    }
}

#[component]
fn UsageBody(f: Filter, d: UsageData) -> impl IntoView {
    let error = d.report.as_ref().and_then(|r| r.as_ref().err()).cloned();
    let form = view! { <FilterForm f=f.clone() d=d.clone() error=error.clone() /> };
    let body = match d.report {
        None => view! {
            <Empty>
                <p>"You are not in any team yet, so there is no usage to show."</p>
                <a href="/teams">"Your teams →"</a>
            </Empty>
        }
        .into_any(),
        // Bad dates show next to their fields, in the form above.
        Some(Err(e)) if is_filter_error(&e.error) => ().into_any(),
        Some(Err(e)) => view! { <Problem error=e.error /> }.into_any(),
        Some(Ok(r)) => {
            let all_teams = d.admin && r.team_id.is_none();
            view! { <Report r team=d.team.clone() all_teams /> }.into_any()
        }
    };
    view! {
        {form}
        {body}
    }
}

/// Team and period as a GET form: works without JavaScript, navigates in place with it.
#[component]
fn FilterForm(f: Filter, d: UsageData, error: Option<UiError>) -> impl IntoView {
    let options = d
        .teams
        .iter()
        .map(|t| {
            let label = if t.archived {
                format!("{} (archived)", t.name)
            } else {
                t.name.clone()
            };
            view! {
                <option value=t.id.clone() selected=t.id == d.team>
                    {label}
                </option>
            }
        })
        .collect_view();
    let all = d.admin.then(|| {
        view! {
            <option value="" selected=d.team.is_empty()>
                "All teams"
            </option>
        }
    });
    let field = move |name: &'static str| {
        error.as_ref().and_then(|e| e.for_field(name)).map(|m| {
            view! {
                <p class="field-error" id=format!("usage-{name}-error") role="alert">
                    {m}
                </p>
            }
        })
    };
    let (from_error, to_error) = (field("from"), field("to"));
    let team_error = field("team");
    let dates = [("from", "From", &f.from), ("to", "To", &f.to)].map(|(name, label, value)| {
        let invalid = field(name).is_some().then_some("true");
        view! {
            <label for=format!("usage-{name}")>{label}</label>
            <input
                id=format!("usage-{name}")
                name=name
                type="date"
                value=value.clone()
                aria-invalid=invalid
            />
        }
    });
    view! {
        <Form method="get" action="/usage" attr:class="filters" attr:data-testid="usage-filter">
            <label for="usage-team">"Team"</label>
            <select id="usage-team" name="team">
                {all}
                {options}
            </select>
            {dates}
            <button type="submit">"Show"</button>
            <span class="hint">"Empty dates: this month so far. Both days are included."</span>
        </Form>
        {team_error}
        {from_error}
        {to_error}
    }
}

/// `[from, to)` as the days it covers: `Nov 1 – Nov 15, 2026 (UTC)`.
fn period_text(r: &UsageReport) -> String {
    let first = r.from.date_naive();
    let last = (r.to - chrono::TimeDelta::days(1)).date_naive();
    if first == last {
        format!("{} (UTC)", first.format("%b %-d, %Y"))
    } else {
        format!(
            "{} – {} (UTC)",
            first.format("%b %-d, %Y"),
            last.format("%b %-d, %Y")
        )
    }
}

/// The usage CSV of the same team and period.
fn csv_href(r: &UsageReport, team: &str) -> String {
    let last = r.to - chrono::TimeDelta::days(1);
    format!(
        "/api/v1/exports/usage.csv?team={team}&from={}&to={}",
        r.from.format("%Y-%m-%d"),
        last.format("%Y-%m-%d")
    )
}

#[component]
fn Report(r: UsageReport, team: String, all_teams: bool) -> impl IntoView {
    let own = r.own_only.then(|| {
        view! {
            <div class="notice muted" role="status" data-testid="usage-own-only">
                "You see your own usage; team admins see the whole team."
            </div>
        }
    });
    let period = view! {
        <p class="hint" data-testid="usage-period">
            {period_text(&r)}
        </p>
    };
    if r.total.gpu_ms == 0 {
        return view! {
            {own}
            {period}
            <Empty>
                <p data-testid="usage-empty">
                    "No metered GPU time in this period yet. Usage is metered hourly, and when an allocation ends."
                </p>
                <a href="/allocations">"Request a GPU →"</a>
            </Empty>
        }
        .into_any();
    }
    let c = r.currency.clone();
    let csv = csv_href(&r, &team);
    let t = r.total.clone();
    let teams = all_teams.then(|| {
        let c = c.clone();
        view! {
            <Card id="usage-teams" title="By team" wide=true>
                <UsageTable rows=r.teams.clone() currency=c.clone() first="Team" testid="usage-teams" link_teams=true />
            </Card>
        }
    });
    let (kinds_currency, users_currency) = (c.clone(), c.clone());
    let users_total = r.users.len();
    let users: Vec<UsageRow> = r.users.iter().take(TOP_USERS).cloned().collect();
    let more_users = (users_total > TOP_USERS).then(|| {
        view! {
            <p class="hint">
                {format!("The {TOP_USERS} users with the highest cost, of {users_total}.")}
            </p>
        }
    });
    view! {
        {own}
        {period}
        <dl class="stat-cards" aria-label="Totals">
            <div class="stat">
                <dt>"GPU-hours allocated"</dt>
                <dd data-testid="usage-total-gpu-hours">{gpu_hours(t.gpu_ms)}</dd>
            </div>
            <div class="stat">
                <dt>"Active GPU-hours"</dt>
                <dd data-testid="usage-total-active">
                    {gpu_hours(t.active_gpu_ms)}
                    <span class="sub" data-testid="usage-efficiency">
                        {format!("{} % efficiency", t.efficiency_pct())}
                    </span>
                </dd>
            </div>
            <div class="stat">
                <dt>"Cost"</dt>
                <dd data-testid="usage-total-cost">{money(t.cost_minor, &c)}</dd>
            </div>
        </dl>
        <p class="hint">
            "Active: the GPU was busy (utilization at or above the threshold) while allocated. "
            "Efficiency is active over allocated GPU-hours."
        </p>
        <section class="card wide chart-card" aria-labelledby="cost-chart-title">
            <h2 id="cost-chart-title">"Cost per day"</h2>
            <CostChart days=r.days.clone() currency=c.clone() />
            <details class="chart-table">
                <summary>"Table"</summary>
                <DayTable days=r.days.clone() currency=c.clone() />
            </details>
            <a class="download" href=csv.clone() download rel="external">
                "Download CSV"
            </a>
        </section>
        <section class="card wide chart-card" aria-labelledby="gpu-chart-title">
            <h2 id="gpu-chart-title">"GPU-hours per day: allocated vs active"</h2>
            <GpuChart days=r.days.clone() />
            <details class="chart-table">
                <summary>"Table"</summary>
                <DayTable days=r.days.clone() currency=c.clone() />
            </details>
            <a class="download" href=csv download rel="external">
                "Download CSV"
            </a>
        </section>
        {teams}
        <div class="columns">
            <Card id="usage-kinds" title="By GPU kind">
                <UsageTable rows=r.kinds.clone() currency=kinds_currency first="GPU kind" testid="usage-kinds" link_teams=false />
            </Card>
            <Card id="usage-users" title="Top users">
                <UsageTable rows=users currency=users_currency first="User" testid="usage-users" link_teams=false />
                {more_users}
            </Card>
        </div>
    }
    .into_any()
}

/// The value gridlines and their labels, shared by both charts.
fn grid(axis: &chart::Axis, label: &dyn Fn(i64) -> String) -> impl IntoView + use<> {
    axis.ticks()
        .into_iter()
        .map(|v| {
            let y = chart::coord(axis.y(v));
            let x2 = chart::coord(chart::WIDTH - chart::RIGHT);
            view! {
                <g class="tick">
                    <line x1=chart::coord(chart::LEFT) x2=x2 y1=y.clone() y2=y.clone() />
                    <text x=chart::coord(chart::LEFT - 6.0) y=y dy="0.32em" text-anchor="end">
                        {label(v)}
                    </text>
                </g>
            }
        })
        .collect_view()
}

/// Day labels under the bars (every few days on long periods).
fn day_axis(days: &[UsageRow]) -> impl IntoView + use<> {
    let n = days.len();
    let y = chart::coord(chart::HEIGHT - chart::BOTTOM + 16.0);
    chart::labelled_days(n)
        .map(|i| {
            view! {
                <text class="day" x=chart::coord(chart::slot_center(i, n)) y=y.clone() text-anchor="middle">
                    {chart::day_label(&days[i].key)}
                </text>
            }
        })
        .collect_view()
}

#[component]
fn CostChart(days: Vec<UsageRow>, currency: String) -> impl IntoView {
    let n = days.len();
    let max = days.iter().map(|d| d.totals.cost_minor).max().unwrap_or(0);
    let axis = chart::Axis::new(max, 1);
    let total: i64 = days.iter().map(|d| d.totals.cost_minor).sum();
    let peak = days
        .iter()
        .max_by_key(|d| d.totals.cost_minor)
        .filter(|d| d.totals.cost_minor > 0)
        .map(|d| {
            format!(
                "; highest {} on {}",
                money(d.totals.cost_minor, &currency),
                chart::day_label(&d.key)
            )
        })
        .unwrap_or_default();
    let label = format!(
        "Cost per day over {n} days: {} in all{peak}.",
        money(total, &currency)
    );
    let c = currency.clone();
    let grid = grid(&axis, &|v| tessera_domain::billing::format_minor(v, &c));
    let bars = days
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let b = chart::bar(i, n, d.totals.cost_minor, &axis, 0.7);
            let title = format!(
                "{}: {}",
                chart::day_label(&d.key),
                money(d.totals.cost_minor, &currency)
            );
            view! { <g data-day=d.key.clone()>{bar_rect("bar cost", &b, title)}</g> }
        })
        .collect_view();
    let legend = view! {
        <span class="legend-item">
            <span class="swatch cost"></span>
            {format!("cost per day ({currency})")}
        </span>
    };
    day_chart(label, "cost-chart", grid, bars, day_axis(&days), legend)
}

#[component]
fn GpuChart(days: Vec<UsageRow>) -> impl IntoView {
    let n = days.len();
    let max = days
        .iter()
        .map(|d| d.totals.gpu_ms.max(d.totals.active_gpu_ms))
        .max()
        .unwrap_or(0);
    let axis = chart::Axis::new(max, CENTI_GPU_HOUR);
    let allocated: i64 = days.iter().map(|d| d.totals.gpu_ms).sum();
    let active: i64 = days.iter().map(|d| d.totals.active_gpu_ms).sum();
    let label = format!(
        "GPU-hours per day over {n} days: {} allocated, {} active in all.",
        gpu_hours(allocated),
        gpu_hours(active)
    );
    let grid = grid(&axis, &gpu_hours);
    let bars = days
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let t = &d.totals;
            let day = chart::day_label(&d.key);
            let a = chart::bar(i, n, t.gpu_ms, &axis, 0.8);
            let b = chart::bar(i, n, t.active_gpu_ms, &axis, 0.4);
            let allocated_title = format!("{day}: {} GPU-hours allocated", gpu_hours(t.gpu_ms));
            let active_title = format!(
                "{day}: {} GPU-hours active ({} %)",
                gpu_hours(t.active_gpu_ms),
                t.efficiency_pct()
            );
            view! {
                <g data-day=d.key.clone()>
                    {bar_rect("bar allocated", &a, allocated_title)}
                    {bar_rect("bar active", &b, active_title)}
                </g>
            }
        })
        .collect_view();
    let legend = view! {
        <span class="legend-item">
            <span class="swatch allocated"></span>
            "allocated GPU-hours"
        </span>
        <span class="legend-item">
            <span class="swatch active"></span>
            "active GPU-hours (GPU busy)"
        </span>
    };
    day_chart(label, "gpu-chart", grid, bars, day_axis(&days), legend)
}

/// One bar of a day chart, its value in its tooltip.
fn bar_rect(class: &'static str, b: &chart::Bar, title: String) -> impl IntoView {
    view! {
        <rect
            class=class
            x=chart::coord(b.x)
            y=chart::coord(b.y)
            width=chart::coord(b.width)
            height=chart::coord(b.height)
        >
            <title>{title}</title>
        </rect>
    }
}

/// A chart of days: its grid, bars and day axis, described by `label` to a screen reader,
/// and its legend.
fn day_chart(
    label: String,
    testid: &'static str,
    grid: impl IntoView,
    bars: impl IntoView,
    days: impl IntoView,
    legend: impl IntoView,
) -> impl IntoView {
    view! {
        <figure class="chart">
            <svg
                viewBox=format!("0 0 {} {}", chart::WIDTH, chart::HEIGHT)
                role="img"
                aria-label=label
                data-testid=testid
            >
                <g class="grid">{grid}</g>
                <g class="bars">{bars}</g>
                <g class="days">{days}</g>
            </svg>
            <figcaption class="legend">{legend}</figcaption>
        </figure>
    }
}

/// The charts' numbers, day by day.
#[component]
fn DayTable(days: Vec<UsageRow>, currency: String) -> impl IntoView {
    let rows = days
        .into_iter()
        .map(|d| {
            let t = d.totals;
            view! {
                <tr data-day=d.key.clone()>
                    <td>
                        <time datetime=d.key.clone()>{d.key.clone()}</time>
                    </td>
                    <td class="num">{gpu_hours(t.gpu_ms)}</td>
                    <td class="num">{gpu_hours(t.active_gpu_ms)}</td>
                    <td class="num">{format!("{} %", t.efficiency_pct())}</td>
                    <td class="num">{money(t.cost_minor, &currency)}</td>
                </tr>
            }
        })
        .collect_view();
    list_table(
        &Columns::unnamed(&["Day", "GPU-hours", "Active GPU-hours", "Efficiency", "Cost"])
            .class("list compact")
            .scoped(&[1, 2, 3, 4]),
        rows,
    )
}

/// Totals per kind, user or team.
#[component]
fn UsageTable(
    rows: Vec<UsageRow>,
    currency: String,
    first: &'static str,
    testid: &'static str,
    link_teams: bool,
) -> impl IntoView {
    if rows.is_empty() {
        return view! { <Empty>"Nothing in this period."</Empty> }.into_any();
    }
    let rows = rows
        .into_iter()
        .map(|r| {
            let t = r.totals;
            let name = if link_teams {
                view! { <a href=format!("/teams/{}", r.key)>{r.label.clone()}</a> }.into_any()
            } else {
                r.label.clone().into_any()
            };
            view! {
                <tr data-key=r.key.clone()>
                    <td>{name}</td>
                    <td class="num">{gpu_hours(t.gpu_ms)}</td>
                    <td class="num">{format!("{} %", t.efficiency_pct())}</td>
                    <td class="num">{money(t.cost_minor, &currency)}</td>
                </tr>
            }
        })
        .collect_view();
    view! {
        <table class="list compact" data-testid=testid>
            <thead>
                <tr>
                    <th scope="col">{first}</th>
                    <th scope="col" class="num">"GPU-hours"</th>
                    <th scope="col" class="num">"Efficiency"</th>
                    <th scope="col" class="num">"Cost"</th>
                </tr>
            </thead>
            <tbody>{rows}</tbody>
        </table>
    }
    .into_any()
}

/// Whether an error names a field of the filter form (shown there, not as a page error).
fn is_filter_error(e: &AppError) -> bool {
    matches!(e.field(), Some("from" | "to" | "team"))
}
