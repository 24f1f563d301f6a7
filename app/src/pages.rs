//! One component per page.

mod account;
mod allocations;
mod audit;
mod billing;
mod bookings;
mod dashboard;
mod images;
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
pub use bookings::BookingsPage;
pub use dashboard::DashboardPage;
pub use images::ImagesPage;
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

/// Pages whose code the browser loads when one of them is first shown: `cargo xtask build`
/// splits each group's code (and what only it uses) out of the main wasm
/// (docs/benchmarks.md §12). One split point per group, not per page: code shared by a set
/// of split points becomes a chunk of its own, and eighteen lazy pages made 437 chunks, one
/// request each. The server names a page's chunks in its preload links, so a fresh load
/// fetches them beside the main module.
///
/// The dashboard, where signing in lands, stays in the main module, and so does the sign-in
/// page: a lazy page's response names its chunks to preload, and a direct visit to `/login`
/// loads no bundle at all. `#[lazy]` names each group's loader `__preload_<group>`; the
/// routes await it first.
macro_rules! lazy_pages {
    ($($(#[$doc:meta])* $group:ident / $preload:ident { $($route:ident => $page:ident),* $(,)? })*) => {
        /// Which lazily loaded page to render.
        #[derive(Clone, Copy, Debug)]
        pub enum Page {
            $($($route,)*)*
        }

        $(
            $(#[$doc])*
            #[leptos::lazy]
            fn $group(page: Page) -> AnyView {
                #[allow(unreachable_patterns)]
                match page {
                    $(Page::$route => $page().into_any(),)*
                    _ => NotFound().into_any(),
                }
            }

            $(
                #[doc = concat!("[`", stringify!($page), "`], loaded on demand.")]
                #[derive(Debug)]
                pub struct $route;

                impl leptos_router::LazyRoute for $route {
                    fn data() -> Self {
                        $route
                    }

                    async fn view(_: Self) -> AnyView {
                        $group(Page::$route).await
                    }

                    // The router awaits this before it hydrates or renders the page, so the
                    // view above finds its chunk loaded and renders at once (a view that had
                    // to wait would not match the server's HTML).
                    async fn preload() {
                        #[cfg(feature = "hydrate")]
                        $preload().await;
                    }
                }
            )*
        )*
    };
}

lazy_pages! {
    /// What a researcher works with: allocations, notebooks and jobs.
    work / __preload_work {
        Allocations => AllocationsPage,
        Allocation => AllocationPage,
        Bookings => BookingsPage,
        Notebooks => NotebooksPage,
        Jobs => JobsPage,
        Workload => WorkloadPage,
    }
    /// The fleet, teams and their money, and the account.
    teams / __preload_teams {
        Nodes => NodesPage,
        Teams => TeamsPage,
        Team => TeamPage,
        Statement => StatementPage,
        Usage => UsagePage,
        Account => AccountPage,
    }
    /// The administrators' pages.
    admin / __preload_admin {
        Users => UsersPage,
        JoinTokens => JoinTokensPage,
        Audit => AuditPage,
        Queue => QueuePage,
        Billing => BillingPage,
        Images => ImagesPage,
    }
}

/// Which group of lazily loaded pages `path` belongs to (`lazy_pages!` above): the
/// sign-in page prefetches the group of the page the visitor is headed for. None: a page
/// of the main module.
fn group_of(path: &str) -> Option<&'static str> {
    let first = path.trim_start_matches('/').split(['/', '?', '#']).next()?;
    Some(match first {
        "allocations" | "bookings" | "notebooks" | "jobs" | "workloads" => "work",
        "nodes" | "teams" | "usage" | "account" => "teams",
        "admin" => "admin",
        _ => return None,
    })
}

/// The files of `path`'s group of lazily loaded pages under `/pkg`, as the split bundle's
/// map names them; none for a page of the main module or where there is no map.
pub fn group_files(path: &str) -> Vec<String> {
    let (Some(group), Some(split)) = (
        group_of(path),
        use_context::<std::sync::Arc<crate::SplitBundle>>(),
    ) else {
        return Vec::new();
    };
    split.needs.get(group).map_or_else(Vec::new, |chunks| {
        chunks.iter().map(|c| format!("/pkg/{c}.wasm")).collect()
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_path_names_the_group_its_page_is_loaded_with() {
        for (path, group) in [
            ("/allocations", Some("work")),
            ("/allocations/5f0c?x=1", Some("work")),
            ("/workloads/7", Some("work")),
            ("/bookings?week=2026-11-23", Some("work")),
            ("/jobs", Some("work")),
            ("/nodes", Some("teams")),
            ("/teams/3/statement", Some("teams")),
            ("/account", Some("teams")),
            ("/admin/billing", Some("admin")),
            ("/admin/images", Some("admin")),
            ("/", None),
            ("/login", None),
            ("/allocationsx", None),
        ] {
            assert_eq!(super::group_of(path), group, "{path}");
        }
    }
}

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
