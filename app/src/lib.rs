//! Tessera's user interface (Leptos, server-rendered and hydrated).
//!
//! Components never talk to the database or to `/api/v1`: data flows through the short
//! server functions in [`api`], which call `tessera-core`'s services (server side only).

pub mod api;
mod components;
mod pages;

use leptos::prelude::*;
use leptos_meta::{MetaTags, Title, provide_meta_context};
use leptos_router::{
    Lazy, SsrMode,
    components::{Route, Router, Routes},
    path,
};

/// Name of the wasm/js bundle and stylesheet under `/pkg`, before its content hash
/// (`tessera.<hash>.js`; see `cargo xtask build`).
pub const OUTPUT_NAME: &str = "tessera";

/// The split bundle's map (`<name>.<hash>.split.json`, which `cargo xtask build` writes
/// and the server provides to every render, once, behind an `Arc`): the chunk loader the
/// main module imports, and for each group of lazily loaded pages (`work`, `teams`, `admin`)
/// the chunk file stems it needs under `/pkg`.
#[derive(Clone, Debug, Default)]
pub struct SplitBundle {
    pub loader: String,
    pub needs: std::collections::HashMap<String, Vec<String>>,
}

/// The HTML document around the app (server side only renders it).
pub fn shell(options: LeptosOptions) -> impl IntoView {
    use_csp_nonce();
    let path = request_path();
    let server_only = path.as_deref().is_some_and(is_server_only);
    // The chunk loader the main module imports (split bundles).
    let loader = use_context::<std::sync::Arc<SplitBundle>>().map(|s| format!("/pkg/{}", s.loader));
    let prefetch = server_only.then(|| {
        let loader = loader
            .as_deref()
            .map(|l| format!(" {l}"))
            .unwrap_or_default();
        format!("/pkg/{0}.js /pkg/{0}_bg.wasm{loader}", options.output_name)
    });
    // A hydrated page fetches the loader and, for a lazily loaded page, its group's chunks
    // beside the main module rather than after it.
    let preloads = (!server_only).then(|| {
        let chunks = path.as_deref().map(pages::group_files).unwrap_or_default();
        view! {
            {loader
                .map(|href| view! { <link rel="modulepreload" href=href crossorigin="anonymous" /> })}
            {chunks
                .into_iter()
                .map(|href| {
                    view! {
                        <link
                            rel="preload"
                            href=href
                            r#as="fetch"
                            r#type="application/wasm"
                            crossorigin="anonymous"
                        />
                    }
                })
                .collect_view()}
        }
    });
    view! {
        <!DOCTYPE html>
        <html lang="en">
            <head>
                <meta charset="utf-8" />
                <meta name="viewport" content="width=device-width, initial-scale=1" />
                <link rel="icon" href="data:," />
                <link rel="stylesheet" href=format!("/pkg/{}.css", options.output_name) />
                {(!server_only).then(|| view! { <HydrationScripts options /> })}
                {preloads}
                <MetaTags />
            </head>
            <body
                data-server-only=server_only.then_some("")
                data-prefetch=prefetch
            >
                <App />
                {server_only
                    .then(|| {
                        view! { <script nonce=leptos::nonce::use_nonce() inner_html=SERVER_ONLY_JS></script> }
                    })}
            </body>
        </html>
    }
}

/// Pages served as plain HTML, without the wasm bundle: the sign-in page, which every
/// anonymous visit lands on, must be usable at once on a slow link (docs/benchmarks.md
/// §12), and its form works without JavaScript. Reached by client-side navigation (after
/// signing out), the app renders it like any other page.
pub fn is_server_only(path: &str) -> bool {
    path == "/login"
}

/// What a server-only page does in the browser without the bundle (progressive
/// enhancement; the forms work without it): the password fields' show/hide toggle, the
/// submit button says it is busy, and once the visitor starts typing the bundle is
/// prefetched (`body[data-prefetch]`, and the chunks of the page they are headed for,
/// `[data-prefetch-next]`), so the page after signing in finds it cached.
const SERVER_ONLY_JS: &str = "(function(){var n=document.querySelector('[data-prefetch-next]'),\
p=[document.body.dataset.prefetch,n&&n.dataset.prefetchNext].filter(Boolean).join(' ');\
if(!p)return;var go=function(){document.removeEventListener('input',go);\
p.split(' ').forEach(function(h){var l=document.createElement('link');\
l.rel='prefetch';l.href=h;document.head.appendChild(l)})};\
document.addEventListener('input',go)})();\
document.addEventListener('click',function(e){\
var b=e.target.closest('button[data-toggle-for]');if(!b)return;\
var i=document.getElementById(b.dataset.toggleFor),s=i.type==='password';\
i.type=s?'text':'password';b.textContent=s?'Hide':'Show';\
b.setAttribute('aria-label',s?'Hide password':'Show password')});\
document.addEventListener('submit',function(e){\
var b=e.target.querySelector('button[type=submit]');\
if(b){b.disabled=true;b.textContent='Signing in\u{2026}'}});";

/// This response's request path (server side only).
fn request_path() -> Option<String> {
    #[cfg(feature = "ssr")]
    {
        use_context::<http::request::Parts>().map(|p| p.uri.path().to_owned())
    }
    #[cfg(not(feature = "ssr"))]
    {
        None
    }
}

/// Stamps this response's Content-Security-Policy nonce (chosen by the server's header
/// middleware) on the scripts Leptos writes inline, instead of a nonce no header knows.
fn use_csp_nonce() {
    #[cfg(feature = "ssr")]
    if let Some(nonce) = use_context::<http::request::Parts>().and_then(|p| {
        p.extensions
            .get::<tessera_core::request::CspNonce>()
            .cloned()
    }) {
        provide_context(leptos::nonce::Nonce::from_value(nonce.0));
    }
}

#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();
    components::provide_live();
    view! {
        <Title text="Tessera" />
        <Router>
            <Routes fallback=pages::NotFound>
                // Async: the response waits for data, so a signed-out visitor gets a real
                // 303 to /login (works without JavaScript) and statuses are accurate.
                <Route
                    path=path!("/login")
                    view=pages::LoginPage
                    ssr=SsrMode::Async
                />
                <Route
                    path=path!("/")
                    view=pages::DashboardPage
                    ssr=SsrMode::Async
                />
                <Route
                    path=path!("/account")
                    view={Lazy::<pages::Account>::new()}
                    ssr=SsrMode::Async
                />
                <Route
                    path=path!("/nodes")
                    view={Lazy::<pages::Nodes>::new()}
                    ssr=SsrMode::Async
                />
                <Route
                    path=path!("/allocations")
                    view={Lazy::<pages::Allocations>::new()}
                    ssr=SsrMode::Async
                />
                <Route
                    path=path!("/allocations/:id")
                    view={Lazy::<pages::Allocation>::new()}
                    ssr=SsrMode::Async
                />
                <Route
                    path=path!("/bookings")
                    view={Lazy::<pages::Bookings>::new()}
                    ssr=SsrMode::Async
                />
                <Route
                    path=path!("/notebooks")
                    view={Lazy::<pages::Notebooks>::new()}
                    ssr=SsrMode::Async
                />
                <Route
                    path=path!("/jobs")
                    view={Lazy::<pages::Jobs>::new()}
                    ssr=SsrMode::Async
                />
                <Route
                    path=path!("/workloads/:id")
                    view={Lazy::<pages::Workload>::new()}
                    ssr=SsrMode::Async
                />
                <Route
                    path=path!("/teams")
                    view={Lazy::<pages::Teams>::new()}
                    ssr=SsrMode::Async
                />
                <Route
                    path=path!("/teams/:id")
                    view={Lazy::<pages::Team>::new()}
                    ssr=SsrMode::Async
                />
                <Route
                    path=path!("/teams/:id/statement")
                    view={Lazy::<pages::Statement>::new()}
                    ssr=SsrMode::Async
                />
                <Route
                    path=path!("/usage")
                    view={Lazy::<pages::Usage>::new()}
                    ssr=SsrMode::Async
                />
                <Route
                    path=path!("/admin/users")
                    view={Lazy::<pages::Users>::new()}
                    ssr=SsrMode::Async
                />
                <Route
                    path=path!("/admin/join-tokens")
                    view={Lazy::<pages::JoinTokens>::new()}
                    ssr=SsrMode::Async
                />
                <Route
                    path=path!("/admin/audit")
                    view={Lazy::<pages::Audit>::new()}
                    ssr=SsrMode::Async
                />
                <Route
                    path=path!("/admin/queue")
                    view={Lazy::<pages::Queue>::new()}
                    ssr=SsrMode::Async
                />
                <Route
                    path=path!("/admin/billing")
                    view={Lazy::<pages::Billing>::new()}
                    ssr=SsrMode::Async
                />
                <Route
                    path=path!("/admin/images")
                    view={Lazy::<pages::Images>::new()}
                    ssr=SsrMode::Async
                />
            </Routes>
        </Router>
    }
}

/// Entry point of the wasm bundle.
#[cfg(feature = "hydrate")]
#[wasm_bindgen::prelude::wasm_bindgen]
pub fn hydrate() {
    console_error_panic_hook::set_once();
    // Lazily loaded routes hydrate once their chunk is in, so hydration is async (as in
    // `leptos::mount::hydrate_lazy`; `hydrate_body` cannot wait), and the page counts as
    // hydrated once all of it is.
    wasm_bindgen_futures::spawn_local(async {
        let Some(body) = leptos::prelude::document().body() else {
            return;
        };
        leptos::mount::hydrate_from_async(body, App).await.forget();
        components::set_hydrated();
    });
}
