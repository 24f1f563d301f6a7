//! Platform admins create node join tokens (shown once, with the agent command) and revoke
//! them.

use crate::api::{self, CreateJoinToken, RevokeJoinToken, UiError};
use crate::components::{
    AdminOnly, Authenticated, Columns, Field, FieldInput, PAGE_SIZE, SecretBox, SecretSubmit, When,
    at, form_error, now, origin, paged_table, use_offset,
};
use crate::components::{SecretCard, revoke_fields};
use leptos::prelude::*;
use tessera_domain::tenancy::{CreatedSecret, JoinTokenView, Page, PageRequest};

#[component]
pub fn JoinTokensPage() -> impl IntoView {
    // Created here, outside `Authenticated`, like the nodes page (see the comment there).
    let offset = use_offset();
    let create = ServerAction::<CreateJoinToken>::new();
    let revoke = ServerAction::<RevokeJoinToken>::new();
    let tokens = Resource::new(
        move || (offset.get(), create.version().get(), revoke.version().get()),
        |(offset, ..)| api::list_join_tokens(PageRequest::new(offset, PAGE_SIZE)),
    );
    view! {
        <Authenticated>
            <h1>"Join tokens"</h1>
            <AdminOnly>
                <JoinTokenAdmin tokens create revoke />
            </AdminOnly>
        </Authenticated>
    }
}

#[component]
fn JoinTokenAdmin(
    tokens: Resource<Result<Page<JoinTokenView>, UiError>>,
    create: ServerAction<CreateJoinToken>,
    revoke: ServerAction<RevokeJoinToken>,
) -> impl IntoView {
    view! {
        <p class="hint">
            "A join token lets a GPU host register once with "
            <code>"tessera-agent"</code>
            "; the node then gets its own credential. Tokens expire, and each use counts."
        </p>
        <CreateJoinTokenForm action=create />
        <section class="card wide">
            <h2>"Tokens"</h2>
            {form_error(move || revoke.value().get())}
            {paged_table(
                tokens,
                at("/admin/join-tokens"),
                Columns::new("join-tokens", &["Note", "Token", "Uses", "Expires", "Status", "Created", ""]),
                || "No join tokens yet. Create one above to add a node.".into_any(),
                move |token| view! { <JoinTokenRow token revoke /> },
            )}
        </section>
    }
}

fn status(token: &JoinTokenView) -> (&'static str, &'static str) {
    if token.revoked {
        ("revoked", "badge danger")
    } else if token.uses >= token.max_uses {
        ("used up", "badge muted")
    } else if !token.usable(now()) {
        ("expired", "badge muted")
    } else {
        ("usable", "badge ok")
    }
}

#[component]
fn JoinTokenRow(token: JoinTokenView, revoke: ServerAction<RevokeJoinToken>) -> impl IntoView {
    let (label, class) = status(&token);
    let revocable = label == "usable";
    let note = if token.note.is_empty() {
        "—".to_owned()
    } else {
        token.note.clone()
    };
    view! {
        <tr data-testid="join-token">
            <td>{note}</td>
            <td>
                <code>{format!("{}…", token.prefix)}</code>
            </td>
            <td>{token.uses} " / " {token.max_uses}</td>
            <td>
                <When t=token.expires_at />
            </td>
            <td>
                <span class=class>{label}</span>
            </td>
            <td>
                <When t=token.created_at />
            </td>
            <td class="actions">
                {revocable
                    .then(|| {
                        view! {
                            <ActionForm action=revoke attr:class="row-form">{revoke_fields(token.id, revoke)}</ActionForm>
                        }
                    })}
            </td>
        </tr>
    }
}

#[component]
fn CreateJoinTokenForm(action: ServerAction<CreateJoinToken>) -> impl IntoView {
    let value = move || action.value().get();
    let shown = |created: CreatedSecret<JoinTokenView>| {
        let server = origin().unwrap_or_else(|| "https://THIS-PORTAL".to_owned());
        let command = format!(
            "tessera-agent --server {server} --join-token {}",
            created.secret
        );
        view! { <SecretBox title="New join token" secret=created.secret command /> }
    };
    view! {
        <SecretCard id="create-join-token" title="Create a join token" made=value shown>
            <ActionForm action=action attr:id="create-join-token" attr:novalidate=true>
                {form_error(value)}
                <Field result=value id="join-note" name="note" label="Note"
                    input=FieldInput::text().placeholder("rack 4, gpu-node-17") />
                <div class="field-row">
                    <div>
                        <Field result=value id="join-max-uses" name="max_uses" label="Max uses"
                            input=FieldInput::number("1") default="1" />
                    </div>
                    <div>
                        <Field result=value id="join-hours" name="expires_in_hours"
                            label="Expires in (hours)" input=FieldInput::number("1") default="24" />
                    </div>
                </div>
                <SecretSubmit label="Create join token" pending=action.pending() />
            </ActionForm>
        </SecretCard>
    }
}
