//! A team's monthly statement: what it used, kind by kind and user by user, what that cost
//! at list price and as billed, corrections, the total the ledger holds, and the budget.
//! For the team's admins and platform admins.

use super::billing::{alert_badge, used_meter};
use super::money;
use crate::api::{self, UiError};
use crate::components::{Authenticated, Columns, Empty, Loading, Problem, footed_table, now};
use chrono::{Datelike, NaiveDate, TimeDelta};
use leptos::prelude::*;
use leptos_router::hooks::{use_params_map, use_query_map};
use tessera_domain::billing::{Statement, StatementLine, gpu_hours, month_bounds, parse_month};

#[component]
pub fn StatementPage() -> impl IntoView {
    // Created here, outside `Authenticated`, like the nodes page (see the comment there).
    let params = use_params_map();
    let query = use_query_map();
    let key = Memo::new(move |_| {
        let id = params.read().get("id").unwrap_or_default();
        let month = query
            .read()
            .get("month")
            .map(|m| m.trim().to_owned())
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| now().format("%Y-%m").to_string());
        (id, month)
    });
    let statement = Resource::new(
        move || key.get(),
        |(id, month)| api::team_statement(id, month),
    );
    view! {
        <Authenticated>
            <StatementView key statement />
        </Authenticated>
    }
}

#[component]
fn StatementView(
    key: Memo<(String, String)>,
    statement: Resource<Result<Statement, UiError>>,
) -> impl IntoView {
    let team_href = move || format!("/teams/{}", key.read().0);
    view! {
        <a class="back" href=team_href>
            "← Team"
        </a>
        <Transition fallback=Loading>
            {move || Suspend::new(async move {
                match statement.await {
                    Ok(s) => view! { <StatementBody s /> }.into_any(),
                    Err(e) => {
                        view! {
                            <h1>"Statement"</h1>
                            <Problem
                                error=e.error
                                forbidden="Statements are for the team's admins and platform admins."
                            />
                        }
                            .into_any()
                    }
                }
            })}
        </Transition>
    }
}

/// The month before and after `first` (`YYYY-MM`).
fn neighbours(first: NaiveDate) -> (String, String) {
    let prev = (first - TimeDelta::days(1))
        .with_day(1)
        .unwrap_or(first)
        .format("%Y-%m")
        .to_string();
    let next = month_bounds(first).1.format("%Y-%m").to_string();
    (prev, next)
}

const STATEMENT_COLUMNS: &[&str] = &[
    "GPU kind",
    "User",
    "Allocations",
    "Hours",
    "GPU-hours",
    "List cost",
    "Billed cost",
];

#[component]
fn StatementBody(s: Statement) -> impl IntoView {
    let first = parse_month(&s.month).unwrap_or_else(|_| s.from.date_naive());
    let month_name = first.format("%B %Y").to_string();
    let (prev, next) = neighbours(first);
    let base = format!("/teams/{}/statement", s.team_id);
    let last = (s.to - TimeDelta::days(1)).format("%Y-%m-%d");
    let csv = format!(
        "/api/v1/exports/chargeback.csv?team={}&from={}&to={last}",
        s.team_id,
        s.from.format("%Y-%m-%d")
    );
    let c = s.currency.clone();
    let budget = match &s.budget {
        Some(b) => match b.monthly_minor {
            Some(m) => view! {
                <p class="budget-line" data-testid="statement-budget">
                    "Budget: "
                    <strong>{money(m, &b.currency)}</strong>
                    {format!(" a month{} · {} % used ", if b.hard { " (hard limit)" } else { "" }, b.used_pct)}
                    {used_meter(b.used_pct)}
                    " "
                    {alert_badge(b.alert)}
                </p>
            }
            .into_any(),
            None => ().into_any(),
        },
        None => view! {
            <p class="hint budget-line" data-testid="statement-budget">
                "No budget set."
            </p>
        }
        .into_any(),
    };
    let table = if s.lines.is_empty() && s.adjustments_minor == 0 {
        let text = format!("Nothing was billed to {} in {month_name}.", s.team_name);
        view! {
            <Empty>
                <p data-testid="statement-empty">
                    {text}
                </p>
                <p>
                    "Total: " <strong data-testid="statement-total">{money(s.total_minor, &c)}</strong>
                </p>
            </Empty>
        }
        .into_any()
    } else {
        let list_total: i64 = s.lines.iter().map(|l| l.list_minor).sum();
        let rows = s
            .lines
            .iter()
            .cloned()
            .map(|l| statement_row(l, &c))
            .collect_view();
        let adjustments = (s.adjustments_minor != 0).then(|| {
            view! {
                <tr class="adjustments" data-testid="statement-adjustments">
                    <th scope="row" colspan="6">
                        "Adjustments (reversed charges)"
                    </th>
                    <td class="num">{money(s.adjustments_minor, &c)}</td>
                </tr>
            }
        });
        view! {
            {footed_table(
                &Columns::new("statement-lines", STATEMENT_COLUMNS)
                    .class("list statement")
                    .scoped(&[2, 3, 4, 5, 6]),
                rows,
                Some(view! {
                    {adjustments}
                    <tr class="total">
                        <th scope="row" colspan="5">
                            "Total"
                        </th>
                        <td class="num hint">{money(list_total, &c)}</td>
                        <td class="num" data-testid="statement-total">
                            {money(s.total_minor, &c)}
                        </td>
                    </tr>
                }),
            )}
            <p class="hint">
                "Hours: wall-clock time the allocations were active. GPU-hours: that time times "
                "the share of a GPU (a 1g.10gb slice of an H100 is 1/7). Billed cost: list cost "
                "less the preemptible discount."
            </p>
        }
        .into_any()
    };
    view! {
        <h1>{format!("Statement — {} — {month_name}", s.team_name)}</h1>
        <nav class="month-nav" aria-label="Months">
            <a href=format!("{base}?month={prev}") rel="prev" data-testid="statement-prev">
                "← Previous month"
            </a>
            <a href=format!("{base}?month={next}") rel="next" data-testid="statement-next">
                "Next month →"
            </a>
        </nav>
        <section class="card wide" aria-label="Statement" data-testid="statement" data-month=s.month.clone()>
            <p class="hint">
                {format!(
                    "{} – {} (UTC), in {}.",
                    s.from.format("%b %-d, %Y"),
                    (s.to - TimeDelta::days(1)).format("%b %-d, %Y"),
                    s.currency,
                )}
            </p>
            {table}
            {budget}
            <p>
                <a class="download" href=csv download rel="external" data-testid="statement-csv">
                    "Download CSV"
                </a>
                <span class="hint">" — the chargeback export of this month, one row per allocation and hour."</span>
            </p>
        </section>
    }
}

fn statement_row(l: StatementLine, currency: &str) -> impl IntoView + use<> {
    view! {
        <tr data-testid="statement-line" data-kind=l.kind.clone()>
            <td>{l.kind_label.clone()}</td>
            <td>{l.username.clone()}</td>
            <td class="num">{l.allocations}</td>
            <td class="num">{gpu_hours(l.wall_ms)}</td>
            <td class="num">{gpu_hours(l.totals.gpu_ms)}</td>
            <td class="num">{money(l.list_minor, currency)}</td>
            <td class="num">{money(l.totals.cost_minor, currency)}</td>
        </tr>
    }
}
