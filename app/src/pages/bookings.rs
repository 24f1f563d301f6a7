//! Bookings (docs/operations.md): the calendar of capacity teams hold, one week (Monday to
//! Sunday, UTC) at a time and optionally one GPU model, and the form with which a team
//! admin or a platform admin books. Another team's booking shows only that the capacity
//! is taken. A booking's own team admins and platform admins may cancel it.

use crate::api::{self, BookCapacity, CancelBooking, UiError};
use crate::components::Card;
use crate::components::{
    Authenticated, ConfirmSubmit, Empty, Field, FieldInput, Loading, Problem, alert, echoed,
    error_of, form_error, kind_options, now,
};
use chrono::{DateTime, Datelike, Days, NaiveDate, NaiveTime, Utc};
use leptos::prelude::*;
use leptos_router::components::Form;
use leptos_router::hooks::use_query_map;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use tessera_domain::booking::BookingView;
use tessera_domain::mig::Catalog;
use tessera_domain::tenancy::{PageRequest, TeamRole};

/// The week and model the calendar shows, from `?week=YYYY-MM-DD&model=`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Shown {
    /// The Monday of the week (any day given in `week` moves to its Monday).
    monday: NaiveDate,
    /// A GPU model, or empty for all.
    model: String,
}

impl Shown {
    fn from(&self) -> DateTime<Utc> {
        self.monday.and_time(NaiveTime::MIN).and_utc()
    }

    fn to(&self) -> DateTime<Utc> {
        self.from() + chrono::Duration::days(7)
    }

    /// This page for the week starting `monday`, keeping the model.
    fn href(&self, monday: NaiveDate) -> String {
        let mut href = format!("/bookings?week={monday}");
        if !self.model.is_empty() {
            href.push_str("&model=");
            href.push_str(&urlencoding(&self.model));
        }
        href
    }
}

/// The query value for a model name (names are letters, digits, `-` and `.`; anything else
/// is percent-encoded).
fn urlencoding(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The Monday of the week `day` is in.
fn monday_of(day: NaiveDate) -> NaiveDate {
    day - Days::new(u64::from(day.weekday().num_days_from_monday()))
}

fn use_shown() -> Memo<Shown> {
    let query = use_query_map();
    Memo::new(move |_| {
        let q = query.read();
        let day = q
            .get("week")
            .and_then(|w| NaiveDate::parse_from_str(w.trim(), "%Y-%m-%d").ok())
            .unwrap_or_else(|| now().date_naive());
        Shown {
            monday: monday_of(day),
            model: q.get("model").unwrap_or_default().trim().to_owned(),
        }
    })
}

/// What the page offers besides the calendar: the models there is capacity of, and the
/// teams the caller may book for and cancel in.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Options {
    /// GPU models of the catalog that registered nodes have, by name.
    models: Vec<String>,
    /// Teams the caller administers (every live team for a platform admin): `(id, name)`.
    teams: Vec<(String, String)>,
    platform_admin: bool,
}

async fn load_options() -> Result<Options, UiError> {
    let me = api::current_user().await?;
    let platform_admin = me.as_ref().is_some_and(|m| m.is_admin);
    let teams = api::list_teams(PageRequest::new(0, PageRequest::MAX_LIMIT))
        .await?
        .items
        .into_iter()
        .filter(|t| !t.archived && (platform_admin || t.my_role == Some(TeamRole::TeamAdmin)))
        .map(|t| (t.id.to_string(), t.name))
        .collect();
    let catalog = Catalog::builtin();
    let models = api::get_cluster_summary()
        .await?
        .gpus_by_model
        .into_keys()
        .filter(|m| catalog.get(m).is_some())
        .collect();
    Ok(Options {
        models,
        teams,
        platform_admin,
    })
}

async fn load_week(shown: Shown) -> Result<Vec<BookingView>, UiError> {
    api::list_bookings(
        shown.from().to_rfc3339(),
        shown.to().to_rfc3339(),
        shown.model,
    )
    .await
}

#[component]
pub fn BookingsPage() -> impl IntoView {
    // Created here, outside `Authenticated`, like the other pages' resources.
    let shown = use_shown();
    let book = ServerAction::<BookCapacity>::new();
    let cancel = ServerAction::<CancelBooking>::new();
    let options = Resource::new(|| (), |_| load_options());
    let week = Resource::new(
        move || (shown.get(), book.version().get(), cancel.version().get()),
        |(s, ..)| load_week(s),
    );
    view! {
        <Authenticated>
            <h1>"Bookings"</h1>
            <section class="card wide" aria-labelledby="calendar-title">
                <h2 id="calendar-title">
                    {move || {
                        let s = shown.get();
                        let sunday = s.monday + Days::new(6);
                        format!(
                            "Week of {} to {} (UTC)",
                            s.monday.format("%a %-d %b %Y"),
                            sunday.format("%a %-d %b"),
                        )
                    }}
                </h2>
                <WeekNav shown />
                <Transition fallback=Loading>
                    {move || Suspend::new(async move {
                        let opts = options.await;
                        let list = week.await;
                        match (opts, list) {
                            (Ok(o), Ok(items)) => {
                                view! {
                                    <ModelFilter shown models=o.models.clone() />
                                    <Calendar shown=shown.get_untracked() items options=o cancel />
                                }
                                    .into_any()
                            }
                            (Err(e), _) | (_, Err(e)) => {
                                view! { <Problem error=e.error /> }.into_any()
                            }
                        }
                    })}
                </Transition>
            </section>
            <Transition fallback=Loading>
                {move || Suspend::new(async move {
                    match options.await {
                        Ok(o) if !o.teams.is_empty() => {
                            view! { <BookSection options=o action=book /> }.into_any()
                        }
                        Ok(_) => {
                            view! {
                                <p class="hint">
                                    "Team admins and platform admins book capacity for their teams."
                                </p>
                            }
                                .into_any()
                        }
                        Err(e) => view! { <Problem error=e.error /> }.into_any(),
                    }
                })}
            </Transition>
        </Authenticated>
    }
}

/// Previous, this and next week.
#[component]
fn WeekNav(shown: Memo<Shown>) -> impl IntoView {
    let link = move |weeks: i64| {
        let s = shown.get();
        let monday = match weeks {
            0 => monday_of(now().date_naive()),
            n if n < 0 => s.monday - Days::new(7),
            _ => s.monday + Days::new(7),
        };
        s.href(monday)
    };
    view! {
        <nav class="buttons week-nav" aria-label="Weeks">
            <a href=move || link(-1) data-testid="week-prev">
                "← Previous week"
            </a>
            <a href=move || link(0) data-testid="week-this">
                "This week"
            </a>
            <a href=move || link(1) data-testid="week-next">
                "Next week →"
            </a>
        </nav>
    }
}

/// The model select (a GET form: it works without the wasm bundle).
#[component]
fn ModelFilter(shown: Memo<Shown>, models: Vec<String>) -> impl IntoView {
    let current = shown.get_untracked();
    let mut models = models;
    if !current.model.is_empty() && !models.contains(&current.model) {
        models.push(current.model.clone());
    }
    let options = models
        .into_iter()
        .map(|m| {
            let selected = m == current.model;
            view! {
                <option value=m.clone() selected=selected>
                    {m.clone()}
                </option>
            }
        })
        .collect_view();
    view! {
        <Form method="get" action="/bookings" attr:class="filters">
            <input type="hidden" name="week" value=current.monday.to_string() />
            <label for="filter-model">"GPU model"</label>
            <select id="filter-model" name="model">
                <option value="" selected=current.model.is_empty()>
                    "All models"
                </option>
                {options}
            </select>
            <button type="submit">"Show"</button>
        </Form>
    }
}

/// The part of `[start, end)` that falls on `day`, as `HH:MM–HH:MM` (`24:00` for a range
/// that runs past midnight); `None` when it does not touch that day.
fn range_on(day: NaiveDate, start: DateTime<Utc>, end: DateTime<Utc>) -> Option<String> {
    let day_start = day.and_time(NaiveTime::MIN).and_utc();
    let day_end = day_start + chrono::Duration::days(1);
    if start >= day_end || end <= day_start {
        return None;
    }
    let from = start.max(day_start).format("%H:%M").to_string();
    let to = if end >= day_end {
        "24:00".to_owned()
    } else {
        end.format("%H:%M").to_string()
    };
    Some(format!("{from}–{to}"))
}

fn state_class(state: &str) -> &'static str {
    match state {
        "started" => "badge ok",
        "booked" => "badge warn",
        _ => "badge muted",
    }
}

/// The week as a table: one column per day, each booking on every day it covers.
#[component]
fn Calendar(
    shown: Shown,
    items: Vec<BookingView>,
    options: Options,
    cancel: ServerAction<CancelBooking>,
) -> impl IntoView {
    let days: Vec<NaiveDate> = (0..7).map(|i| shown.monday + Days::new(i)).collect();
    let cancel_error = move || {
        error_of(cancel.value().get()).map(|e| {
            view! {
                <div class="form-error" role="alert" data-testid="cancel-error">
                    {e.error.to_string()}
                </div>
            }
        })
    };
    if items.is_empty() {
        return view! {
            {cancel_error}
            <Empty>"Nothing booked this week."</Empty>
        }
        .into_any();
    }
    let admin_of: BTreeSet<String> = options.teams.iter().map(|(id, _)| id.clone()).collect();
    let may_cancel = |b: &BookingView| {
        matches!(b.state.as_str(), "booked" | "started")
            && b.id.is_some()
            && (options.platform_admin
                || b.team_id.is_some_and(|t| admin_of.contains(&t.to_string())))
    };
    let heads = days
        .iter()
        .map(|d| {
            view! {
                <th scope="col">
                    <time datetime=d.to_string()>{d.format("%a %-d %b").to_string()}</time>
                </th>
            }
        })
        .collect_view();
    let cells = days
        .iter()
        .map(|&day| {
            let entries = items
                .iter()
                .filter_map(|b| {
                    let range = range_on(day, b.starts_at, b.ends_at)?;
                    // Its cancel button goes on the first day of it the week shows.
                    let first = b.starts_at.date_naive().max(shown.monday) == day;
                    let button = (first && may_cancel(b))
                        .then(|| b.id.map(|id| cancel_form(id.to_string(), b, cancel)))
                        .flatten();
                    Some(entry(b, range, button))
                })
                .collect_view();
            view! {
                <td>
                    <ul class="bookings-day">{entries}</ul>
                </td>
            }
        })
        .collect_view();
    view! {
        {cancel_error}
        <div class="table-scroll">
            <table class="list calendar" data-testid="booking-calendar">
                <thead>
                    <tr>{heads}</tr>
                </thead>
                <tbody>
                    <tr>{cells}</tr>
                </tbody>
            </table>
        </div>
    }
    .into_any()
}

/// One booking on one day.
fn entry(b: &BookingView, range: String, button: Option<AnyView>) -> impl IntoView + use<> {
    let team = b
        .team_name
        .clone()
        .unwrap_or_else(|| "another team".to_owned());
    let what = format!("{} × {}", b.count, b.kind);
    view! {
        <li
            class="booking"
            data-testid="booking"
            data-id=b.id.map(|i| i.to_string()).unwrap_or_default()
            data-state=b.state.clone()
        >
            <span class="booking-time">{range}</span>
            " "
            <span class="booking-what">{what}</span>
            <br />
            <span class="booking-team">{team}</span>
            " "
            <span class=state_class(&b.state) data-testid="booking-state">
                {b.state.clone()}
            </span>
            {(!b.purpose.is_empty())
                .then(|| view! { <span class="hint booking-purpose">{b.purpose.clone()}</span> })}
            {button}
        </li>
    }
}

/// A booking's cancel button: it asks first once hydrated (a native confirmation); without
/// the wasm bundle it posts the form directly.
fn cancel_form(id: String, b: &BookingView, action: ServerAction<CancelBooking>) -> AnyView {
    let question = format!(
        "Cancel this booking of {} × {} ({} to {} UTC)? The capacity is free for others again{}.",
        b.count,
        b.kind,
        b.starts_at.format("%a %-d %b %H:%M"),
        b.ends_at.format("%a %-d %b %H:%M"),
        if b.state == "started" {
            " and its allocation is released"
        } else {
            ""
        },
    );
    view! {
        <ActionForm action=action attr:class="row-form">
            <input type="hidden" name="id" value=id />
            <ConfirmSubmit question class="danger small" testid="cancel-booking" pending=action.pending()>
                "Cancel"
            </ConfirmSubmit>
        </ActionForm>
    }
    .into_any()
}

/// The form's kind choices: every kind of every model there is capacity of, grouped by model.
fn kind_groups(models: &[String], echo: &str) -> impl IntoView + use<> {
    let catalog = Catalog::builtin();
    models
        .iter()
        .map(|model| {
            let options = kind_options(&catalog, model)
                .into_iter()
                .map(|(v, label)| {
                    let selected = v == echo;
                    view! {
                        <option value=v selected=selected>
                            {label}
                        </option>
                    }
                })
                .collect_view();
            view! { <optgroup label=model.clone()>{options}</optgroup> }
        })
        .collect_view()
}

#[component]
fn BookSection(options: Options, action: ServerAction<BookCapacity>) -> impl IntoView {
    let value = move || action.value().get();
    let echo_team = untrack(echoed(value, "team_id"));
    let echo_kind = untrack(echoed(value, "kind"));
    let teams = options
        .teams
        .iter()
        .map(|(id, name)| {
            view! {
                <option value=id.clone() selected=*id == echo_team>
                    {name.clone()}
                </option>
            }
        })
        .collect_view();
    let no_models = options.models.is_empty();
    let kinds = kind_groups(&options.models, &echo_kind);
    let done = move || {
        value().and_then(Result::ok).map(|b| {
            view! {
                <p class="notice ok" role="status" data-testid="booked">
                    {format!(
                        "Booked {} × {} for {} from {} to {} UTC.",
                        b.count,
                        b.kind,
                        b.team_name.unwrap_or_default(),
                        b.starts_at.format("%a %-d %b %H:%M"),
                        b.ends_at.format("%a %-d %b %H:%M"),
                    )}
                </p>
            }
        })
    };
    view! {
        <Card id="book" title="Book capacity">
            {no_models
                .then(|| alert("No GPU model has registered capacity yet: there is nothing to book."))}
            {done}
            <ActionForm action=action attr:data-testid="book-form" attr:novalidate=true>
                {form_error(value)}
                <div class="field-row">
                    <div>
                        <Field result=value id="book-team" name="team_id" label="Team">
                            {teams}
                        </Field>
                    </div>
                    <div>
                        <Field result=value id="book-kind" name="kind" label="GPU or MIG slice"
                            input=FieldInput::PLAIN.required()>
                            {kinds}
                        </Field>
                    </div>
                </div>
                <div class="field-row">
                    <div>
                        <Field result=value id="book-count" name="count" label="How many"
                            input=FieldInput::number("1").placeholder("1") />
                    </div>
                </div>
                <div class="field-row">
                    <div>
                        <Field result=value id="book-start" name="starts_at" label="Start (UTC)"
                            input=FieldInput::of("datetime-local").required() />
                    </div>
                    <div>
                        <Field result=value id="book-end" name="ends_at" label="End (UTC)"
                            input=FieldInput::of("datetime-local").required() />
                    </div>
                </div>
                <Field result=value id="book-purpose" name="purpose" label="Purpose"
                    input=FieldInput::lines("2").maxlength("500").placeholder("What it is for (optional)") />
                <p class="hint">
                    "Times are UTC. The booking is admitted now against the team's quota for \
                     that window and the capacity other bookings hold; at its start the \
                     capacity is there, and work borrowing it is warned and preempted in time."
                </p>
                <button type="submit" class="primary" disabled=move || action.pending().get()>
                    {move || if action.pending().get() { "Booking…" } else { "Book" }}
                </button>
            </ActionForm>
        </Card>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s)
            .expect("a date")
            .with_timezone(&Utc)
    }

    #[test]
    fn a_day_in_the_week_moves_to_its_monday() {
        let d = |s| NaiveDate::parse_from_str(s, "%Y-%m-%d").expect("a date");
        assert_eq!(monday_of(d("2026-11-27")), d("2026-11-23"));
        assert_eq!(monday_of(d("2026-11-23")), d("2026-11-23"));
        assert_eq!(monday_of(d("2026-11-29")), d("2026-11-23"));
    }

    #[test]
    fn a_multi_day_booking_shows_its_part_on_each_day() {
        let d = |s| NaiveDate::parse_from_str(s, "%Y-%m-%d").expect("a date");
        let (from, to) = (t("2026-11-23T22:30:00Z"), t("2026-11-25T01:15:00Z"));
        assert_eq!(range_on(d("2026-11-22"), from, to), None);
        assert_eq!(
            range_on(d("2026-11-23"), from, to).as_deref(),
            Some("22:30–24:00")
        );
        assert_eq!(
            range_on(d("2026-11-24"), from, to).as_deref(),
            Some("00:00–24:00")
        );
        assert_eq!(
            range_on(d("2026-11-25"), from, to).as_deref(),
            Some("00:00–01:15")
        );
        // Ending at midnight does not touch the next day.
        let midnight = t("2026-11-24T00:00:00Z");
        assert_eq!(range_on(d("2026-11-24"), from, midnight), None);
    }

    #[test]
    fn week_links_keep_the_model() {
        let s = Shown {
            monday: NaiveDate::parse_from_str("2026-11-23", "%Y-%m-%d").expect("a date"),
            model: "H100-80GB".into(),
        };
        assert_eq!(
            s.href(s.monday + Days::new(7)),
            "/bookings?week=2026-11-30&model=H100-80GB"
        );
        assert_eq!(s.to() - s.from(), chrono::Duration::days(7));
    }
}
