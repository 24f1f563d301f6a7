use crate::components::Authenticated;
use leptos::prelude::*;

#[component]
pub fn DashboardPage() -> impl IntoView {
    view! {
        <Authenticated>
            <h1>"Dashboard"</h1>
            <div class="panels">
                <NotBuiltPanel
                    title="Cluster"
                    text="Nodes, GPUs and MIG layout will appear here once node registration is built."
                />
                <NotBuiltPanel
                    title="My allocations"
                    text="Requests for MIG slices and whole GPUs are not built yet."
                />
                <NotBuiltPanel
                    title="Usage and spend"
                    text="Metering and chargeback are not built yet."
                />
            </div>
        </Authenticated>
    }
}

/// A panel whose data arrives in a later issue; says so plainly.
#[component]
fn NotBuiltPanel(title: &'static str, text: &'static str) -> impl IntoView {
    view! {
        <section class="panel not-built" aria-label=title>
            <h2>{title}</h2>
            <p>{text}</p>
            <span class="badge muted">"not built yet"</span>
        </section>
    }
}
