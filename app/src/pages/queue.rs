//! Platform admins see every team's pending allocations, grouped by model in queue order,
//! reloaded while open.

use super::allocations::{StateBadge, position_text};
use crate::api::{self, UiError};
use crate::components::Card;
use crate::components::{
    AdminOnly, Authenticated, Columns, PAGE_SIZE, When, at, paged_table, use_offset,
};
use crate::components::{Topic, refresher};
use leptos::prelude::*;
use std::time::Duration;
use tessera_domain::alloc::AllocationView;
use tessera_domain::tenancy::{Page, PageRequest};

/// How often a hydrated queue page reloads, like the allocations list.
const QUEUE_EVERY: Duration = Duration::from_secs(5);

#[component]
pub fn QueuePage() -> impl IntoView {
    // Created here, outside `Authenticated`, like the nodes page (see the comment there).
    let offset = use_offset();
    let tick = refresher(&[Topic::Work], QUEUE_EVERY, |streaming| !streaming);
    let queue = Resource::new(
        move || (offset.get(), tick.get()),
        |(offset, _)| load_queue(offset),
    );
    view! {
        <Authenticated>
            <h1>"Queue"</h1>
            <AdminOnly>
                <Card id="queue" title="Pending allocations, all teams" wide=true hint="Sorted by model, then by place in that model's queue (this page only).">
                    {paged_table(
                queue,
                at("/admin/queue"),
                Columns::new("queue", &["Kind", "Team", "User", "State", "Position", "Reason", "ETA", "Age", ""]),
                        || "Nothing is waiting.".into_any(),
                        queue_row,
                    )}
                </Card>
            </AdminOnly>
        </Authenticated>
    }
}

/// The model part of a kind string (`H100-80GB:1g.10gb` → `H100-80GB`).
fn model_of(kind: &str) -> &str {
    kind.split(':').next().unwrap_or(kind)
}

/// One page of pending allocations, sorted by model then queue position (none last).
async fn load_queue(offset: u32) -> Result<Page<AllocationView>, UiError> {
    let mut page = api::list_allocations(
        String::new(),
        "pending".to_owned(),
        false,
        PageRequest::new(offset, PAGE_SIZE),
    )
    .await?;
    page.items.sort_by(|a, b| {
        let position = |x: &AllocationView| {
            x.pending
                .as_ref()
                .and_then(|p| p.position)
                .unwrap_or(u32::MAX)
        };
        model_of(&a.kind)
            .cmp(model_of(&b.kind))
            .then(position(a).cmp(&position(b)))
            .then(a.created_at.cmp(&b.created_at))
    });
    Ok(page)
}

fn queue_row(a: AllocationView) -> impl IntoView {
    let href = format!("/allocations/{}", a.id);
    let (position, reason, eta) = match &a.pending {
        Some(p) => (
            position_text(p, a.state),
            p.reason.clone(),
            match p.eta {
                Some(t) => view! { <When t /> }.into_any(),
                None => "unknown".into_any(),
            },
        ),
        None => ("—".to_owned(), String::new(), "unknown".into_any()),
    };
    view! {
        <tr
            data-testid="queue-row"
            data-state=a.state.as_str()
            data-id=a.id.to_string()
            data-model=model_of(&a.kind).to_owned()
        >
            <td>
                {a.kind_label.clone()}
                {(a.count > 1).then(|| format!(" × {}", a.count))}
            </td>
            <td>{a.team_name.clone()}</td>
            <td>{a.username.clone()}</td>
            <td>
                <StateBadge state=a.state />
            </td>
            <td class="queue-pos">{position}</td>
            <td class="hint">{reason}</td>
            <td>{eta}</td>
            <td>
                <When t=a.created_at />
            </td>
            <td>
                <a href=href>"Details →"</a>
            </td>
        </tr>
    }
}
