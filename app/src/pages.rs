//! One component per page.

mod account;
mod allocations;
mod audit;
mod billing;
mod dashboard;
mod join_tokens;
mod login;
mod nodes;
mod queue;
mod statement;
mod teams;
mod usage;
mod users;
mod workloads;

pub use account::AccountPage;
pub use allocations::{AllocationPage, AllocationsPage};
pub use audit::AuditPage;
pub use billing::BillingPage;
pub use dashboard::DashboardPage;
pub use join_tokens::JoinTokensPage;
pub use login::LoginPage;
pub use nodes::NodesPage;
pub use queue::QueuePage;
pub use statement::StatementPage;
pub use teams::{TeamPage, TeamsPage};
pub use usage::UsagePage;
pub use users::UsersPage;
pub use workloads::{JobsPage, NotebooksPage, WorkloadPage};

use leptos::prelude::*;
use tessera_domain::billing::format_minor;

/// An amount in minor units with its currency: `12.34 USD`.
fn money(minor: i64, currency: &str) -> String {
    format!("{} {currency}", format_minor(minor, currency))
}

#[component]
pub fn NotFound() -> impl IntoView {
    #[cfg(feature = "ssr")]
    if let Some(res) = use_context::<leptos_axum::ResponseOptions>() {
        res.set_status(http::StatusCode::NOT_FOUND);
    }
    view! {
        <main class="content narrow">
            <h1>"Page not found"</h1>
            <p>
                "There is nothing at this address. " <a href="/">"Back to the dashboard"</a>
            </p>
        </main>
    }
}
