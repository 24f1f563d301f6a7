//! Platform admins run billing here: the rate card (current, scheduled and past prices,
//! and a form to set one), every team's monthly budget and spend (and a form to set one),
//! the chargeback export, and links to each team's monthly statement.

use super::money;
use crate::api::{self, SaveBudget, SetRate, UiError};
use crate::components::{
    AdminOnly, Authenticated, Field, FieldInput, LoadedList, Loading, echoed, field_error,
    form_error, now, timestamp,
};
use crate::components::{Card, kind_options};
use crate::components::{Columns, list_table};
use crate::components::{TeamChoice, alert, load_teams};
use leptos::prelude::*;
use tessera_domain::billing::{BudgetView, RateView};
use tessera_domain::mig::Catalog;

#[component]
pub fn BillingPage() -> impl IntoView {
    // Created here, outside `Authenticated`, like the nodes page (see the comment there).
    let data = BillingData::new();
    view! {
        <Authenticated>
            <h1>"Billing"</h1>
            <AdminOnly>
                <p class="hint lead">
                    "Prices per GPU-hour, team budgets, statements and the chargeback export. "
                    "Allocations are metered hour by hour (UTC) and charged to their team's ledger."
                </p>
                <Card id="rates" title="Prices" wide=true hint=RATES_HINT>
                    <LoadedList list=data.rates empty=no_rates let:list>{rate_table(list)}</LoadedList>
                    <RateForm action=data.set_rate />
                </Card>
                <Card id="budgets" title="Team budgets this month" wide=true hint=BUDGETS_HINT>
                    <LoadedList list=data.budgets empty=no_budgets let:list>{budget_table(list)}</LoadedList>
                    <BudgetForm action=data.save_budget teams=data.teams />
                </Card>
                <div class="columns">
                    <ExportForm teams=data.teams />
                    <Statements teams=data.teams />
                </div>
            </AdminOnly>
        </Authenticated>
    }
}

/// What the billing page loads and the actions that change it.
#[derive(Clone, Copy)]
struct BillingData {
    set_rate: ServerAction<SetRate>,
    save_budget: ServerAction<SaveBudget>,
    rates: Resource<Result<Vec<RateView>, UiError>>,
    budgets: Resource<Result<Vec<BudgetView>, UiError>>,
    teams: Resource<Result<Vec<TeamChoice>, UiError>>,
}

impl BillingData {
    fn new() -> Self {
        let set_rate = ServerAction::<SetRate>::new();
        let save_budget = ServerAction::<SaveBudget>::new();
        let rates = Resource::new(move || set_rate.version().get(), |_| api::list_rates());
        let budgets = Resource::new(move || save_budget.version().get(), |_| api::list_budgets());
        let teams = Resource::new(|| (), |_| load_teams());
        BillingData {
            set_rate,
            save_budget,
            rates,
            budgets,
            teams,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Rates
// ---------------------------------------------------------------------------------------

const RATES_HINT: &str = concat!(
    "A price applies per GPU (or per MIG instance) and hour, from its start on. ",
    "A MIG profile without a price of its own costs the whole GPU's price pro rata by ",
    "compute slices: a 1g.10gb slice is 1/7 of an H100, a 3g.40gb 3/7. ",
    "Preemptible allocations get the discount."
);

/// Current, scheduled (starts later) or past (superseded).
fn rate_status(r: &RateView) -> (&'static str, &'static str, &'static str) {
    if r.current {
        ("Current", "badge ok", "current")
    } else if r.effective_from > now() {
        ("Scheduled", "badge warn", "scheduled")
    } else {
        ("Past", "badge muted", "past")
    }
}

fn no_rates() -> impl IntoView {
    view! {
        <p data-testid="no-rates">
            "No prices yet: GPU time is metered, but costs nothing until you set a price below."
        </p>
    }
}

/// The prices, per kind the latest start first.
fn rate_table(mut list: Vec<RateView>) -> impl IntoView {
    // Per kind, the latest start first: scheduled, then current, then history.
    list.sort_by(|a, b| {
        a.kind
            .cmp(&b.kind)
            .then(b.effective_from.cmp(&a.effective_from))
    });
    let rows = list
        .into_iter()
        .map(|r| {
            let (label, class, status) = rate_status(&r);
            view! {
                <tr data-testid="rate-row" data-kind=r.kind.clone() data-status=status>
                    <td>
                        {r.kind_label.clone()} <div class="hint">
                            <code>{r.kind.clone()}</code>
                        </div>
                    </td>
                    <td class="num">{format!("{} {}", r.price, r.currency)}</td>
                    <td class="num">{format!("{} %", r.preemptible_discount_pct)}</td>
                    <td class="num">{format!("+{} %", r.high_premium_pct)}</td>
                    <td>
                        <time datetime=r.effective_from.to_rfc3339()>
                            {timestamp(r.effective_from)}
                        </time>
                    </td>
                    <td>
                        <span class=class>{label}</span>
                    </td>
                    <td>{r.created_by.clone().unwrap_or_else(|| "—".to_owned())}</td>
                </tr>
            }
        })
        .collect_view();
    list_table(
        &Columns::new(
            "rates",
            &[
                "GPU kind",
                "Price per hour",
                "Preemptible discount",
                "High priority premium",
                "Effective from",
                "Status",
                "Set by",
            ],
        )
        .scoped(&[1, 2, 3]),
        rows,
    )
}

#[component]
fn RateForm(action: ServerAction<SetRate>) -> impl IntoView {
    let value = move || action.value().get();
    let echo_kind = untrack(echoed(value, "kind"));
    let from = echoed(value, "effective_from");
    let catalog = Catalog::builtin();
    let groups = catalog
        .models()
        .map(|m| {
            let model = m.name().to_owned();
            let options = kind_options(&catalog, &model)
                .into_iter()
                .map(|(v, label)| {
                    view! {
                        <option value=v.clone() selected=v == echo_kind>
                            {label}
                        </option>
                    }
                })
                .collect_view();
            view! { <optgroup label=model>{options}</optgroup> }
        })
        .collect_view();
    let saved = move || {
        action.value().get().and_then(Result::ok).map(|r| {
            view! {
                <div class="notice" role="status" data-testid="rate-saved">
                    {format!(
                        "Price set: {} at {} {} per hour from {}.",
                        r.kind_label,
                        r.price,
                        r.currency,
                        timestamp(r.effective_from),
                    )}
                </div>
            }
        })
    };
    view! {
        <h3 class="form-title">"Set a price"</h3>
        {saved}
        <ActionForm action=action attr:data-testid="rate-form" attr:class="rate-form" attr:novalidate=true>
            {form_error(value)}
            <div class="field-row">
                <div>
                    <Field result=value id="rate-kind" name="kind" label="GPU or MIG profile">
                        {groups}
                    </Field>
                </div>
                <div>
                    <Field result=value id="rate-price" name="price" label="Price per hour"
                        input=FieldInput::text().inputmode("decimal").placeholder("2.50").required() />
                    {field_error(value, "price_minor_per_hour")}
                </div>
            </div>
            <div class="field-row">
                <div>
                    <Field result=value id="rate-discount" name="preemptible_discount_pct"
                        label="Preemptible discount (%)" input=FieldInput::number("0").max("100")
                        default="0" />
                </div>
                <div>
                    <Field result=value id="rate-premium" name="high_premium_pct"
                        label="High priority premium (%)" input=FieldInput::number("0").max("1000")
                        default="0" />
                </div>
                <div>
                    <label for="rate-from">"Effective from (UTC)"</label>
                    <input
                        id="rate-from"
                        name="effective_from"
                        type="datetime-local"
                        step="3600"
                        aria-describedby="rate-from-hint"
                        value=from
                        prop:value=from
                    />
                    {field_error(value, "effective_from")}
                    <p class="hint" id="rate-from-hint">
                        "UTC, a full hour; hours already billed keep their price. Empty: the next full hour."
                    </p>
                </div>
            </div>
            <p class="hint">
                "In the portal's currency, per GPU or MIG instance and hour. A new price for a kind "
                "replaces its current one from the hour it takes effect."
            </p>
            <button type="submit" class="primary" disabled=move || action.pending().get()>
                "Set price"
            </button>
        </ActionForm>
    }
}

// ---------------------------------------------------------------------------------------
// Budgets
// ---------------------------------------------------------------------------------------

const BUDGETS_HINT: &str = concat!(
    "Budgets are per calendar month (UTC). Alerts at 50, 80 and 100 %. With a hard ",
    "limit, a request that would take the team beyond its budget waits for a platform admin."
);

/// The alert badge: 50 %, 80 % or 100 % reached.
pub(super) fn alert_badge(alert: Option<u8>) -> AnyView {
    match alert {
        Some(a) => {
            let class = match a {
                100.. => "badge danger",
                80.. => "badge warn",
                _ => "badge",
            };
            view! {
                <span class=class data-testid="budget-alert-badge" data-alert=a.to_string()>
                    {format!("{a} % reached")}
                </span>
            }
            .into_any()
        }
        None => view! { <span class="hint">"—"</span> }.into_any(),
    }
}

/// A small bar for a percentage (capped at 100 % wide).
pub(super) fn used_meter(pct: u32) -> impl IntoView {
    let width = pct.min(100);
    let class = match pct {
        100.. => "meter over",
        80.. => "meter high",
        _ => "meter",
    };
    view! {
        <span class=class aria-hidden="true">
            <span style=format!("width: {width}%")></span>
        </span>
    }
}

fn no_budgets() -> impl IntoView {
    view! { <p data-testid="no-budgets">"No team has a budget or any spend this month yet."</p> }
}

/// Each team's budget and spend this month.
fn budget_table(list: Vec<BudgetView>) -> impl IntoView {
    let rows = list
        .into_iter()
        .map(|b| {
            let budget = match b.monthly_minor {
                Some(m) => money(m, &b.currency),
                None => "none".to_owned(),
            };
            let used = match b.monthly_minor {
                Some(_) => view! {
                    <span class="used">
                        <span class="quota-numbers">{format!("{} %", b.used_pct)}</span>
                        {used_meter(b.used_pct)}
                    </span>
                }
                .into_any(),
                None => view! { <span class="hint">"—"</span> }.into_any(),
            };
            view! {
                <tr data-testid="budget-row" data-team=b.team_id.to_string()>
                    <td>
                        <a href=format!("/teams/{}", b.team_id)>{b.team_name.clone()}</a>
                    </td>
                    <td class="num">{budget}</td>
                    <td class="num">{money(b.spent_minor, &b.currency)}</td>
                    <td>{used}</td>
                    <td>{alert_badge(b.alert)}</td>
                    <td>{if b.hard { "yes" } else { "no" }}</td>
                    <td>
                        <a href=format!("/teams/{}/statement", b.team_id)>"Statement →"</a>
                    </td>
                </tr>
            }
        })
        .collect_view();
    view! {
        <table class="list" data-testid="budgets">
            <thead>
                <tr>
                    <th scope="col">"Team"</th>
                    <th scope="col" class="num">"Budget"</th>
                    <th scope="col" class="num">"Spent this month"</th>
                    <th scope="col">"Used"</th>
                    <th scope="col">"Alert"</th>
                    <th scope="col">"Hard limit"</th>
                    <th scope="col">
                        <span class="visually-hidden">"Statement"</span>
                    </th>
                </tr>
            </thead>
            <tbody>{rows}</tbody>
        </table>
    }
}

#[component]
fn BudgetForm(
    action: ServerAction<SaveBudget>,
    teams: Resource<Result<Vec<TeamChoice>, UiError>>,
) -> impl IntoView {
    let value = move || action.value().get();
    let saved = move || {
        action.value().get().and_then(Result::ok).map(|b| {
            let text = match b.monthly_minor {
                Some(m) => format!(
                    "Budget for {} saved: {} a month{}.",
                    b.team_name,
                    money(m, &b.currency),
                    if b.hard { ", hard limit" } else { "" }
                ),
                None => format!("Budget for {} removed.", b.team_name),
            };
            view! {
                <div class="notice" role="status" data-testid="budget-saved">
                    {text}
                </div>
            }
        })
    };
    let team_select = move || {
        Suspend::new(async move {
            match teams.await {
                Ok(list) => {
                    let options = list
                        .into_iter()
                        .map(|t| {
                            let label = if t.archived {
                                format!("{} (archived)", t.name)
                            } else {
                                t.name
                            };
                            view! { <option value=t.id>{label}</option> }
                        })
                        .collect_view();
                    view! {
                        <select id="budget-team" name="team_id" required>
                            {options}
                        </select>
                    }
                    .into_any()
                }
                Err(e) => alert(format!("Teams could not be loaded: {}", e.error)),
            }
        })
    };
    view! {
        <h3 class="form-title">"Set a team's budget"</h3>
        {saved}
        <ActionForm action=action attr:data-testid="budget-form" attr:class="budget-form" attr:novalidate=true>
            {form_error(value)}
            <div class="field-row">
                <div>
                    <label for="budget-team">"Team"</label>
                    <Transition fallback=Loading>{team_select}</Transition>
                    {field_error(value, "team_id")}
                </div>
                <div>
                    <Field result=value id="budget-amount" name="amount" label="Monthly budget"
                        input=FieldInput::text().inputmode("decimal").placeholder("500.00") />
                </div>
            </div>
            <label class="check">
                <input type="checkbox" name="hard" value="on" />
                <span>
                    "Hard limit"
                    <span class="hint">
                        " — requests that would go beyond it wait for a platform admin's approval"
                    </span>
                </span>
            </label>
            <p class="hint">"Empty amount: removes the team's budget. Saving again replaces it."</p>
            <button type="submit" class="primary" disabled=move || action.pending().get()>
                "Save budget"
            </button>
        </ActionForm>
    }
}

// ---------------------------------------------------------------------------------------
// Export and statements
// ---------------------------------------------------------------------------------------

/// Team options with "All teams" first, for the export form.
fn team_options(list: Vec<TeamChoice>) -> impl IntoView {
    let options = list
        .into_iter()
        .map(|t| view! { <option value=t.id>{t.name}</option> })
        .collect_view();
    view! {
        <option value="">"All teams"</option>
        {options}
    }
}

const EXPORT_HINT: &str = concat!(
    "A CSV with FinOps FOCUS-aligned columns (BilledCost, ListCost, ConsumedQuantity ",
    "in GPU-hours, ChargePeriodStart, SubAccountName …): one row per allocation and ",
    "hour; its billed total equals the ledger's."
);

/// A plain GET form to the CSV export (a download, not a page: the router stays out).
#[component]
fn ExportForm(teams: Resource<Result<Vec<TeamChoice>, UiError>>) -> impl IntoView {
    let select = move || {
        Suspend::new(async move {
            let list = teams.await.unwrap_or_default();
            view! {
                <select id="export-team" name="team">
                    {team_options(list)}
                </select>
            }
        })
    };
    view! {
        <Card id="export" title="Chargeback export" hint=EXPORT_HINT>
            <form method="get" action="/api/v1/exports/chargeback.csv" data-testid="export-form">
                <label for="export-team">"Team"</label>
                <Transition fallback=Loading>{select}</Transition>
                <div class="field-row">
                    <div>
                        <label for="export-from">"From"</label>
                        <input id="export-from" name="from" type="date" />
                    </div>
                    <div>
                        <label for="export-to">"To"</label>
                        <input id="export-to" name="to" type="date" />
                    </div>
                </div>
                <p class="hint">"Both days included (UTC). Empty dates: this month so far."</p>
                <button type="submit" class="primary">
                    "Download CSV"
                </button>
            </form>
        </Card>
    }
}

/// Every team's monthly statement.
#[component]
fn Statements(teams: Resource<Result<Vec<TeamChoice>, UiError>>) -> impl IntoView {
    view! {
        <Card id="statements" title="Statements" hint="What each team owes for a month, line by line.">
            <LoadedList list=teams empty=|| "No teams yet." let:list>
                <ul class="link-list" data-testid="statement-links">
                    {list
                        .into_iter()
                        .map(|t| {
                            view! {
                                <li>
                                    <a href=format!("/teams/{}/statement", t.id)>{t.name}</a>
                                    {t
                                        .archived
                                        .then(|| {
                                            view! { " " <span class="badge muted">"archived"</span> }
                                        })}
                                </li>
                            }
                        })
                        .collect_view()}
                </ul>
            </LoadedList>
        </Card>
    }
}
