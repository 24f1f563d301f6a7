use crate::api::{self, Login};
use crate::components::alert;
use crate::components::{PasswordInput, field_error, form_error};
use leptos::prelude::*;
use leptos_router::components::Redirect;
use leptos_router::hooks::use_query_map;

/// What `/login?sso_error=<code>` means, in the user's terms (the server logs the details).
pub fn sso_error_message(code: &str) -> &'static str {
    match code {
        "state" => {
            "That sign-in expired or was started in another browser or tab. Please try again."
        }
        "denied" => "The identity provider did not sign you in.",
        "disabled" => "Your account is disabled. Ask a platform administrator to enable it.",
        "unavailable" => {
            "The identity provider cannot be reached right now. Try again in a moment."
        }
        _ => {
            "Single sign-on failed: the identity provider's answer could not be verified. \
             Please try again; if it keeps failing, tell your administrator."
        }
    }
}

#[component]
pub fn LoginPage() -> impl IntoView {
    let me = Resource::new(|| (), |_| api::current_user());
    let options = Resource::new(|| (), |_| api::login_options());
    let query = use_query_map();
    let sso_error = move || {
        query
            .read()
            .get("sso_error")
            .map(|code| sso_error_message(&code))
    };
    // Where the visitor was going before being sent here (checked again on the server).
    let next = move || tessera_domain::account::after_sign_in(query.read().get("next").as_deref());
    let login = ServerAction::<Login>::new();
    let value = move || login.value().get();
    let echoed_username = move || {
        login
            .value()
            .get()
            .and_then(|r| r.err())
            .and_then(|e| e.echoed("username"))
            .unwrap_or_default()
    };
    view! {
        <Suspense>
            {move || Suspend::new(async move {
                matches!(me.await, Ok(Some(_))).then(|| view! { <Redirect path=next() /> })
            })}
        </Suspense>
        <main class="content narrow">
            <div class="card login">
                <h1>"Sign in to Tessera"</h1>
                {move || {
                    sso_error()
                        .map(|m| {
                            alert(m)
                        })
                }}
                <Suspense>
                    {move || Suspend::new(async move {
                        options
                            .await
                            .ok()
                            .and_then(|o| o.sso_provider)
                            .map(|name| {
                                view! {
                                    <form method="post" action="/auth/oidc/login" class="sso">
                                        <button type="submit" class="primary wide">
                                            {format!("Sign in with {name}")}
                                        </button>
                                    </form>
                                    <p class="divider">
                                        <span>"or with a Tessera password"</span>
                                    </p>
                                }
                            })
                    })}
                </Suspense>
                // Where the visitor is headed, if it is a lazily loaded page: its group of
                // chunks, prefetched with the bundle once they type (`SERVER_ONLY_JS`).
                <ActionForm
                    action=login
                    attr:novalidate=true
                    attr:data-prefetch-next=move || crate::pages::group_files(&next()).join(" ")
                >
                    <input type="hidden" name="next" prop:value=next value=next />
                    {form_error(value)}
                    <label for="username">"Username"</label>
                    <input
                        id="username"
                        name="username"
                        autocomplete="username"
                        autofocus
                        required
                        prop:value=echoed_username
                        value=echoed_username
                    />
                    {field_error(value, "username")}
                    <PasswordInput result=value name="password" label="Password" />
                    <button
                        id="sign-in"
                        type="submit"
                        class="primary"
                        disabled=move || login.pending().get()
                    >
                        {move || if login.pending().get() { "Signing in…" } else { "Sign in" }}
                    </button>
                </ActionForm>
            </div>
        </main>
    }
}
