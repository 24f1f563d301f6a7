//! Platform admins read the audit log: who requested, approved, denied, released or
//! extended what, and who changed which quota, newest first, filtered by action.

use crate::api::{self, UiError};
use crate::components::Card;
use crate::components::{AdminOnly, Authenticated, Columns, PAGE_SIZE, paged_table, timestamp};
use leptos::prelude::*;
use leptos_router::components::Form;
use leptos_router::hooks::use_query_map;
use tessera_domain::audit::{AuditAction, AuditEntryView};
use tessera_domain::tenancy::{Page, PageRequest};

/// The action filter's choices: query value, label. `all` asks for every action; the
/// others are every [`AuditAction`] there is.
fn action_filters() -> impl Iterator<Item = (&'static str, &'static str)> {
    std::iter::once(("all", "All actions"))
        .chain(AuditAction::ALL.iter().map(|a| (a.as_str(), a.as_str())))
}

#[component]
pub fn AuditPage() -> impl IntoView {
    // Created here, outside `Authenticated`, like the nodes page (see the comment there).
    let filter = use_filter();
    let entries = Resource::new(
        move || filter.get(),
        |f| api::audit_log(f.api_action(), PageRequest::new(f.offset, PAGE_SIZE)),
    );
    view! {
        <Authenticated>
            <h1>"Audit log"</h1>
            <AdminOnly>
                <AuditLog filter entries />
            </AdminOnly>
        </Authenticated>
    }
}

/// The log's filter, from the address: `?action=…&offset=…`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Filter {
    action: String,
    offset: u32,
}

impl Filter {
    /// The `action` argument of `audit_log`: empty for every action.
    fn api_action(&self) -> String {
        if self.action == "all" {
            String::new()
        } else {
            self.action.clone()
        }
    }

    /// This filter's address at another offset.
    fn href(&self, offset: u32) -> String {
        format!("/admin/audit?action={}&offset={offset}", self.action)
    }
}

fn use_filter() -> Memo<Filter> {
    let query = use_query_map();
    Memo::new(move |_| {
        let q = query.read();
        let action = q
            .get("action")
            .filter(|a| action_filters().any(|(v, _)| v == a))
            .unwrap_or_else(|| "all".to_owned());
        let offset = q.get("offset").and_then(|v| v.parse().ok()).unwrap_or(0);
        Filter { action, offset }
    })
}

#[component]
fn AuditLog(
    filter: Memo<Filter>,
    entries: Resource<Result<Page<AuditEntryView>, UiError>>,
) -> impl IntoView {
    view! {
        <Card id="audit" title="Entries" wide=true>
            <FilterForm filter />
            {paged_table(
                entries,
                move |offset| filter.get_untracked().href(offset),
                Columns::new("audit", &["Time", "Who", "Action", "Object", "Change"])
                    .class("list audit"),
                move || {
                    if filter.get_untracked().action == "all" {
                        "Nothing has been recorded yet."
                    } else {
                        "No entries for this action."
                    }
                    .into_any()
                },
                audit_row,
            )}
        </Card>
    }
}

/// The action as a GET form: works without JavaScript, navigates in place with it.
#[component]
fn FilterForm(filter: Memo<Filter>) -> impl IntoView {
    let current = filter.get_untracked();
    let options = action_filters()
        .map(|(v, label)| {
            view! {
                <option value=v selected=current.action == v>
                    {label}
                </option>
            }
        })
        .collect_view();
    view! {
        <Form method="get" action="/admin/audit" attr:class="filters">
            <label for="filter-action">"Action"</label>
            <select id="filter-action" name="action">
                {options}
            </select>
            <button type="submit">"Show"</button>
        </Form>
    }
}

fn audit_row(e: AuditEntryView) -> impl IntoView {
    let object = if e.object_type == "allocation" {
        view! {
            "allocation "
            <a href=format!("/allocations/{}", e.object_id)>
                <code class="uuid">{e.object_id.clone()}</code>
            </a>
        }
        .into_any()
    } else {
        view! {
            {format!("{} ", e.object_type)}
            <code class="uuid">{e.object_id.clone()}</code>
        }
        .into_any()
    };
    let change = match (e.before, e.after) {
        (None, None) => "—".into_any(),
        (before, after) => {
            let side = |s: Option<String>| s.unwrap_or_else(|| "—".to_owned());
            view! {
                <code class="audit-change">
                    {format!("{} → {}", side(before), side(after))}
                </code>
            }
            .into_any()
        }
    };
    view! {
        <tr data-testid="audit-row" data-action=e.action.clone() data-id=e.id.to_string()>
            <td>
                <time datetime=e.at.to_rfc3339()>{timestamp(e.at)}</time>
            </td>
            <td>{e.actor.unwrap_or_else(|| "system".to_owned())}</td>
            <td>
                <code>{e.action.clone()}</code>
            </td>
            <td>{object}</td>
            <td>{change}</td>
        </tr>
    }
}
