//! Small building blocks shared by pages.

use crate::api::{self, UiError};
use leptos::prelude::*;
use leptos_router::components::{A, Redirect};
use tessera_domain::account::Me;

/// Sets `body[data-hydrated]` once the wasm bundle has taken over, so browser tests (and
/// curious humans) can tell a hydrated page from a server-rendered one.
pub fn mark_hydrated() {
    Effect::new(move |_| {
        #[cfg(feature = "hydrate")]
        if let Some(body) = web_sys::window()
            .and_then(|w| w.document())
            .and_then(|d| d.body())
        {
            let _ = body.set_attribute("data-hydrated", "true");
        }
    });
}

/// The error message for one field, from the last submission.
pub fn field_error(
    value: impl Fn() -> Option<Result<(), UiError>> + Send + Sync + 'static,
    field: &'static str,
) -> impl IntoView {
    move || {
        value()
            .and_then(|r| r.err())
            .and_then(|e| e.for_field(field))
            .map(|m| {
                view! {
                    <p class="field-error" id=format!("{field}-error") role="alert">
                        {m}
                    </p>
                }
            })
    }
}

/// The form-level error (anything not tied to a field).
pub fn form_error(
    value: impl Fn() -> Option<Result<(), UiError>> + Send + Sync + 'static,
) -> impl IntoView {
    move || {
        value()
            .and_then(|r| r.err())
            .and_then(|e| e.general())
            .map(|m| {
                view! {
                    <div class="form-error" role="alert">
                        {m}
                    </div>
                }
            })
    }
}

/// A password input with a show/hide toggle (the toggle needs the wasm bundle).
#[component]
pub fn PasswordInput(
    name: &'static str,
    label: &'static str,
    #[prop(default = "current-password")] autocomplete: &'static str,
) -> impl IntoView {
    let visible = RwSignal::new(false);
    view! {
        <label for=name>{label}</label>
        <div class="password-input">
            <input
                id=name
                name=name
                type=move || if visible.get() { "text" } else { "password" }
                autocomplete=autocomplete
                required
            />
            <button
                type="button"
                class="toggle"
                data-toggle-for=name
                aria-label=move || if visible.get() { "Hide password" } else { "Show password" }
                on:click=move |_| visible.update(|v| *v = !*v)
            >
                {move || if visible.get() { "Hide" } else { "Show" }}
            </button>
        </div>
    }
}

/// Renders `children` inside the app layout for a signed-in user; sends everyone else to the
/// login page. The signed-in user is provided as context ([`Me`]).
#[component]
pub fn Authenticated(children: ChildrenFn) -> impl IntoView {
    let me = Resource::new(|| (), |_| api::current_user());
    let children = StoredValue::new(children);
    view! {
        <Suspense fallback=|| view! { <p class="loading">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match me.await {
                    Ok(Some(user)) => {
                        provide_context(user.clone());
                        view! { <Layout me=user>{children.read_value()()}</Layout> }.into_any()
                    }
                    Ok(None) => view! { <Redirect path="/login" /> }.into_any(),
                    Err(e) => {
                        view! {
                            <div class="form-error" role="alert">
                                {e.error.to_string()}
                            </div>
                        }
                            .into_any()
                    }
                }
            })}
        </Suspense>
    }
}

#[component]
fn Layout(me: Me, children: Children) -> impl IntoView {
    let logout = ServerAction::<api::Logout>::new();
    view! {
        <header class="topbar">
            <a class="brand" href="/">
                "Tessera"
            </a>
            <nav aria-label="Main">
                <A href="/" exact=true>
                    "Dashboard"
                </A>
                <A href="/account">"My account"</A>
            </nav>
            <div class="user">
                <span class="username" data-testid="current-user">
                    {me.username.clone()}
                </span>
                {me.is_admin.then(|| view! { <span class="badge">"admin"</span> })}
                <ActionForm action=logout attr:class="inline">
                    <button type="submit" class="link" disabled=move || logout.pending().get()>
                        "Log out"
                    </button>
                </ActionForm>
            </div>
        </header>
        <main class="content">{children()}</main>
    }
}
