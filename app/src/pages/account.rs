use crate::api::ChangePassword;
use crate::components::{Authenticated, PasswordInput, field_error, form_error};
use leptos::prelude::*;
use leptos_router::hooks::use_query_map;

#[component]
pub fn AccountPage() -> impl IntoView {
    view! {
        <Authenticated>
            <h1>"My account"</h1>
            <ChangePasswordForm />
        </Authenticated>
    }
}

#[component]
fn ChangePasswordForm() -> impl IntoView {
    let action = ServerAction::<ChangePassword>::new();
    let value = move || action.value().get();
    let query = use_query_map();
    let changed = move || {
        matches!(action.value().get(), Some(Ok(())))
            || query.read().get("changed").is_some_and(|v| v == "1")
    };
    view! {
        <section class="card">
            <h2>"Change password"</h2>
            <p class="hint">"At least 12 characters. Your other sessions will be signed out."</p>
            {move || {
                changed()
                    .then(|| {
                        view! {
                            <div class="notice" role="status">
                                "Password changed."
                            </div>
                        }
                    })
            }}
            <ActionForm action=action attr:id="change-password" attr:novalidate=true>
                {form_error(value)}
                <PasswordInput name="current_password" label="Current password" />
                {field_error(value, "current_password")}
                <PasswordInput
                    name="new_password"
                    label="New password"
                    autocomplete="new-password"
                />
                {field_error(value, "new_password")}
                <PasswordInput
                    name="confirm_password"
                    label="Repeat new password"
                    autocomplete="new-password"
                />
                {field_error(value, "confirm_password")}
                <button type="submit" class="primary" disabled=move || action.pending().get()>
                    "Change password"
                </button>
            </ActionForm>
        </section>
    }
}
