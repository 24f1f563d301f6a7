//! Teams: the list (platform admins see all, others their own) and one team's page with its
//! members. Another team's page answers exactly like a missing one: "Not found".

use crate::api::{
    self, AddImage, AddMember, AddTeamWebhook, ChangeRole, CreateTeam, DeleteNotebookProfile,
    DeleteTeamWebhook, RemoveMember, RenameTeam, SaveNotebookProfile, SetQuota, SetTeamArchived,
    SetTeamGrace, SetTeamPriority, SetTeamWebhookEnabled, TeamWebhookDeliveries, TestTeamWebhook,
};
use crate::api::{RemoveImage, RemoveRegistryLogin, SetRegistryLogin};
use crate::components::Card;
use crate::components::images::{EnvironmentSelect, TeamImages};
use crate::components::list_table;
use crate::components::{
    Authenticated, Columns, Empty, Field, FieldInput, Loaded, Loading, PAGE_SIZE, Problem,
    SecretBox, When, at, echoed, field_error, form_error, is_admin, paged_table, unpaged_table,
    use_offset,
};
use leptos::prelude::*;
use leptos_router::hooks::use_params_map;
use tessera_domain::alloc::{HighGrant, QuotaView};
use tessera_domain::billing::{BudgetView, format_minor};
use tessera_domain::error::AppError;
use tessera_domain::image::{CatalogImage, RegistryLoginView};
use tessera_domain::mig::Catalog;
use tessera_domain::notify::{DeliveryView, WebhookTestResult, WebhookView};
use tessera_domain::tenancy::{MemberView, Page, PageRequest, TeamRole, TeamView};
use tessera_domain::workload::NotebookProfile;

#[component]
pub fn TeamsPage() -> impl IntoView {
    // Created here, outside `Authenticated`, like the nodes page (see the comment there).
    let offset = use_offset();
    let create = ServerAction::<CreateTeam>::new();
    let teams = Resource::new(
        move || (offset.get(), create.version().get()),
        |(offset, _)| api::list_teams(PageRequest::new(offset, PAGE_SIZE)),
    );
    view! {
        <Authenticated>
            <h1>"Teams"</h1>
            <TeamList teams create />
        </Authenticated>
    }
}

#[component]
fn TeamList(
    teams: Resource<Result<Page<TeamView>, api::UiError>>,
    create: ServerAction<CreateTeam>,
) -> impl IntoView {
    let admin = is_admin();
    view! {
        {admin.then(|| view! { <CreateTeamForm action=create /> })}
        <section class="card wide">
            <h2>{if admin { "All teams" } else { "Your teams" }}</h2>
            {paged_table(
                teams,
                at("/teams"),
                Columns::new("teams", &["Name", "Members", "Your role", "Created"]),
                move || if admin { "No teams yet. Create the first one above." } else { "You are not in any team yet. Ask a team admin to add you." }.into_any(),
                team_row,
            )}
        </section>
    }
}

fn team_row(team: TeamView) -> impl IntoView {
    view! {
        <tr>
            <td>
                <a href=format!("/teams/{}", team.id)>{team.name.clone()}</a>
                {team.archived.then(|| view! { " " <span class="badge muted">"archived"</span> })}
            </td>
            <td>{team.member_count}</td>
            <td>{role_label(team.my_role)}</td>
            <td>
                <When t=team.created_at />
            </td>
        </tr>
    }
}

fn role_label(role: Option<TeamRole>) -> &'static str {
    role.map_or("—", TeamRole::label)
}

#[component]
fn CreateTeamForm(action: ServerAction<CreateTeam>) -> impl IntoView {
    let value = move || action.value().get();
    let created = move || {
        action.value().get().and_then(Result::ok).map(|t| {
            view! {
                <div class="notice" role="status">
                    "Team " <a href=format!("/teams/{}", t.id)>{t.name}</a> " created."
                </div>
            }
        })
    };
    view! {
        <section class="card">
            <h2>"Create a team"</h2>
            {created}
            <ActionForm action=action attr:id="create-team" attr:novalidate=true>
                {form_error(value)}
                <Field result=value id="team-name" name="name" label="Name"
                    input=FieldInput::text().required() />
                <p class="hint">"2–64 letters, digits, spaces, '-', '_' or '.'."</p>
                <button type="submit" class="primary" disabled=move || action.pending().get()>
                    "Create team"
                </button>
            </ActionForm>
        </section>
    }
}

/// The team page's mutations; every one refreshes the team and its members.
#[derive(Clone, Copy)]
struct TeamActions {
    rename: ServerAction<RenameTeam>,
    archive: ServerAction<SetTeamArchived>,
    add: ServerAction<AddMember>,
    change: ServerAction<ChangeRole>,
    remove: ServerAction<RemoveMember>,
    priority: ServerAction<SetTeamPriority>,
}

impl TeamActions {
    fn version(&self) -> (usize, usize, usize, usize, usize, usize) {
        (
            self.rename.version().get(),
            self.archive.version().get(),
            self.add.version().get(),
            self.change.version().get(),
            self.remove.version().get(),
            self.priority.version().get(),
        )
    }
}

#[component]
pub fn TeamPage() -> impl IntoView {
    // Created here, outside `Authenticated`, like the nodes page (see the comment there).
    let data = TeamData::new();
    view! {
        <Authenticated>
            <TeamDetail data />
        </Authenticated>
    }
}

/// What the team page loads and the actions that change it.
#[derive(Clone, Copy)]
struct TeamData {
    actions: TeamActions,
    team: Resource<Result<TeamView, api::UiError>>,
    members: Resource<Result<Page<MemberView>, api::UiError>>,
    quotas: Resource<Result<Vec<QuotaView>, api::UiError>>,
    set_quota: ServerAction<SetQuota>,
    budget: Resource<Result<BudgetView, api::UiError>>,
    profiles: Resource<Result<Vec<NotebookProfile>, api::UiError>>,
    save_profile: ServerAction<SaveNotebookProfile>,
    delete_profile: ServerAction<DeleteNotebookProfile>,
    webhooks: Resource<Result<Vec<WebhookView>, api::UiError>>,
    add_hook: ServerAction<AddTeamWebhook>,
    delete_hook: ServerAction<DeleteTeamWebhook>,
    toggle_hook: ServerAction<SetTeamWebhookEnabled>,
    grace: Resource<Result<tessera_domain::drain::TeamGrace, api::UiError>>,
    set_grace: ServerAction<SetTeamGrace>,
    images: TeamImagesData,
}

/// The team's own catalog entries and registry logins, and the actions that change them.
#[derive(Clone, Copy)]
struct TeamImagesData {
    /// What the team may run: platform entries and its own (the profile form's select).
    seen: Resource<Result<Vec<CatalogImage>, api::UiError>>,
    /// The team's own entries.
    catalog: Resource<Result<Vec<CatalogImage>, api::UiError>>,
    add: ServerAction<AddImage>,
    remove: ServerAction<RemoveImage>,
    logins: Resource<Result<Vec<RegistryLoginView>, api::UiError>>,
    set_login: ServerAction<SetRegistryLogin>,
    remove_login: ServerAction<RemoveRegistryLogin>,
}

impl TeamImagesData {
    fn new(id: Memo<String>) -> Self {
        let add = ServerAction::<AddImage>::new();
        let remove = ServerAction::<RemoveImage>::new();
        let set_login = ServerAction::<SetRegistryLogin>::new();
        let remove_login = ServerAction::<RemoveRegistryLogin>::new();
        let catalog = Resource::new(
            move || (id.get(), add.version().get(), remove.version().get()),
            |(id, ..)| async move {
                let own = uuid::Uuid::parse_str(&id).ok();
                api::list_images(id).await.map(|l| {
                    l.into_iter()
                        .filter(|i| i.team_id.is_some() && i.team_id == own)
                        .collect()
                })
            },
        );
        let seen = Resource::new(
            move || (id.get(), add.version().get(), remove.version().get()),
            |(id, ..)| api::list_images(id),
        );
        // Only the team's admins may read its logins (the section shows them only to them):
        // anyone else gets an empty list rather than an error.
        let logins = Resource::new(
            move || {
                (
                    id.get(),
                    set_login.version().get(),
                    remove_login.version().get(),
                )
            },
            |(id, ..)| async move {
                match api::registry_logins(id).await {
                    Err(e) if e.error == AppError::Forbidden => Ok(Vec::new()),
                    other => other,
                }
            },
        );
        TeamImagesData {
            seen,
            catalog,
            add,
            remove,
            logins,
            set_login,
            remove_login,
        }
    }
}

impl TeamData {
    fn new() -> Self {
        let params = use_params_map();
        let id = Memo::new(move |_| params.read().get("id").unwrap_or_default());
        let offset = use_offset();
        let actions = TeamActions {
            rename: ServerAction::new(),
            archive: ServerAction::new(),
            add: ServerAction::new(),
            change: ServerAction::new(),
            remove: ServerAction::new(),
            priority: ServerAction::new(),
        };
        let set_quota = ServerAction::<SetQuota>::new();
        let team = Resource::new(
            move || (id.get(), actions.version()),
            |(id, _)| api::get_team(id),
        );
        let members = Resource::new(
            move || (id.get(), offset.get(), actions.version()),
            |(id, offset, _)| api::list_members(id, PageRequest::new(offset, PAGE_SIZE)),
        );
        let quotas = Resource::new(
            move || (id.get(), set_quota.version().get()),
            |(id, _)| api::list_quotas(id),
        );
        let budget = Resource::new(move || id.get(), api::team_budget);
        let save_profile = ServerAction::<SaveNotebookProfile>::new();
        let delete_profile = ServerAction::<DeleteNotebookProfile>::new();
        let profiles = Resource::new(
            move || {
                (
                    id.get(),
                    save_profile.version().get(),
                    delete_profile.version().get(),
                )
            },
            |(id, ..)| api::notebook_profiles(id),
        );
        let add_hook = ServerAction::<AddTeamWebhook>::new();
        let delete_hook = ServerAction::<DeleteTeamWebhook>::new();
        let toggle_hook = ServerAction::<SetTeamWebhookEnabled>::new();
        let webhooks = Resource::new(
            move || {
                (
                    id.get(),
                    add_hook.version().get(),
                    delete_hook.version().get(),
                    toggle_hook.version().get(),
                )
            },
            |(id, ..)| api::team_webhooks(id),
        );
        // Made with the page's other resources (not inside the resolved team view), so the
        // server and the hydrating browser create resources in the same order.
        let set_grace = ServerAction::<SetTeamGrace>::new();
        let grace = Resource::new(
            move || (id.get(), set_grace.version().get()),
            |(id, _)| api::team_grace(id),
        );
        let images = TeamImagesData::new(id);
        TeamData {
            grace,
            set_grace,
            images,
            actions,
            team,
            members,
            quotas,
            set_quota,
            budget,
            profiles,
            save_profile,
            delete_profile,
            webhooks,
            add_hook,
            delete_hook,
            toggle_hook,
        }
    }
}

#[component]
fn TeamDetail(data: TeamData) -> impl IntoView {
    let team = data.team;
    view! {
        <a class="back" href="/teams">
            "← Teams"
        </a>
        <Loaded resource=team heading="Team" let:team>
            <TeamOverview team data />
        </Loaded>
    }
}

#[component]
fn TeamOverview(team: TeamView, data: TeamData) -> impl IntoView {
    let platform_admin = is_admin();
    let writable = !team.archived;
    let manages =
        writable && (platform_admin || team.my_role.is_some_and(TeamRole::manages_members));
    let team_id = team.id.to_string();
    let path = format!("/teams/{team_id}");
    let my_role = match team.my_role {
        Some(r) => r.label(),
        None => "not a member (platform admin)",
    };
    let member_list = {
        let team_id = team_id.clone();
        let headers: &[&str] = if manages {
            &["User", "Role", "Added", "Manage"]
        } else {
            &["User", "Role", "Added"]
        };
        paged_table(
            data.members,
            at(path),
            Columns::new("members", headers),
            || "No members yet.".into_any(),
            move |m| view! { <MemberRow member=m team_id=team_id.clone() manages actions=data.actions /> },
        )
    };
    let member_notice = move || {
        let change = data.actions.change.value().get().and_then(Result::ok);
        let add = data.actions.add.value().get().and_then(Result::ok);
        change
            .map(|m| format!("{} is now {}.", m.username, m.role.label()))
            .or_else(|| add.map(|m| format!("{} added as {}.", m.username, m.role.label())))
            .map(|text| view! { <div class="notice" role="status">{text}</div> })
    };
    view! {
        <h1>
            {team.name.clone()}
            {team.archived.then(|| view! { " " <span class="badge muted">"archived"</span> })}
        </h1>
        <p class="hint" data-testid="my-role">
            "Your role: " {my_role} " · "
            {match team.member_count {
                1 => "1 member".to_owned(),
                n => format!("{n} members"),
            }} " · created "
            <When t=team.created_at />
        </p>
        {team
            .archived
            .then(|| {
                view! {
                    <div class="notice muted" role="status">
                        "This team is archived and read-only."
                    </div>
                }
            })}
        <section class="card wide">
            <h2>"Members"</h2>
            {member_notice}
            {form_error(move || data.actions.change.value().get())}
            {form_error(move || data.actions.remove.value().get())}
            {member_list}
        </section>
        <TeamQuotas quotas=data.quotas />
        <TeamProfiles
            team_id=team_id.clone()
            profiles=data.profiles
            quotas=data.quotas
            images=data.images.seen
            manages
            save=data.save_profile
            delete=data.delete_profile
        />
        <TeamImages
            team_id=team_id.clone()
            manages
            catalog=data.images.catalog
            add=data.images.add
            remove=data.images.remove
            logins=data.images.logins
            set_login=data.images.set_login
            remove_login=data.images.remove_login
        />
        {manages
            .then(|| {
                view! {
                    <TeamWebhooks
                        team_id=team_id.clone()
                        webhooks=data.webhooks
                        add=data.add_hook
                        delete=data.delete_hook
                        toggle=data.toggle_hook
                    />
                }
            })}
        <TeamGraceCard team_id=team_id.clone() manages grace=data.grace action=data.set_grace />
        <TeamSpend
            team_id=team_id.clone()
            budget=data.budget
            finance=platform_admin || team.my_role.is_some_and(TeamRole::manages_members)
        />
        {platform_admin
            .then(|| view! { <SetQuotaForm team_id=team_id.clone() action=data.set_quota /> })}
        {platform_admin
            .then(|| {
                view! {
                    <PriorityGrantForm
                        team_id=team_id.clone()
                        grant=team.high_priority
                        action=data.actions.priority
                    />
                }
            })}
        <div class="columns">
            {manages
                .then(|| view! { <AddMemberForm team_id=team_id.clone() action=data.actions.add /> })}
            {manages
                .then(|| {
                    view! {
                        <RenameTeamForm
                            team_id=team_id.clone()
                            name=team.name.clone()
                            action=data.actions.rename
                        />
                    }
                })}
            {platform_admin
                .then(|| {
                    view! {
                        <ArchiveTeamForm
                            team_id=team_id.clone()
                            archived=team.archived
                            action=data.actions.archive
                        />
                    }
                })}
        </div>
    }
}

#[component]
fn RoleSelect(
    #[prop(into)] id: String,
    #[prop(into)] selected: Signal<String>,
    #[prop(optional)] label: Option<&'static str>,
) -> impl IntoView {
    let options = TeamRole::ALL
        .iter()
        .map(|r| {
            let value = r.as_str();
            view! {
                <option value=value selected=move || selected.get() == value>
                    {r.label()}
                </option>
            }
        })
        .collect_view();
    view! {
        {label.map(|l| view! { <label for=id.clone()>{l}</label> })}
        <select id=id name="role" prop:value=move || selected.get()>
            {options}
        </select>
    }
}

#[component]
fn MemberRow(
    member: MemberView,
    team_id: String,
    manages: bool,
    actions: TeamActions,
) -> impl IntoView {
    let user_id = member.user_id.to_string();
    let role_label = format!("Role of {}", member.username);
    let manage = manages.then(|| {
        let role_id = format!("role-{user_id}");
        let role = member.role.as_str().to_owned();
        let (team_a, user_a) = (team_id.clone(), user_id.clone());
        let (team_b, user_b) = (team_id, user_id);
        view! {
            <td class="actions">
                <ActionForm action=actions.change attr:class="row-form">
                    <input type="hidden" name="team_id" value=team_a />
                    <input type="hidden" name="user_id" value=user_a />
                    <label class="visually-hidden" for=role_id.clone()>
                        {role_label}
                    </label>
                    <RoleSelect id=role_id selected=Signal::derive(move || role.clone()) />
                    <button type="submit" disabled=move || actions.change.pending().get()>
                        "Change"
                    </button>
                </ActionForm>
                <ActionForm action=actions.remove attr:class="row-form">
                    <input type="hidden" name="team_id" value=team_b />
                    <input type="hidden" name="user_id" value=user_b />
                    <button
                        type="submit"
                        class="danger"
                        disabled=move || actions.remove.pending().get()
                    >
                        "Remove"
                    </button>
                </ActionForm>
            </td>
        }
    });
    view! {
        <tr data-testid="member" data-username=member.username.clone()>
            <td>
                {member.username.clone()}
                {member
                    .disabled
                    .then(|| view! { " " <span class="badge danger">"disabled"</span> })}
            </td>
            <td data-testid="member-role">{member.role.label()}</td>
            <td>
                <When t=member.added_at />
            </td>
            {manage}
        </tr>
    }
}

#[component]
fn AddMemberForm(team_id: String, action: ServerAction<AddMember>) -> impl IntoView {
    let value = move || action.value().get();
    let role = echoed(value, "role");
    let selected = Signal::derive(move || {
        let r = role();
        if r.is_empty() { "member".to_owned() } else { r }
    });
    view! {
        <section class="card">
            <h2>"Add a member"</h2>
            <ActionForm action=action attr:id="add-member" attr:novalidate=true>
                <input type="hidden" name="team_id" value=team_id />
                {form_error(value)}
                <Field result=value id="member-username" name="username" label="Username"
                    input=FieldInput::text().required() />
                <RoleSelect id="member-role" selected label="Role" />
                {field_error(value, "role")}
                <button type="submit" class="primary" disabled=move || action.pending().get()>
                    "Add member"
                </button>
            </ActionForm>
        </section>
    }
}

#[component]
fn RenameTeamForm(
    team_id: String,
    name: String,
    action: ServerAction<RenameTeam>,
) -> impl IntoView {
    let value = move || action.value().get();
    view! {
        <section class="card">
            <h2>"Rename"</h2>
            <ActionForm action=action attr:id="rename-team" attr:novalidate=true>
                <input type="hidden" name="team_id" value=team_id />
                {form_error(value)}
                <Field result=value id="rename-name" name="name" label="Name"
                    input=FieldInput::text().required() default=name />
                <button type="submit" class="primary" disabled=move || action.pending().get()>
                    "Rename team"
                </button>
            </ActionForm>
        </section>
    }
}

#[component]
fn ArchiveTeamForm(
    team_id: String,
    archived: bool,
    action: ServerAction<SetTeamArchived>,
) -> impl IntoView {
    let value = move || action.value().get();
    let (title, text, button) = if archived {
        (
            "Unarchive",
            "Members can be changed again.",
            "Unarchive team",
        )
    } else {
        (
            "Archive",
            "An archived team is read-only: its members stay, but nobody can change them.",
            "Archive team",
        )
    };
    view! {
        <section class="card">
            <h2>{title}</h2>
            <p class="hint">{text}</p>
            <ActionForm action=action attr:id="archive-team">
                <input type="hidden" name="team_id" value=team_id />
                <input type="hidden" name="archived" value=(!archived).to_string() />
                {form_error(value)}
                <button type="submit" disabled=move || action.pending().get()>
                    {button}
                </button>
            </ActionForm>
        </section>
    }
}

/// The team's GPU quotas and how much of each is in use.
#[component]
fn TeamQuotas(quotas: Resource<Result<Vec<QuotaView>, api::UiError>>) -> impl IntoView {
    view! {
        <Card id="quotas" title="GPU quotas" wide=true hint=concat!(
            "In units (compute slices): a whole H100 is 7, a 1g slice 1. Use beyond the ",
            "guarantee is borrowed and may be preempted; beyond the per-user cap or the ",
            "limit a request waits for approval.",
        )>
            {unpaged_table(
                quotas,
                Columns::new(
                    "quotas",
                    &["Model", "Guaranteed", "Limit", "Per user", "Used", "Borrowed", "Usage"],
                ),
                || {
                    view! {
                        <p data-testid="no-quotas">
                            "No GPU quota yet: members cannot request GPUs until a platform admin sets one."
                        </p>
                    }
                        .into_any()
                },
                quota_row,
            )}
        </Card>
    }
}

/// The team's notebook profiles (what "Start a notebook" offers its members in one click),
/// with a form for the team's admins.
#[component]
fn TeamProfiles(
    team_id: String,
    profiles: Resource<Result<Vec<NotebookProfile>, api::UiError>>,
    quotas: Resource<Result<Vec<QuotaView>, api::UiError>>,
    /// The catalog the team sees, for the profile's environment.
    images: Resource<Result<Vec<CatalogImage>, api::UiError>>,
    manages: bool,
    save: ServerAction<SaveNotebookProfile>,
    delete: ServerAction<DeleteNotebookProfile>,
) -> impl IntoView {
    let list = {
        let team_id = team_id.clone();
        let headers: &[&str] = if manages {
            &["Profile", "GPU", "Hours", "Environment", "Manage"]
        } else {
            &["Profile", "GPU", "Hours", "Environment"]
        };
        unpaged_table(
            profiles,
            Columns::new("profiles", headers),
            || {
                view! {
                    <p data-testid="no-profiles">
                        "No notebook profiles: members choose a GPU and hours themselves."
                    </p>
                }
                .into_any()
            },
            move |p| {
                let (team_id, profile_id) = (team_id.clone(), p.id.to_string());
                let remove = manages.then(move || {
                    view! {
                        <td>
                            <ActionForm action=delete>
                                <input type="hidden" name="team_id" value=team_id />
                                <input type="hidden" name="id" value=profile_id />
                                <button type="submit" class="link danger">"Delete"</button>
                            </ActionForm>
                        </td>
                    }
                });
                let name = p.name.clone();
                let environment = p
                    .image_name
                    .unwrap_or_else(|| "Node environment".to_owned());
                view! {
                    <tr data-testid="profile-row" data-name=name>
                        <td>{p.name}</td>
                        <td>{p.kind_label}</td>
                        <td>{format!("{} h", p.hours)}</td>
                        <td data-testid="profile-environment">{environment}</td>
                        {remove}
                    </tr>
                }
            },
        )
    };
    let form = manages.then(|| {
        let value = move || save.value().get();
        let kinds = move || {
            Suspend::new(async move {
                let catalog = Catalog::builtin();
                let mut models: Vec<String> = quotas
                    .await
                    .map(|qs| qs.into_iter().filter(|q| q.limit > 0).map(|q| q.model).collect())
                    .unwrap_or_default();
                models.sort();
                models.dedup();
                models
                    .iter()
                    .flat_map(|m| crate::components::kind_options(&catalog, m))
                    .map(|(v, label)| view! { <option value=v>{label}</option> })
                    .collect_view()
            })
        };
        let environment = move || {
            Suspend::new(async move {
                let list = images.await.unwrap_or_default();
                view! { <EnvironmentSelect input_id="profile-image" images=list /> }
            })
        };
        view! {
            <ActionForm action=save attr:data-testid="profile-form" attr:novalidate=true>
                {form_error(value)}
                <input type="hidden" name="team_id" value=team_id.clone() />
                <div class="field-row three">
                    <div>
                        <label for="profile-name">"Name"</label>
                        <input id="profile-name" name="name" maxlength="40" placeholder="Small" required />
                        {field_error(value, "name")}
                    </div>
                    <div>
                        <Field result=value id="profile-kind" name="kind" label="GPU or MIG slice">
                            <Transition fallback=|| ()>{kinds}</Transition>
                        </Field>
                    </div>
                    <div>
                        <label for="profile-hours">"Hours"</label>
                        <input id="profile-hours" name="hours" type="number" min="1" value="8" inputmode="numeric" />
                        {field_error(value, "hours")}
                    </div>
                </div>
                <Transition fallback=|| ()>{environment}</Transition>
                {field_error(value, "image")}
                <button type="submit" disabled=move || save.pending().get()>
                    "Save profile"
                </button>
            </ActionForm>
        }
    });
    view! {
        <Card id="profiles" title="Notebook profiles" wide=true hint=concat!(
            "What members start a notebook with in one click: a GPU and how long it may run. ",
            "The notebook waits for that GPU in the team's queue and gives it back when it stops.",
        )>
            {form_error(move || delete.value().get())}
            {list}
            {form}
        </Card>
    }
}

fn quota_row(q: QuotaView) -> impl IntoView {
    let pct = if q.limit == 0 {
        0.0
    } else {
        (f64::from(q.used) / f64::from(q.limit) * 100.0).min(100.0)
    };
    view! {
        <tr data-testid="quota-row" data-model=q.model.clone()>
            <td>{q.model.clone()}</td>
            <td>{q.guaranteed}</td>
            <td>{q.limit}</td>
            <td>{q.per_user}</td>
            <td data-testid="quota-used">
                {q.used}
                {(q.overridden > 0)
                    .then(|| {
                        view! {
                            " "
                            <span
                                class="badge warn"
                                data-testid="quota-overridden"
                                title="A platform admin approved these units beyond the limit"
                            >
                                {format!("{} by override", q.overridden)}
                            </span>
                        }
                    })}
            </td>
            <td>{q.borrowed}</td>
            <td>
                <span
                    class="meter"
                    role="meter"
                    aria-label=format!("{} quota in use", q.model)
                    aria-valuemin="0"
                    aria-valuemax=q.limit.to_string()
                    aria-valuenow=q.used.to_string()
                    title=format!("{} of {} units in use", q.used, q.limit)
                >
                    <span style=format!("width: {pct:.1}%")></span>
                </span>
            </td>
        </tr>
    }
}

/// The team's grace before an early stop of its work (the deadline channel): what applies
/// and the platform maximum; team admins and platform admins change it.
#[component]
fn TeamGraceCard(
    team_id: String,
    manages: bool,
    grace: Resource<Result<tessera_domain::drain::TeamGrace, api::UiError>>,
    action: ServerAction<SetTeamGrace>,
) -> impl IntoView {
    let value = move || action.value().get();
    view! {
        <Card id="grace" title="Warning before an early stop">
            <Transition fallback=Loading>
                {move || {
                    let team_id = team_id.clone();
                    Suspend::new(async move {
                    match grace.await {
                        Ok(g) => {
                            let own = g.preemption_grace_secs.map(|s| s.to_string()).unwrap_or_default();
                            let text = format!(
                                "Work of this team is warned {} s before a preemption or a booking stops it ({}; platform maximum {} s). A stop by a user warns at most 30 s of it.",
                                g.effective_secs,
                                if g.preemption_grace_secs.is_some() { "the team's grace" } else { "the platform maximum" },
                                g.max_secs,
                            );
                            view! {
                                <p class="hint" data-testid="team-grace">{text}</p>
                                {manages.then(|| view! {
                                    <ActionForm action=action attr:data-testid="grace-form" attr:novalidate=true>
                                        <input type="hidden" name="team_id" value=team_id.clone() />
                                        {form_error(value)}
                                        <label for="grace-secs">"Grace in seconds (empty: the platform maximum)"</label>
                                        <input
                                            id="grace-secs"
                                            name="secs"
                                            type="number"
                                            min="0"
                                            max=g.max_secs.to_string()
                                            inputmode="numeric"
                                            value=own
                                        />
                                        {field_error(value, "preemption_grace_secs")}
                                        <button type="submit" class="primary" disabled=move || action.pending().get()>
                                            "Save"
                                        </button>
                                    </ActionForm>
                                })}
                            }
                                .into_any()
                        }
                        Err(e) => view! { <Problem error=e.error /> }.into_any(),
                    }
                    })
                }}
            </Transition>
        </Card>
    }
}

/// Platform admins grant a team `high` priority, with an optional cap, or withdraw it.
#[component]
fn PriorityGrantForm(
    team_id: String,
    grant: Option<HighGrant>,
    action: ServerAction<SetTeamPriority>,
) -> impl IntoView {
    let value = move || action.value().get();
    let now = match grant {
        None => "Members of this team cannot ask for high priority.".to_owned(),
        Some(HighGrant { cap: None }) => {
            "Members may ask for high priority, within the team's quota.".to_owned()
        }
        Some(HighGrant { cap: Some(c) }) => format!(
            "Members may ask for high priority, up to {c} units held at high priority per GPU model."
        ),
    };
    let cap = grant
        .and_then(|g| g.cap)
        .map(|c| c.to_string())
        .unwrap_or_default();
    view! {
        <section class="card">
            <h2>"High priority"</h2>
            <p class="hint" data-testid="priority-grant">{now}</p>
            <ActionForm action=action attr:data-testid="priority-form" attr:novalidate=true>
                <input type="hidden" name="team_id" value=team_id />
                {form_error(value)}
                <label class="check">
                    <input type="checkbox" name="high" value="true" checked=grant.is_some() />
                    " May ask for high priority (queued ahead of normal work)"
                </label>
                <label for="priority-cap">"Cap in units (empty: none beyond the quota)"</label>
                <input
                    id="priority-cap"
                    name="cap"
                    type="number"
                    min="0"
                    inputmode="numeric"
                    value=cap
                />
                {field_error(value, "cap")}
                <button type="submit" class="primary" disabled=move || action.pending().get()>
                    "Save"
                </button>
            </ActionForm>
        </section>
    }
}

/// Platform admins set a team's quota on one model (setting it again replaces it).
#[component]
fn SetQuotaForm(team_id: String, action: ServerAction<SetQuota>) -> impl IntoView {
    let value = move || action.value().get();
    let limits = [
        ("quota-guaranteed", "guaranteed", "Guaranteed", "0"),
        ("quota-limit", "limit", "Limit", "7"),
        ("quota-per-user", "per_user", "Per user", "7"),
    ]
    .map(|(id, name, label, default)| {
        view! {
            <div>
                <Field result=value id name label input=FieldInput::number("0") default />
            </div>
        }
    });
    let echo_model = untrack(echoed(value, "model"));
    // Each model twice: its slices and whole GPUs (compute slices), and its shares of
    // shared GPUs (milli-GPU).
    let models = Catalog::builtin()
        .models()
        .flat_map(|m| {
            let name = m.name().to_owned();
            let shared = tessera_domain::alloc::shared_quota_key(&name);
            [
                (
                    name.clone(),
                    if m.has_mig() {
                        format!(
                            "{name}: MIG slices and whole GPUs ({} units per GPU)",
                            m.compute_slices()
                        )
                    } else {
                        format!("{name}: whole GPUs (no MIG; 1 unit per GPU)")
                    },
                ),
                (
                    shared,
                    format!("{name}: shares of shared GPUs (1000 units = one GPU, in milli-GPU)"),
                ),
            ]
        })
        .map(|(value, label)| {
            view! {
                <option value=value.clone() selected=value == echo_model>
                    {label}
                </option>
            }
        })
        .collect_view();
    let saved = move || {
        action.value().get().and_then(Result::ok).map(|_| {
            view! {
                <div class="notice" role="status">
                    "Quota saved."
                </div>
            }
        })
    };
    view! {
        <section class="card">
            <h2>"Set a GPU quota"</h2>
            {saved}
            <ActionForm action=action attr:data-testid="quota-form" attr:novalidate=true>
                <input type="hidden" name="team_id" value=team_id />
                {form_error(value)}
                <Field result=value id="quota-model" name="model" label="GPU model">
                    {models}
                </Field>
                <div class="field-row three">{limits}</div>
                <p class="hint">
                    "Units: compute slices. Guaranteed ≤ limit and per user ≤ limit; a limit of 0 stops new requests on the model. Saving again replaces the quota."
                </p>
                <button type="submit" class="primary" disabled=move || action.pending().get()>
                    "Save quota"
                </button>
            </ActionForm>
        </section>
    }
}

/// This month's spend against the team's budget, with links to its usage and (for its
/// admins and platform admins) its monthly statement.
#[component]
fn TeamSpend(
    team_id: String,
    budget: Resource<Result<BudgetView, api::UiError>>,
    /// May read the team's statement.
    finance: bool,
) -> impl IntoView {
    let usage = format!("/usage?team={team_id}");
    let statement = finance.then(|| {
        view! {
            <a href=format!("/teams/{team_id}/statement") data-testid="statement-link">
                "Statement →"
            </a>
        }
    });
    view! {
        <Card id="spend" title="Budget and spend" wide=true>
            <Transition fallback=Loading>
                {move || Suspend::new(async move {
                    match budget.await {
                        Ok(b) => view! { <p data-testid="team-budget">{budget_text(&b)}</p> }.into_any(),
                        Err(e) => {
                            view! {
                                <p class="hint" data-testid="team-budget">
                                    {format!("The budget could not be loaded: {}", e.error)}
                                </p>
                            }
                                .into_any()
                        }
                    }
                })}
            </Transition>
            <p class="links">
                <a href=usage>"Usage →"</a>
                " "
                {statement}
            </p>
        </Card>
    }
}

/// "Budget: 120.00 of 500.00 USD this month (24 %)", or "No budget set" with the spend.
fn budget_text(b: &BudgetView) -> String {
    let c = &b.currency;
    match b.monthly_minor {
        Some(m) => format!(
            "Budget: {} of {} {c} this month ({} %){}",
            format_minor(b.spent_minor, c),
            format_minor(m, c),
            b.used_pct,
            if b.hard { " · hard limit" } else { "" }
        ),
        None => format!(
            "No budget set · {} {c} spent this month",
            format_minor(b.spent_minor, c)
        ),
    }
}

/// The team's webhooks (team admins): each event of the team is posted there, signed
/// (docs/notifications.md); the secret is shown once, when a hook is added.
#[component]
fn TeamWebhooks(
    team_id: String,
    webhooks: Resource<Result<Vec<WebhookView>, api::UiError>>,
    add: ServerAction<AddTeamWebhook>,
    delete: ServerAction<DeleteTeamWebhook>,
    toggle: ServerAction<SetTeamWebhookEnabled>,
) -> impl IntoView {
    let value = move || add.value().get();
    let secret = move || {
        add.value().get().and_then(Result::ok).map(|created| {
            view! {
                <SecretBox
                    title=format!("Signing secret of {}", created.webhook.url)
                    secret=created.secret
                />
            }
        })
    };
    let list = {
        let team_id = team_id.clone();
        unpaged_table(
            webhooks,
            Columns::new("webhooks", &["URL", "Status", "Manage"]),
            || view! { <p data-testid="no-webhooks">"No webhooks."</p> }.into_any(),
            move |hook| view! { <WebhookItem team_id=team_id.clone() hook delete toggle /> },
        )
    };
    view! {
        <Card id="webhooks" title="Webhooks" wide=true>
            <p class="hint">
                "Every event of this team (jobs ending, requests, budget) is posted to these URLs "
                "as signed JSON with a Slack-compatible "
                <code>"text"</code>
                ". A hook that fails 10 times in a row is turned off; turning it on again "
                "starts its count afresh."
            </p>
            {form_error(move || delete.value().get())}
            {form_error(move || toggle.value().get())}
            {list}
            {secret}
            <ActionForm action=add attr:data-testid="webhook-form" attr:novalidate=true>
                {form_error(value)}
                <input type="hidden" name="team_id" value=team_id.clone() />
                <Field result=value id="webhook-url" name="url" label="URL" input=FieldInput::of("url")
                    .placeholder("https://hooks.slack.com/services/…")
                    .required() />
                <button type="submit" disabled=move || add.pending().get()>
                    "Add webhook"
                </button>
            </ActionForm>
        </Card>
    }
}

/// One webhook's rows: where it posts and how it is doing, its buttons (send a test,
/// turn off or on, delete) and, under a disclosure, its latest deliveries (loaded when
/// opened).
#[component]
fn WebhookItem(
    team_id: String,
    hook: WebhookView,
    delete: ServerAction<DeleteTeamWebhook>,
    toggle: ServerAction<SetTeamWebhookEnabled>,
) -> impl IntoView {
    let test = ServerAction::<TestTeamWebhook>::new();
    let log = ServerAction::<TeamWebhookDeliveries>::new();
    let hook_id = hook.id.to_string();
    let url = hook.url.clone();
    let (status, why) = hook_status(&hook);
    let test_result = move || {
        let text = match test.value().get()? {
            Ok(r) => test_text(&r),
            Err(e) => format!("Test not sent: {}", e.error),
        };
        Some(view! {
            <p class="hint" role="status" data-testid="webhook-test-result">
                {text}
            </p>
        })
    };
    let open_log = {
        let (team_id, id) = (team_id.clone(), hook_id.clone());
        // `toggle` fires on opening and on closing; a log is loaded on each opening.
        let open = RwSignal::new(false);
        move |_| {
            open.update(|o| *o = !*o);
            if open.get_untracked() {
                log.dispatch(TeamWebhookDeliveries {
                    team_id: team_id.clone(),
                    id: id.clone(),
                });
            }
        }
    };
    let deliveries = {
        let url = url.clone();
        move || match log.value().get() {
            None if log.pending().get() => view! { <Loading /> }.into_any(),
            None => ().into_any(),
            Some(Ok(list)) if list.is_empty() => view! {
                <Empty>
                    <p data-testid="no-deliveries">"No deliveries yet."</p>
                </Empty>
            }
            .into_any(),
            Some(Ok(list)) => view! { <DeliveryLog url=url.clone() list /> }.into_any(),
            Some(Err(e)) => view! { <Problem error=e.error /> }.into_any(),
        }
    };
    let (switch, switch_label) = if hook.enabled {
        ("false", "Turn off")
    } else {
        ("true", "Turn on")
    };
    let action = |label, aria, danger, pending| {
        let class = if danger { "link danger" } else { "link" };
        hook_action(HookAction {
            team_id: &team_id,
            hook_id: &hook_id,
            label,
            aria,
            class,
            pending,
        })
    };
    let testing = action(
        "Send test",
        format!("Send test to {url}"),
        false,
        Some(test.pending()),
    );
    let switching = action(
        switch_label,
        format!("{switch_label} {url}"),
        false,
        Some(toggle.pending()),
    );
    let deleting = action("Delete", format!("Delete {url}"), true, None);
    let test_form = view! {
        <ActionForm action=test attr:data-testid="webhook-test-form">{testing}</ActionForm>
    };
    let toggle_form = view! {
        <ActionForm action=toggle attr:data-testid="webhook-toggle-form">
            <input type="hidden" name="enabled" value=switch />
            {switching}
        </ActionForm>
    };
    let delete_form = view! { <ActionForm action=delete>{deleting}</ActionForm> };
    view! {
        <tr data-testid="webhook-row" data-enabled=hook.enabled.to_string()>
            <td>
                <code>{hook.url}</code>
            </td>
            <td data-testid="webhook-status">
                {status}
                {why.map(|e| view! { <br /><span class="hint">{e}</span> })}
                {test_result}
            </td>
            <td class="actions">{test_form} {toggle_form} {delete_form}</td>
        </tr>
        <tr class="webhook-log">
            <td colspan="3">
                <details data-testid="webhook-deliveries" on:toggle=open_log>
                    <summary>"Deliveries"</summary>
                    {deliveries}
                </details>
            </td>
        </tr>
    }
}

/// One of a webhook row's actions: which hook, and its link-styled button.
struct HookAction<'a> {
    team_id: &'a str,
    hook_id: &'a str,
    label: &'static str,
    aria: String,
    class: &'static str,
    /// Greys the button out while its action runs.
    pending: Option<Memo<bool>>,
}

/// A webhook row's action form's inside: the hidden ids naming the hook, and the button.
fn hook_action(a: HookAction) -> impl IntoView + use<> {
    let pending = a.pending;
    view! {
        <input type="hidden" name="team_id" value=a.team_id.to_owned() />
        <input type="hidden" name="id" value=a.hook_id.to_owned() />
        <button
            type="submit"
            class=a.class
            aria-label=a.aria
            disabled=move || pending.is_some_and(|p| p.get())
        >
            {a.label}
        </button>
    }
}

/// A hook's state in words, and why it is off or what went wrong last.
fn hook_status(h: &WebhookView) -> (String, Option<String>) {
    let last_error = h.last_error.clone();
    match (h.enabled, h.consecutive_failures) {
        (false, 0) => ("Off".to_owned(), last_error),
        (false, n) => (
            format!("Off after {n} failures in a row"),
            last_error.map(|e| format!("Last error: {e}")),
        ),
        (true, _) => match (h.last_status, last_error) {
            (_, Some(e)) => (format!("On · {e}"), None),
            (Some(s), None) => (format!("On · last answer {s}"), None),
            (None, None) => ("On · nothing sent yet".to_owned(), None),
        },
    }
}

/// What a test delivery came to: delivered with the receiver's status, or why not.
fn test_text(r: &WebhookTestResult) -> String {
    let status = r.status.map(|s| format!(" (HTTP {s})")).unwrap_or_default();
    if r.delivered {
        format!("Test delivered{status}.")
    } else {
        format!(
            "Test failed{status}: {}",
            r.error.as_deref().unwrap_or("no answer")
        )
    }
}

/// A hook's latest deliveries, newest first.
#[component]
fn DeliveryLog(url: String, list: Vec<DeliveryView>) -> impl IntoView {
    let rows = list
        .into_iter()
        .map(|d| {
            view! {
                <tr data-testid="delivery-row">
                    <td>
                        <When t=d.created_at />
                    </td>
                    <td>{d.kind.as_str()}</td>
                    <td data-testid="delivery-state">{d.state}</td>
                    <td>{d.attempts}</td>
                    <td>{d.last_status.map(|s| s.to_string()).unwrap_or_else(|| "–".into())}</td>
                    <td>{d.last_error.unwrap_or_default()}</td>
                </tr>
            }
        })
        .collect_view();
    list_table(
        &Columns::new(
            "delivery-log",
            &[
                "Time",
                "Event",
                "State",
                "Attempts",
                "Last status",
                "Last error",
            ],
        )
        .label(format!("Deliveries to {url}")),
        rows,
    )
}
