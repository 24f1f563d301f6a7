//! The nodes page: every node's GPUs with their MIG layout drawn slice by slice; platform
//! admins may revoke nodes and set a GPU's desired layout.

use crate::api::{self, RevokeNode, SetGpuLayout, UiError};
use crate::components::{
    Authenticated, Empty, Loading, PAGE_SIZE, Problem, When, error_of, field_error, form_error,
    is_admin, pager, use_offset,
};
use leptos::prelude::*;
use tessera_domain::cluster::{DesiredView, GpuView, InstanceView, NodeView};
use tessera_domain::mig::Catalog;
use tessera_domain::tenancy::PageRequest;

#[component]
pub fn NodesPage() -> impl IntoView {
    view! {
        <Authenticated>
            <h1>"Nodes"</h1>
            <NodeList />
        </Authenticated>
    }
}

/// The mutations a node card may dispatch. One action per kind for the whole page, so a
/// form posted without JavaScript finds its error again after the redirect; `layout_target`
/// remembers which GPU's form was submitted last (after hydration), so its result shows there.
#[derive(Clone, Copy)]
struct NodeActions {
    admin: bool,
    revoke: ServerAction<RevokeNode>,
    layout: ServerAction<SetGpuLayout>,
    layout_target: RwSignal<Option<String>>,
}

#[component]
fn NodeList() -> impl IntoView {
    let offset = use_offset();
    let actions = NodeActions {
        admin: is_admin(),
        revoke: ServerAction::new(),
        layout: ServerAction::new(),
        layout_target: RwSignal::new(None),
    };
    // The agent applies a saved layout a little later: "Refresh" shows how it went.
    let refresh = RwSignal::new(0u32);
    let nodes = Resource::new(
        move || {
            (
                offset.get(),
                actions.revoke.version().get(),
                actions.layout.version().get(),
                refresh.get(),
            )
        },
        |(offset, ..)| api::list_nodes(PageRequest::new(offset, PAGE_SIZE)),
    );
    let revoked = move || {
        actions.revoke.value().get().and_then(Result::ok).map(|n| {
            view! {
                <div class="notice" role="status">
                    {format!("Node {} revoked.", n.hostname)}
                </div>
            }
        })
    };
    // Without JavaScript nobody knows which GPU's form failed: say it at the top.
    let layout_error = move || {
        actions
            .layout_target
            .get()
            .is_none()
            .then(|| error_of(actions.layout.value().get()))
            .flatten()
            .map(|e| {
                view! {
                    <div class="form-error" role="alert">
                        {format!("Could not set the MIG layout: {}", e.error)}
                    </div>
                }
            })
    };
    view! {
        {form_error(move || actions.revoke.value().get())}
        {revoked}
        {layout_error}
        <Transition fallback=Loading>
            {move || Suspend::new(async move {
                match nodes.await {
                    Ok(page) if page.total == 0 => view! { <NoNodes admin=actions.admin /> }.into_any(),
                    Ok(page) => {
                        let pager = pager(&page, "/nodes");
                        let cards = page
                            .items
                            .into_iter()
                            .map(|node| view! { <NodeCard node actions /> })
                            .collect_view();
                        view! {
                            <div class="toolbar">
                                <SliceLegend />
                                <button
                                    type="button"
                                    class="refresh"
                                    on:click=move |_| refresh.update(|n| *n = n.wrapping_add(1))
                                >
                                    "Refresh"
                                </button>
                            </div>
                            <div class="node-list">{cards}</div>
                            {pager}
                        }
                            .into_any()
                    }
                    Err(e) => view! { <Problem error=e.error /> }.into_any(),
                }
            })}
        </Transition>
    }
}

#[component]
fn NoNodes(admin: bool) -> impl IntoView {
    view! {
        <Empty>
            <p>
                "No nodes yet — an admin can create a join token and start "
                <code>"tessera-agent --server URL --join-token TOKEN"</code> " on a GPU host."
            </p>
            {admin.then(|| view! { <a href="/admin/join-tokens">"Create a join token →"</a> })}
        </Empty>
    }
}

#[component]
fn SliceLegend() -> impl IntoView {
    view! {
        <p class="legend hint">
            "MIG layouts are drawn over each GPU's memory slices:"
            <span class="legend-item">
                <span class="swatch busy"></span>
                "instance in use"
            </span>
            <span class="legend-item">
                <span class="swatch free"></span>
                "instance free"
            </span>
            <span class="legend-item">
                <span class="swatch empty"></span>
                "empty slice"
            </span>
            <span class="legend-item">"Hover an instance for its MIG UUID."</span>
        </p>
    }
}

#[component]
fn NodeCard(node: NodeView, actions: NodeActions) -> impl IntoView {
    let (status, class) = if node.revoked {
        ("revoked", "badge danger")
    } else if node.online {
        ("online", "badge ok")
    } else {
        ("offline", "badge warn")
    };
    let heartbeat = match node.last_heartbeat_at {
        Some(t) => view! { <When t /> }.into_any(),
        None => "never".into_any(),
    };
    let node_id = node.id.to_string();
    let editable = actions.admin && !node.revoked;
    let gpus = node
        .gpus
        .iter()
        .map(|gpu| {
            view! { <GpuBlock gpu=gpu.clone() node_id=node_id.clone() editable actions /> }
        })
        .collect_view();
    view! {
        <article class="node" data-testid="node" data-hostname=node.hostname.clone()>
            <header class="node-head">
                <h2>{node.hostname.clone()}</h2>
                <span class=class data-testid="node-status">
                    {status}
                </span>
            </header>
            <dl class="facts row">
                <div>
                    <dt>"Last heartbeat"</dt>
                    <dd>{heartbeat}</dd>
                </div>
                <div>
                    <dt>"Agent"</dt>
                    <dd>{node.agent_version.clone()}</dd>
                </div>
                <div>
                    <dt>"Manages MIG"</dt>
                    <dd>{if node.manages_mig { "yes" } else { "no" }}</dd>
                </div>
                <div>
                    <dt>"Registered"</dt>
                    <dd>
                        <When t=node.registered_at />
                    </dd>
                </div>
            </dl>
            {node
                .gpus
                .is_empty()
                .then(|| view! { <p class="hint">"This node reported no GPUs."</p> })}
            <div class="gpus">{gpus}</div>
            {editable
                .then(|| {
                    view! { <RevokeNodeForm node_id=node_id.clone() action=actions.revoke /> }
                })}
        </article>
    }
    .into_any()
}

#[component]
fn GpuBlock(gpu: GpuView, node_id: String, editable: bool, actions: NodeActions) -> impl IntoView {
    let title = gpu.model.clone().unwrap_or_else(|| gpu.name.clone());
    let driver_name = gpu.model.is_some().then(|| gpu.name.clone());
    let mig = match (gpu.mig_enabled, gpu.mig_pending_change) {
        (None, _) => ("no MIG", "badge muted"),
        (Some(true), false) => ("MIG on", "badge"),
        (Some(false), false) => ("MIG off", "badge muted"),
        (Some(true), true) => ("MIG on, off after reset", "badge warn"),
        (Some(false), true) => ("MIG off, on after reset", "badge warn"),
    };
    let uuid = gpu.uuid.clone();
    view! {
        <section class="gpu" data-testid="gpu" data-uuid=uuid>
            <header class="gpu-head">
                <span class="gpu-index">"GPU " {gpu.index}</span>
                <strong data-testid="gpu-model">{title}</strong>
                {driver_name.map(|n| view! { <span class="hint">{n}</span> })}
                <span class="memory">{memory(gpu.memory_mib)}</span>
                <span class=mig.1>{mig.0}</span>
            </header>
            <MigLayout gpu=gpu.clone() />
            {gpu
                .desired
                .clone()
                .filter(|d| d.state.as_deref() != Some("success"))
                .map(|desired| view! { <DesiredStatus desired /> })}
            {editable.then(|| view! { <LayoutForm gpu node_id actions /> })}
        </section>
    }
    .into_any()
}

/// `81559` MiB → "79.6 GiB"; `40960` → "40 GiB".
fn memory(mib: u64) -> String {
    if mib.is_multiple_of(1024) {
        format!("{} GiB", mib / 1024)
    } else {
        format!("{:.1} GiB", mib as f64 / 1024.0)
    }
}

/// The GPU's memory slices as a row of cells; each instance spans `[start, start + size)`.
#[component]
fn MigLayout(gpu: GpuView) -> impl IntoView {
    let slices = usize::from(gpu.memory_slices);
    if gpu.mig_enabled != Some(true) || slices == 0 {
        let text = if gpu.mig_enabled.is_none() {
            "Whole GPU (not MIG-capable)"
        } else {
            "Whole GPU (MIG off)"
        };
        return view! { <div class="slices whole">{text}</div> }.into_any();
    }
    let mut covered = vec![false; slices];
    for i in &gpu.instances {
        let start = usize::from(i.start);
        for c in covered.iter_mut().skip(start).take(usize::from(i.size)) {
            *c = true;
        }
    }
    let empty = covered
        .iter()
        .enumerate()
        .filter(|(_, c)| !**c)
        .map(|(i, _)| {
            view! {
                <div
                    class="slice empty"
                    style=format!("grid-column: {} / span 1", i + 1)
                    title=format!("slice {i}: empty")
                ></div>
            }
        })
        .collect_view();
    let instances = gpu.instances.iter().map(instance_cell).collect_view();
    let labels = (0..slices)
        .map(|i| view! { <span>{i}</span> })
        .collect_view();
    let columns = format!("grid-template-columns: repeat({slices}, 1fr)");
    view! {
        <div class="mig-layout">
            <div
                class="slices"
                style=columns.clone()
                role="group"
                aria-label=format!("MIG layout over {slices} memory slices")
            >
                {empty}
                {instances}
            </div>
            <div class="slice-labels" style=columns aria-hidden="true">
                {labels}
            </div>
        </div>
    }
    .into_any()
}

fn instance_cell(i: &InstanceView) -> impl IntoView + use<> {
    let state = if i.busy { "in use" } else { "free" };
    let end = i.start + i.size.saturating_sub(1);
    let title = format!(
        "{} · slices {}–{} · {} · {}",
        i.profile,
        i.start,
        end,
        state,
        i.uuid.as_deref().unwrap_or("no MIG UUID reported")
    );
    view! {
        <div
            class=if i.busy { "slice instance busy" } else { "slice instance free" }
            style=format!("grid-column: {} / span {}", i.start + 1, i.size.max(1))
            title=title
            data-testid="mig-instance"
        >
            {i.profile.clone()}
        </div>
    }
}

/// The current layout written the way the form takes it: `3g.40gb@0, 1g.10gb@6`.
fn layout_text(gpu: &GpuView) -> String {
    let mut instances: Vec<&InstanceView> = gpu.instances.iter().collect();
    instances.sort_by_key(|i| i.start);
    instances
        .iter()
        .map(|i| format!("{}@{}", i.profile, i.start))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the form starts with: the admin's last desired layout (else what the GPU reports),
/// or, when this GPU's last submission failed, what was typed. Read once per render: the
/// list re-renders after every save, and a reactive value would overwrite typing.
fn layout_form_start(gpu: &GpuView, last: Option<Result<(), UiError>>) -> (bool, String, bool) {
    let (enabled, layout) = match &gpu.desired {
        Some(d) => (d.mig_enabled, d.layout.join(", ")),
        None => (gpu.mig_enabled == Some(true), layout_text(gpu)),
    };
    match last {
        Some(Err(e)) => (
            true,
            e.echoed("layout").unwrap_or(layout),
            e.echoed("mode").map_or(enabled, |m| m == "enabled"),
        ),
        Some(Ok(())) => (true, layout, enabled),
        None => (false, layout, enabled),
    }
}

/// "Profiles: 1g.10gb@0–6, 2g.20gb@0/2/4, …" for the GPU's model, when the catalog knows it.
fn profile_hint(gpu: &GpuView) -> Option<String> {
    let catalog = Catalog::builtin();
    let model = catalog.get(gpu.model.as_deref().unwrap_or(&gpu.name))?;
    let profiles = model
        .profiles()
        .iter()
        .map(|p| {
            let starts: Vec<u8> = p.placements.iter().map(|pl| pl.start).collect();
            let contiguous = starts.windows(2).all(|w| w[1] == w[0] + 1);
            let at = match (starts.first(), starts.last()) {
                (Some(a), Some(b)) if contiguous && starts.len() > 2 => format!("{a}–{b}"),
                _ => starts
                    .iter()
                    .map(u8::to_string)
                    .collect::<Vec<_>>()
                    .join("/"),
            };
            format!("{}@{at}", p.name)
        })
        .collect::<Vec<_>>()
        .join(", ");
    Some(format!("Profiles and start slices: {profiles}. "))
}

#[component]
fn LayoutForm(gpu: GpuView, node_id: String, actions: NodeActions) -> impl IntoView {
    let action = actions.layout;
    let target = actions.layout_target;
    let uuid = gpu.uuid.clone();
    let mine = {
        let uuid = uuid.clone();
        Memo::new(move |_| target.read().as_deref() == Some(uuid.as_str()))
    };
    let value = move || {
        if mine.get() {
            action.value().get()
        } else {
            None
        }
    };
    let saved = move || mine.get() && !action.pending().get() && matches!(value(), Some(Ok(_)));
    let last = untrack(value).map(|r| r.map(|_| ()));
    let (open, layout, enabled) = layout_form_start(&gpu, last);
    let profiles = profile_hint(&gpu).map(|p| view! { <span class="profiles">{p}</span> });
    let mode_id = format!("mode-{uuid}");
    let layout_id = format!("layout-{uuid}");
    view! {
        <details class="set-layout" open=open>
            <summary>"Set MIG layout"</summary>
            <ActionForm action=action attr:novalidate=true>
                <input type="hidden" name="node_id" value=node_id />
                <input type="hidden" name="gpu_uuid" value=uuid.clone() />
                {form_error(value)}
                <label for=mode_id.clone()>"MIG mode"</label>
                <select id=mode_id name="mode">
                    <option value="enabled" selected=enabled>
                        "enabled"
                    </option>
                    <option value="disabled" selected=!enabled>
                        "disabled"
                    </option>
                </select>
                {field_error(value, "mode")}
                <label for=layout_id.clone()>"Instances (profile@start slice, comma-separated)"</label>
                <input
                    id=layout_id
                    name="layout"
                    placeholder="3g.40gb@0, 2g.20gb@4, 1g.10gb@6"
                    autocomplete="off"
                    spellcheck="false"
                    value=layout
                />
                {field_error(value, "layout")}
                <p class="hint">
                    {profiles}
                    "Leave empty with MIG disabled. The node's agent applies it on its next sync."
                </p>
                <button
                    type="submit"
                    class="primary"
                    on:click=move |_| target.set(Some(uuid.clone()))
                    disabled=move || action.pending().get()
                >
                    "Save layout"
                </button>
                {move || {
                    saved()
                        .then(|| {
                            view! {
                                <div class="notice" role="status">
                                    "Saved. The drawing changes once the agent has applied it: refresh in a few seconds."
                                </div>
                            }
                        })
                }}
            </ActionForm>
        </details>
    }
    .into_any()
}

/// How applying the admin's desired layout goes, unless it is simply done.
#[component]
fn DesiredStatus(desired: DesiredView) -> impl IntoView {
    let state = desired
        .state
        .clone()
        .unwrap_or_else(|| "pending".to_owned());
    let class = match state.as_str() {
        "success" => "badge ok",
        "failed" => "badge danger",
        _ => "badge warn",
    };
    let layout = if !desired.mig_enabled {
        "MIG off".to_owned()
    } else if desired.layout.is_empty() {
        "MIG on, no instances".to_owned()
    } else {
        desired.layout.join(", ")
    };
    view! {
        <p class="desired" data-testid="desired">
            <span class=class>{state}</span>
            " desired: "
            <code>{layout}</code>
            {desired.detail.map(|d| view! { <span class="hint">" — " {d}</span> })}
        </p>
    }
}

#[component]
fn RevokeNodeForm(node_id: String, action: ServerAction<RevokeNode>) -> impl IntoView {
    view! {
        <details class="danger-zone">
            <summary>"Revoke node…"</summary>
            <ActionForm action=action>
                <input type="hidden" name="node_id" value=node_id />
                <label class="check">
                    <input type="checkbox" required />
                    " I understand: the node's agent is rejected from now on and must join again with a new token."
                </label>
                <button type="submit" class="danger" disabled=move || action.pending().get()>
                    "Revoke node"
                </button>
            </ActionForm>
        </details>
    }
}
