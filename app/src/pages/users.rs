//! Platform admins manage user accounts: create, disable/enable, reset a password.

use crate::api::{self, CreateUser, ResetPassword, SetUserDisabled, UiError};
use crate::components::alert;
use crate::components::{
    AdminOnly, Authenticated, Columns, Field, FieldInput, PAGE_SIZE, PasswordInput, When, at,
    error_of, form_error, paged_table, use_offset,
};
use leptos::prelude::*;
use tessera_domain::account::Me;
use tessera_domain::tenancy::{Page, PageRequest, UserView};

#[component]
pub fn UsersPage() -> impl IntoView {
    // Created here, outside `Authenticated`, like the nodes page (see the comment there).
    let offset = use_offset();
    let create = ServerAction::<CreateUser>::new();
    let actions = UserActions {
        disable: ServerAction::new(),
        reset: ServerAction::new(),
        reset_target: RwSignal::new(None),
    };
    let users = Resource::new(
        move || {
            (
                offset.get(),
                create.version().get(),
                actions.disable.version().get(),
            )
        },
        |(offset, ..)| api::list_users(PageRequest::new(offset, PAGE_SIZE)),
    );
    view! {
        <Authenticated>
            <h1>"Users"</h1>
            <AdminOnly>
                <UserAdmin users create actions />
            </AdminOnly>
        </Authenticated>
    }
}

/// One action per kind for the page; `reset_target` remembers whose password form was
/// submitted last, so its errors show next to it (after hydration). A reset changes nothing
/// the list shows, so it does not reload the list (which would close the open form).
#[derive(Clone, Copy)]
struct UserActions {
    disable: ServerAction<SetUserDisabled>,
    reset: ServerAction<ResetPassword>,
    reset_target: RwSignal<Option<String>>,
}

#[component]
fn UserAdmin(
    users: Resource<Result<Page<UserView>, UiError>>,
    create: ServerAction<CreateUser>,
    actions: UserActions,
) -> impl IntoView {
    let notice = move || {
        let disabled = actions.disable.value().get().and_then(Result::ok).map(|u| {
            if u.disabled {
                format!(
                    "{} is disabled; their sessions and tokens stop working.",
                    u.username
                )
            } else {
                format!("{} is enabled again.", u.username)
            }
        });
        disabled.map(|text| view! { <div class="notice" role="status">{text}</div> })
    };
    // Without JavaScript nobody knows whose reset failed: say it at the top.
    let reset_error = move || {
        actions
            .reset_target
            .get()
            .is_none()
            .then(|| error_of(actions.reset.value().get()))
            .flatten()
            .map(|e| alert(format!("Could not reset the password: {}", e.error)))
    };
    view! {
        <CreateUserForm action=create />
        <section class="card wide">
            <h2>"All users"</h2>
            {notice}
            {form_error(move || actions.disable.value().get())}
            {reset_error}
            {paged_table(
                users,
                at("/admin/users"),
                Columns::new("users", &["Username", "Created", "Manage"]),
                || "No users yet.".into_any(),
                move |user| view! { <UserRow user actions /> },
            )}
        </section>
    }
}

#[component]
fn UserRow(user: UserView, actions: UserActions) -> impl IntoView {
    let id = user.id.to_string();
    let reset_id = format!("reset-{id}");
    let mine = {
        let id = id.clone();
        Memo::new(move |_| actions.reset_target.read().as_deref() == Some(id.as_str()))
    };
    let value = move || {
        if mine.get() {
            actions.reset.value().get()
        } else {
            None
        }
    };
    let done =
        move || mine.get() && !actions.reset.pending().get() && matches!(value(), Some(Ok(_)));
    // A password set here must not linger in the field.
    let form = NodeRef::<leptos::html::Form>::new();
    Effect::new(move |_| {
        if matches!(value(), Some(Ok(_)))
            && let Some(form) = form.get()
        {
            form.reset();
        }
    });
    let target_id = id.clone();
    let disable_id = id.clone();
    let is_me = use_context::<Me>().is_some_and(|me| me.username == user.username);
    view! {
        <tr data-testid="user" data-username=user.username.clone()>
            <td>
                <strong>{user.username.clone()}</strong>
                {is_me.then(|| view! { " " <span class="badge muted">"you"</span> })}
                {user.is_admin.then(|| view! { " " <span class="badge">"admin"</span> })}
                {user.disabled.then(|| view! { " " <span class="badge danger">"disabled"</span> })}
                {(!user.has_password)
                    .then(|| {
                        view! {
                            " "
                            <span
                                class="badge muted"
                                title="Signs in through single sign-on; has no Tessera password"
                            >
                                "SSO"
                            </span>
                        }
                    })}
            </td>
            <td>
                <When t=user.created_at />
            </td>
            <td class="actions">
                {(!is_me)
                    .then(|| {
                        view! {
                            <ActionForm action=actions.disable attr:class="row-form">
                                <input type="hidden" name="user_id" value=disable_id />
                                <input
                                    type="hidden"
                                    name="disabled"
                                    value=(!user.disabled).to_string()
                                />
                                <button
                                    type="submit"
                                    class=if user.disabled { "" } else { "danger" }
                                    disabled=move || actions.disable.pending().get()
                                >
                                    {if user.disabled { "Enable" } else { "Disable" }}
                                </button>
                            </ActionForm>
                        }
                    })}
                <details class="row-details">
                    <summary>"Reset password"</summary>
                    <ActionForm action=actions.reset node_ref=form attr:novalidate=true>
                        <input type="hidden" name="user_id" value=id />
                        {form_error(value)}
                        <PasswordInput result=value name="password" id=reset_id
                            label="New password" autocomplete="new-password" />
                        <p class="hint">"At least 12 characters. Their sessions end."</p>
                        <button
                            type="submit"
                            on:click=move |_| actions.reset_target.set(Some(target_id.clone()))
                            disabled=move || actions.reset.pending().get()
                        >
                            "Set password"
                        </button>
                        {move || {
                            done()
                                .then(|| {
                                    view! {
                                        <div class="notice" role="status">
                                            "Password set."
                                        </div>
                                    }
                                })
                        }}
                    </ActionForm>
                </details>
            </td>
        </tr>
    }
}

#[component]
fn CreateUserForm(action: ServerAction<CreateUser>) -> impl IntoView {
    let value = move || action.value().get();
    let form = NodeRef::<leptos::html::Form>::new();
    // A created account's password must not linger in the form.
    Effect::new(move |_| {
        if matches!(action.value().get(), Some(Ok(_)))
            && let Some(form) = form.get()
        {
            form.reset();
        }
    });
    let created = move || {
        action.value().get().and_then(Result::ok).map(|u| {
            view! {
                <div class="notice" role="status">
                    {format!("User {} created.", u.username)}
                </div>
            }
        })
    };
    view! {
        <section class="card">
            <h2>"Create a user"</h2>
            {created}
            <ActionForm action=action node_ref=form attr:id="create-user" attr:novalidate=true>
                {form_error(value)}
                <Field result=value id="new-username" name="username" label="Username"
                    input=FieldInput::text().required() />
                <PasswordInput result=value name="password" id="new-user-password"
                    label="Initial password" autocomplete="new-password" />
                <p class="hint">"At least 12 characters. Tell it to the user; they can change it."</p>
                <label class="check">
                    <input type="checkbox" name="is_admin" value="true" />
                    " Platform admin (manages users, teams and nodes)"
                </label>
                <button type="submit" class="primary" disabled=move || action.pending().get()>
                    "Create user"
                </button>
            </ActionForm>
        </section>
    }
}
