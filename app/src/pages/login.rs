use crate::api::{self, Login};
use crate::components::{PasswordInput, field_error, form_error};
use leptos::prelude::*;
use leptos_router::components::Redirect;

#[component]
pub fn LoginPage() -> impl IntoView {
    let me = Resource::new(|| (), |_| api::current_user());
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
                matches!(me.await, Ok(Some(_))).then(|| view! { <Redirect path="/" /> })
            })}
        </Suspense>
        <main class="content narrow">
            <div class="card login">
                <h1>"Sign in to Tessera"</h1>
                <ActionForm action=login attr:novalidate=true>
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
                    <PasswordInput name="password" label="Password" />
                    {field_error(value, "password")}
                    <button type="submit" class="primary" disabled=move || login.pending().get()>
                        {move || if login.pending().get() { "Signing in…" } else { "Sign in" }}
                    </button>
                </ActionForm>
            </div>
        </main>
    }
}
