use crate::api::{
    self, ChangePassword, CreateToken, RevokeToken, SetNotificationEmail,
    SetNotificationPreference, UiError,
};
use crate::components::{
    Authenticated, Columns, Field, FieldInput, Loading, PAGE_SIZE, PasswordInput, Problem,
    SecretBox, SecretSubmit, When, at, field_error, form_error, paged_table, use_offset,
};
use crate::components::{Card, SecretCard, list_table, revoke_fields};
use leptos::prelude::*;
use leptos_router::hooks::use_query_map;
use tessera_domain::notify::{NotificationSettings, NotifyMode};
use tessera_domain::tenancy::{ApiTokenView, CreatedSecret, Page, PageRequest};

#[component]
pub fn AccountPage() -> impl IntoView {
    // Created here, outside `Authenticated`, like the nodes page (see the comment there).
    let offset = use_offset();
    let create = ServerAction::<CreateToken>::new();
    let revoke = ServerAction::<RevokeToken>::new();
    let tokens = Resource::new(
        move || (offset.get(), create.version().get(), revoke.version().get()),
        |(offset, ..)| api::list_tokens(PageRequest::new(offset, PAGE_SIZE)),
    );
    let set_email = ServerAction::<SetNotificationEmail>::new();
    let set_pref = ServerAction::<SetNotificationPreference>::new();
    let notifications = Resource::new(
        move || (set_email.version().get(), set_pref.version().get()),
        |_| api::my_notifications(),
    );
    view! {
        <Authenticated>
            <h1>"My account"</h1>
            <div class="columns">
                <ChangePasswordForm />
                <CreateTokenForm action=create />
            </div>
            <TokenList tokens revoke />
            <Notifications settings=notifications set_email set_pref />
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
                <PasswordInput result=value name="current_password" label="Current password" />
                <PasswordInput result=value name="new_password" label="New password"
                    autocomplete="new-password" />
                <PasswordInput result=value name="confirm_password" label="Repeat new password"
                    autocomplete="new-password" />
                <button type="submit" class="primary" disabled=move || action.pending().get()>
                    "Change password"
                </button>
            </ActionForm>
        </section>
    }
}

#[component]
fn CreateTokenForm(action: ServerAction<CreateToken>) -> impl IntoView {
    let value = move || action.value().get();
    let shown = |created: CreatedSecret<ApiTokenView>| {
        view! {
            <SecretBox
                title=format!("New API token “{}”", created.token.name)
                secret=created.secret
            />
            <p class="hint">
                "Use it as " <code>"Authorization: Bearer <token>"</code>
                " against " <code>"/api/v1"</code> "; it acts as you, with your roles."
            </p>
        }
    };
    view! {
        <SecretCard id="create-token" title="Create an API token" made=value shown>
            <ActionForm action=action attr:id="create-token" attr:novalidate=true>
                {form_error(value)}
                <Field result=value id="token-name" name="name" label="Name"
                    input=FieldInput::text().placeholder("laptop scripts").required() />
                <Field result=value id="token-days" name="expires_in_days"
                    label="Expires in (days, optional)"
                    input=FieldInput::number("1").placeholder("never") />
                <SecretSubmit label="Create token" pending=action.pending() />
            </ActionForm>
        </SecretCard>
    }
}

#[component]
fn TokenList(
    tokens: Resource<Result<Page<ApiTokenView>, UiError>>,
    revoke: ServerAction<RevokeToken>,
) -> impl IntoView {
    view! {
        <section class="card wide">
            <h2>"API tokens"</h2>
            {form_error(move || revoke.value().get())}
            {paged_table(
                tokens,
                at("/account"),
                Columns::new("api-tokens", &["Name", "Token", "Created", "Expires", "Last used", ""]),
                || "No API tokens. Create one to call the REST API from scripts.".into_any(),
                move |token| view! { <TokenRow token revoke /> },
            )}
        </section>
    }
}

#[component]
fn TokenRow(token: ApiTokenView, revoke: ServerAction<RevokeToken>) -> impl IntoView {
    let expires = match token.expires_at {
        Some(t) => view! { <When t /> }.into_any(),
        None => "never".into_any(),
    };
    let last_used = match token.last_used_at {
        Some(t) => view! { <When t /> }.into_any(),
        None => "never".into_any(),
    };
    view! {
        <tr data-testid="api-token">
            <td>{token.name.clone()}</td>
            <td>
                <code>{format!("{}…", token.prefix)}</code>
            </td>
            <td>
                <When t=token.created_at />
            </td>
            <td>{expires}</td>
            <td>{last_used}</td>
            <td class="actions">
                <ActionForm action=revoke attr:class="row-form">{revoke_fields(token.id, revoke)}</ActionForm>
            </td>
        </tr>
    }
}

/// My account → Notifications: the address mail goes to and, per kind of event, whether it
/// comes at once, in the daily digest or not at all (docs/notifications.md).
#[component]
fn Notifications(
    settings: Resource<Result<NotificationSettings, UiError>>,
    set_email: ServerAction<SetNotificationEmail>,
    set_pref: ServerAction<SetNotificationPreference>,
) -> impl IntoView {
    let value = move || set_email.value().get();
    let body = move || {
        Suspend::new(async move {
            match settings.await {
                Ok(s) => {
                    let email = s.email.clone().unwrap_or_default();
                    let rows = s
                        .preferences
                        .into_iter()
                        .map(|p| {
                            let kind = p.kind.as_str();
                            let options = [
                                (NotifyMode::Immediate, "Immediately"),
                                (NotifyMode::Digest, "Daily digest"),
                                (NotifyMode::Off, "Off"),
                            ]
                            .into_iter()
                            .map(|(m, label)| {
                                view! {
                                    <option value=m.as_str() selected=m == p.mode>
                                        {label}
                                    </option>
                                }
                            })
                            .collect_view();
                            view! {
                                <tr data-testid="notification-pref" data-kind=kind>
                                    <td>{p.label}</td>
                                    <td>
                                        <ActionForm action=set_pref attr:class="row-form">
                                            <input type="hidden" name="kind" value=kind />
                                            <select name="mode" aria-label="How">
                                                {options}
                                            </select>
                                            " "
                                            <button type="submit" class="link">
                                                "Save"
                                            </button>
                                        </ActionForm>
                                    </td>
                                </tr>
                            }
                        })
                        .collect_view();
                    view! {
                        <ActionForm action=set_email attr:id="notification-email" attr:novalidate=true>
                            {form_error(value)}
                            <label for="notify-email">"Email address"</label>
                            <input
                                id="notify-email"
                                name="email"
                                type="email"
                                autocomplete="email"
                                placeholder="you@example.org"
                                value=email.clone()
                                prop:value=email
                            />
                            {field_error(value, "email")}
                            <button type="submit" disabled=move || set_email.pending().get()>
                                "Save address"
                            </button>
                        </ActionForm>
                        {list_table(&Columns::new("notification-prefs", &["Event", "How"]), rows)}
                    }
                    .into_any()
                }
                Err(e) => view! { <Problem error=e.error /> }.into_any(),
            }
        })
    };
    view! {
        <Card id="notifications" title="Notifications" wide=true hint="Mail about your work and your teams. Without an address you get none.">
            {form_error(move || set_pref.value().get())}
            <Transition fallback=Loading>{body}</Transition>
        </Card>
    }
}
