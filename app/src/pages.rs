//! One component per page.

mod account;
mod dashboard;
mod login;

pub use account::AccountPage;
pub use dashboard::DashboardPage;
pub use login::LoginPage;

use leptos::prelude::*;

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
