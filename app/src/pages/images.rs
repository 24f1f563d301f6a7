//! Images (issue 36): platform admins say which registries images may come from (the
//! allow-list) and keep the platform-wide catalog every team picks from. Teams' own entries
//! and registry logins live on the team page (`components::images::TeamImages`).

use crate::api::{self, AddImage, AllowRegistry, DisallowRegistry, RemoveImage, UiError};
use crate::components::Card;
use crate::components::RemoveButton;
use crate::components::images::{AddImageForm, CatalogTable};
use crate::components::{
    AdminOnly, Authenticated, Columns, Field, FieldInput, field_error, form_error, unpaged_table,
};
use leptos::prelude::*;
use tessera_domain::image::CatalogImage;

#[component]
pub fn ImagesPage() -> impl IntoView {
    // Created here, outside `Authenticated`, like the other admin pages.
    let allow = ServerAction::<AllowRegistry>::new();
    let disallow = ServerAction::<DisallowRegistry>::new();
    let add = ServerAction::<AddImage>::new();
    let remove = ServerAction::<RemoveImage>::new();
    let allowlist = Resource::new(
        move || (allow.version().get(), disallow.version().get()),
        |_| api::registry_allowlist(),
    );
    let catalog = Resource::new(
        move || (add.version().get(), remove.version().get()),
        |_| async move {
            // The platform-wide entries only; teams' own are on their pages.
            api::list_images(String::new())
                .await
                .map(|l| l.into_iter().filter(|i| i.team_id.is_none()).collect())
        },
    );
    view! {
        <Authenticated>
            <h1>"Images"</h1>
            <AdminOnly>
                <p class="hint">
                    "Notebooks and jobs run in the node's own environment unless they pick an image "
                    "from the catalog. Each catalog entry is pinned to the digest its tag named when "
                    "it was added, so a moved tag never changes what runs."
                </p>
                <AllowList allowlist allow disallow />
                <PlatformCatalog catalog add remove />
            </AdminOnly>
        </Authenticated>
    }
}

#[component]
fn AllowList(
    allowlist: Resource<Result<Vec<String>, UiError>>,
    allow: ServerAction<AllowRegistry>,
    disallow: ServerAction<DisallowRegistry>,
) -> impl IntoView {
    let value = move || allow.value().get();
    view! {
        <Card id="allowlist" title="Allowed registries" wide=true>
            <p class="hint">
                "Images may come only from these. An entry is a registry host ("
                <code>"ghcr.io"</code> ", " <code>"127.0.0.1:5000"</code>
                ") or a repository prefix under one (" <code>"ghcr.io/acme"</code> ", "
                <code>"docker.io/library"</code>
                "). Removing one keeps its catalog entries listed, but no new workload runs in them."
            </p>
            {form_error(move || disallow.value().get())}
            {unpaged_table(
                allowlist,
                Columns::new("allowlist", &["Entry", ""]),
                || {
                    view! {
                        <p data-testid="no-registries">
                            "No registry is allowed yet — add one to let teams use images."
                        </p>
                    }
                        .into_any()
                },
                move |entry: String| {
                    let question = format!("Stop allowing images from {entry}?");
                    let (shown, value) = (entry.clone(), entry.clone());
                    view! {
                        <tr data-testid="allowed-registry" data-entry=entry>
                            <td>
                                <code>{shown}</code>
                            </td>
                            <td class="actions">
                                <ActionForm action=disallow attr:class="row-form">
                                    <RemoveButton name="entry" value question />
                                </ActionForm>
                            </td>
                        </tr>
                    }
                },
            )}
            <ActionForm action=allow attr:data-testid="allow-form" attr:novalidate=true>
                {form_error(value)}
                <Field result=value id="allow-entry" name="entry" label="Registry or repository prefix"
                    keep=true input=FieldInput::text().placeholder("ghcr.io/acme").required() />
                {field_error(value, "registry")}
                <button type="submit" disabled=move || allow.pending().get()>
                    "Allow"
                </button>
            </ActionForm>
        </Card>
    }
}

#[component]
fn PlatformCatalog(
    catalog: Resource<Result<Vec<CatalogImage>, UiError>>,
    add: ServerAction<AddImage>,
    remove: ServerAction<RemoveImage>,
) -> impl IntoView {
    view! {
        <Card id="catalog" title="Platform catalog" wide=true hint=concat!(
            "Every team sees these public images in its Environment choice; private images ",
            "belong in a team's own catalog (its page), with the team's registry login.",
        )>
            <CatalogTable catalog remove manages=true />
            <AddImageForm team_id=String::new() action=add />
        </Card>
    }
}
