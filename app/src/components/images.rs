//! What the image pages share (issue 36): the catalog table and its add form (the Images
//! admin page, the team page), the team page's Images section with its registry logins, and
//! the Environment select of the notebook, job and profile forms.

use crate::api::{AddImage, RemoveImage, RemoveRegistryLogin, SetRegistryLogin, UiError};
use crate::components::Card;
use crate::components::{
    Columns, Field, FieldInput, RemoveButton, When, field_error, form_error, unpaged_table,
};
use leptos::prelude::*;
use tessera_domain::image::{CatalogImage, RegistryLoginView};

/// `repo@sha256:0123456789ab…`: a pinned reference short enough for a table cell (the
/// full value goes in the cell's title).
pub fn short_pinned(pinned: &str) -> String {
    match pinned.split_once("@sha256:") {
        Some((repo, hex)) if hex.len() > 12 => format!("{repo}@sha256:{}…", &hex[..12]),
        _ => pinned.to_owned(),
    }
}

/// What an environment select shows for an entry: `name — CUDA ≥ 12.4` when it needs one,
/// with the team's name for a team's own entry when the list mixes teams.
pub fn image_label(image: &CatalogImage, with_team: bool) -> String {
    let mut label = image.name.clone();
    if with_team && let Some(team) = &image.team_name {
        label = format!("{label} ({team})");
    }
    if let Some(cuda) = &image.requires_cuda {
        label = format!("{label} — CUDA ≥ {cuda}");
    }
    label
}

/// A catalog as a table; with `manages`, each row can be removed (after a confirmation).
#[component]
pub fn CatalogTable(
    catalog: Resource<Result<Vec<CatalogImage>, UiError>>,
    remove: ServerAction<RemoveImage>,
    manages: bool,
) -> impl IntoView {
    let headers: &'static [&'static str] = if manages {
        &[
            "Name",
            "Pinned image",
            "CUDA needed",
            "Added by",
            "Added",
            "",
        ]
    } else {
        &["Name", "Pinned image", "CUDA needed", "Added by", "Added"]
    };
    view! {
        {form_error(move || remove.value().get())}
        {unpaged_table(
            catalog,
            Columns::new("catalog", headers),
            || {
                view! { <p data-testid="no-images">"No images yet: workloads run in the node's environment."</p> }
                    .into_any()
            },
            move |image: CatalogImage| view! { <CatalogRow image remove manages /> },
        )}
    }
}

#[component]
fn CatalogRow(
    image: CatalogImage,
    remove: ServerAction<RemoveImage>,
    manages: bool,
) -> impl IntoView {
    let question = format!("Remove {} from the catalog?", image.name);
    let cuda = image
        .requires_cuda
        .as_ref()
        .map(|c| format!("≥ {c}"))
        .unwrap_or_else(|| "—".to_owned());
    let action = manages.then(|| {
        view! {
            <td class="actions">
                <ActionForm action=remove attr:class="row-form">
                    <RemoveButton name="id" value=image.id.to_string() question />
                </ActionForm>
            </td>
        }
    });
    view! {
        <tr data-testid="catalog-image" data-name=image.name.clone()>
            <td>{image.name.clone()}</td>
            <td>
                <code title=image.pinned.clone()>{short_pinned(&image.pinned)}</code>
            </td>
            <td>{cuda}</td>
            <td>{image.added_by.clone()}</td>
            <td>
                <When t=image.created_at />
            </td>
            {action}
        </tr>
    }
}

/// Adds an entry: the platform's (`team_id` empty) or a team's.
#[component]
pub fn AddImageForm(team_id: String, action: ServerAction<AddImage>) -> impl IntoView {
    let value = move || action.value().get();
    let added = move || {
        action.value().get().and_then(Result::ok).map(|i| {
            view! {
                <div class="notice" role="status" data-testid="image-added">
                    {format!("{} added, pinned to ", i.name)}
                    <code title=i.pinned.clone()>{short_pinned(&i.pinned)}</code>
                    "."
                </div>
            }
        })
    };
    let prefix = if team_id.is_empty() {
        "platform"
    } else {
        "team"
    };
    let name_id = format!("{prefix}-image-name");
    let ref_id = format!("{prefix}-image-ref");
    view! {
        <h3>"Add an image"</h3>
        {added}
        <ActionForm action=action attr:data-testid="add-image-form" attr:novalidate=true>
            {form_error(value)}
            <input type="hidden" name="team_id" value=team_id />
            <div class="field-row">
                <div>
                    <Field result=value id=name_id name="name" label="Name" keep=true
                        input=FieldInput::text()
                            .maxlength("60")
                            .placeholder("PyTorch 2.3 (CUDA 12.4)")
                            .required() />
                </div>
                <div>
                    <Field result=value id=ref_id name="reference" label="Image reference" keep=true
                        input=FieldInput::text().placeholder("ghcr.io/acme/pytorch:2.3-cuda12.4").required() />
                    {field_error(value, "image")}
                </div>
            </div>
            <p class="hint">
                "From an allowed registry. Its digest is looked up now and pinned; adding takes a "
                "moment while the registry answers."
            </p>
            <button type="submit" disabled=move || action.pending().get()>
                {move || if action.pending().get() { "Adding…" } else { "Add image" }}
            </button>
        </ActionForm>
    }
}

/// The team page's Images section: the team's own catalog entries (its admins add and
/// remove them; members read them) and, for its admins, its registry logins.
#[component]
pub fn TeamImages(
    team_id: String,
    manages: bool,
    catalog: Resource<Result<Vec<CatalogImage>, UiError>>,
    add: ServerAction<AddImage>,
    remove: ServerAction<RemoveImage>,
    logins: Resource<Result<Vec<RegistryLoginView>, UiError>>,
    set_login: ServerAction<SetRegistryLogin>,
    remove_login: ServerAction<RemoveRegistryLogin>,
) -> impl IntoView {
    let add_form = manages.then(|| view! { <AddImageForm team_id=team_id.clone() action=add /> });
    let login_part = manages.then(|| {
        view! { <TeamLogins team_id=team_id.clone() logins set=set_login remove=remove_login /> }
    });
    view! {
        <Card id="team-images" title="Images" wide=true testid="team-images" hint=concat!(
            "The team's own images, beside the platform's, in the Environment choice of its ",
            "notebooks and jobs. Only this team sees and runs them.",
        )>
            <CatalogTable catalog remove manages />
            {add_form}
            {login_part}
        </Card>
    }
}

#[component]
fn TeamLogins(
    team_id: String,
    logins: Resource<Result<Vec<RegistryLoginView>, UiError>>,
    set: ServerAction<SetRegistryLogin>,
    remove: ServerAction<RemoveRegistryLogin>,
) -> impl IntoView {
    let value = move || set.value().get();
    let row_team = team_id.clone();
    view! {
        <h3>"Registry logins"</h3>
        <p class="hint">
            "Used to pull this team's private images, only on the nodes that run its workloads. "
            "A password or token is stored sealed and never shown again."
        </p>
        {form_error(move || remove.value().get())}
        {unpaged_table(
            logins,
            Columns::new("registry-logins", &["Registry", "Username", "Updated", ""]),
            || view! { <p data-testid="no-logins">"No registry logins: only public images can be pulled."</p> }.into_any(),
            move |login: RegistryLoginView| {
                let question = format!("Remove the login to {}?", login.registry);
                let (shown, value) = (login.registry.clone(), login.registry.clone());
                let team = row_team.clone();
                view! {
                    <tr data-testid="registry-login" data-registry=login.registry>
                        <td>
                            <code>{shown}</code>
                        </td>
                        <td>{login.username.clone()}</td>
                        <td>
                            <When t=login.updated_at />
                        </td>
                        <td class="actions">
                            <ActionForm action=remove attr:class="row-form">
                                <input type="hidden" name="team_id" value=team />
                                <RemoveButton name="registry" value question />
                            </ActionForm>
                        </td>
                    </tr>
                }
            },
        )}
        <ActionForm action=set attr:data-testid="login-form" attr:novalidate=true>
            <input type="hidden" name="team_id" value=team_id />
            {form_error(value)}
            <div class="field-row three">
                <div>
                    <Field result=value id="login-registry" name="registry" label="Registry" keep=true
                        input=FieldInput::text().placeholder("ghcr.io").required() />
                </div>
                <div>
                    <Field result=value id="login-username" name="username" label="Username" keep=true
                        input=FieldInput::text().required() />
                </div>
                <div>
                    <Field result=value id="login-password" name="password" label="Password or token"
                        input=FieldInput::of("password").autocomplete("off").required() />
                </div>
            </div>
            <button type="submit" disabled=move || set.pending().get()>
                "Save login"
            </button>
        </ActionForm>
    }
}

/// The value of the "Node environment (default)" choice: no image.
pub const NODE_ENVIRONMENT: &str = "";

/// The options of an Environment select, in order: the node's environment (the default,
/// value empty), then the entries given (platform first, then teams': see
/// [`crate::api::list_images`]), valued by id. Team names show when entries of several teams mix.
pub fn environment_options(images: &[CatalogImage]) -> Vec<(String, String)> {
    let mut teams: Vec<_> = images.iter().filter_map(|i| i.team_id).collect();
    teams.sort();
    teams.dedup();
    let with_team = teams.len() > 1;
    std::iter::once((
        NODE_ENVIRONMENT.to_owned(),
        "Node environment (default)".to_owned(),
    ))
    .chain(
        images
            .iter()
            .map(|i| (i.id.to_string(), image_label(i, with_team))),
    )
    .collect()
}

/// An Environment select (`name="image"`) over `images`, `chosen` preselected (empty: the
/// node's environment).
#[component]
pub fn EnvironmentSelect(
    input_id: &'static str,
    images: Vec<CatalogImage>,
    #[prop(into, optional)] chosen: String,
) -> impl IntoView {
    let hint_id = format!("{input_id}-hint");
    let options = environment_options(&images)
        .into_iter()
        .map(|(value, label)| {
            let selected = value == chosen;
            view! { <option value=value selected=selected>{label}</option> }
        })
        .collect_view();
    view! {
        <label for=input_id>"Environment"</label>
        <select id=input_id name="image" aria-describedby=hint_id.clone() data-testid="environment">
            {options}
        </select>
        <p class="hint" id=hint_id>
            "The software it runs in: the node's own, or an image from the catalog (pulled "
            "to the node first; the workload page shows the progress)."
        </p>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn a_pinned_reference_is_shortened_to_twelve_digits() {
        let pinned = format!("ghcr.io/acme/torch@sha256:{HEX}");
        assert_eq!(
            short_pinned(&pinned),
            "ghcr.io/acme/torch@sha256:0123456789ab…"
        );
        assert_eq!(short_pinned("ghcr.io/acme/torch:1"), "ghcr.io/acme/torch:1");
    }

    fn entry(team: Option<&str>, cuda: Option<&str>) -> CatalogImage {
        CatalogImage {
            id: uuid::Uuid::nil(),
            team_id: team.map(|_| uuid::Uuid::nil()),
            team_name: team.map(str::to_owned),
            name: "PyTorch".into(),
            reference: "ghcr.io/acme/torch:1".into(),
            pinned: format!("ghcr.io/acme/torch@sha256:{HEX}"),
            requires_cuda: cuda.map(|c| {
                tessera_domain::image::CudaVersion::parse(c).unwrap_or_else(|e| panic!("{c}: {e}"))
            }),
            added_by: "admin".into(),
            created_at: chrono::Utc::now(),
        }
    }

    #[test]
    fn an_environment_label_names_the_cuda_it_needs_and_a_teams_entry_its_team() {
        assert_eq!(image_label(&entry(None, None), true), "PyTorch");
        assert_eq!(
            image_label(&entry(None, Some("12.4")), true),
            "PyTorch — CUDA ≥ 12.4"
        );
        assert_eq!(
            image_label(&entry(Some("vision"), Some("12.4")), true),
            "PyTorch (vision) — CUDA ≥ 12.4"
        );
        assert_eq!(image_label(&entry(Some("vision"), None), false), "PyTorch");
    }

    #[test]
    fn the_node_environment_comes_first_and_is_the_empty_value() {
        let mut team = entry(Some("vision"), Some("12.4"));
        team.id = uuid::Uuid::from_u128(7);
        let options = environment_options(&[entry(None, None), team]);
        assert_eq!(
            options[0],
            (String::new(), "Node environment (default)".to_owned())
        );
        assert_eq!(options[1].1, "PyTorch");
        assert_eq!(
            options[2],
            (
                uuid::Uuid::from_u128(7).to_string(),
                "PyTorch — CUDA ≥ 12.4".to_owned()
            )
        );
        assert_eq!(environment_options(&[]).len(), 1);
    }

    #[cfg(feature = "ssr")]
    #[test]
    fn the_select_posts_image_and_keeps_the_choice_made() {
        let mut team = entry(Some("vision"), None);
        team.id = uuid::Uuid::from_u128(9);
        let chosen = team.id.to_string();
        let html = Owner::new().with(|| {
            view! { <EnvironmentSelect input_id="x-image" images=vec![entry(None, None), team] chosen /> }
                .to_html()
        });
        assert!(html.contains(r#"name="image""#), "{html}");
        let first = html
            .find("Node environment (default)")
            .unwrap_or(usize::MAX);
        let platform = html.find(">PyTorch<").unwrap_or(0);
        assert!(first < platform, "the default comes first: {html}");
        assert_eq!(html.matches("selected").count(), 1, "{html}");
        let selected = html.find("selected").unwrap_or(0);
        assert!(
            html[..selected].ends_with(&format!(r#"value="{}" "#, uuid::Uuid::from_u128(9))),
            "{html}"
        );
    }
}
