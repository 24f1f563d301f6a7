//! The nodes page: every node's GPUs with their MIG layout drawn slice by slice and their
//! recent telemetry; platform admins may revoke nodes and set a GPU's desired layout.

mod chart;

use crate::api::{
    self, ClearGpuHealth, ClearSpares, DrainNode, RevokeNode, SetGpuLayout, SetGpuSharing,
    SetSpares, UiError, UndrainNode,
};
use crate::components::alert;
use crate::components::{
    AdminOnly, Authenticated, Empty, Field, Loading, PAGE_SIZE, Problem, When, error_of,
    field_error, form_error, is_admin, pager, use_offset,
};
use crate::components::{Topic, refresher};
use chrono::DateTime;
use leptos::prelude::*;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use tessera_domain::cluster::{
    DesiredView, GpuPoint, GpuView, InstanceView, NodeTelemetry, NodeView, ServerReplicaView,
    SharingView,
};
use tessera_domain::drain::{DrainState, DrainView};
use tessera_domain::mig::Catalog;
use tessera_domain::spares::SpareView;
use tessera_domain::tenancy::{Page, PageRequest};

#[component]
pub fn NodesPage() -> impl IntoView {
    // Created here, outside `Authenticated`: the server renders the children of a Suspense
    // more than once (dry runs), so resources created inside get different ids there than
    // in the browser, and a fetch that awaits another resource may outlive its owner.
    let page = NodesData::new();
    let servers = Resource::new(|| (), |()| api::list_servers());
    view! {
        <Authenticated>
            <h1>"Nodes"</h1>
            <NodeList page />
            <AdminOnly>
                <Servers servers />
            </AdminOnly>
        </Authenticated>
    }
}

/// Samples per history chart: agents report every 10 s, so about ten minutes.
const HISTORY_SAMPLES: u32 = 60;
/// How often a hydrated page reloads telemetry: the agents' default report interval.
const TELEMETRY_EVERY: Duration = Duration::from_secs(10);

/// The listed nodes' telemetry by node id, shared by every card without copying it.
#[derive(Clone, Debug)]
struct Telemetry(Arc<Vec<(String, Result<NodeTelemetry, UiError>)>>);

impl Telemetry {
    fn of_node(&self, node_id: &str) -> Option<&Result<NodeTelemetry, UiError>> {
        self.0.iter().find(|(id, _)| id == node_id).map(|(_, t)| t)
    }
}

impl Serialize for Telemetry {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Telemetry {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Vec::deserialize(d).map(|v| Telemetry(Arc::new(v)))
    }
}

/// The mutations a node card may dispatch. One action per kind for the whole page, so a
/// form posted without JavaScript finds its error again after the redirect; `layout_target`
/// remembers which GPU's form was submitted last (after hydration), so its result shows there.
#[derive(Clone, Copy)]
struct NodeActions {
    admin: bool,
    revoke: ServerAction<RevokeNode>,
    drain: ServerAction<DrainNode>,
    undrain: ServerAction<UndrainNode>,
    clear_health: ServerAction<ClearGpuHealth>,
    layout: ServerAction<SetGpuLayout>,
    sharing: ServerAction<SetGpuSharing>,
    set_spares: ServerAction<SetSpares>,
    clear_spares: ServerAction<ClearSpares>,
    /// The GPU whose layout or sharing form was submitted last.
    layout_target: RwSignal<Option<String>>,
}

/// What the page loads and the signals that reload it.
#[derive(Clone, Copy)]
struct NodesData {
    actions: NodeActions,
    /// The agent applies a saved layout a little later: "Refresh" shows how it went.
    refresh: RwSignal<u32>,
    nodes: Resource<Result<Page<NodeView>, UiError>>,
    /// One request per listed node (not per GPU), after the list.
    telemetry: Resource<Telemetry>,
    /// Hot spares per model (GPUs kept idle for displaced high-priority work).
    spares: Resource<Result<Vec<SpareView>, UiError>>,
}

impl NodesData {
    fn new() -> Self {
        let offset = use_offset();
        let actions = NodeActions {
            admin: false,
            revoke: ServerAction::new(),
            drain: ServerAction::new(),
            undrain: ServerAction::new(),
            clear_health: ServerAction::new(),
            layout: ServerAction::new(),
            sharing: ServerAction::new(),
            set_spares: ServerAction::new(),
            clear_spares: ServerAction::new(),
            layout_target: RwSignal::new(None),
        };
        // Layout changes (and apply progress) as the live stream reports them.
        let refresh = refresher(&[Topic::Nodes], TELEMETRY_EVERY, |_| false);
        // Agents report every 10 s; once hydrated, the page reloads telemetry as often.
        let telemetry_tick = RwSignal::new(0u32);
        Effect::new(move |_| {
            if let Ok(handle) = set_interval_with_handle(
                move || telemetry_tick.update(|n| *n = n.wrapping_add(1)),
                TELEMETRY_EVERY,
            ) {
                on_cleanup(move || handle.clear());
            }
        });
        let reload = move || {
            (
                offset.get(),
                actions.revoke.version().get(),
                actions.drain.version().get(),
                actions.undrain.version().get(),
                actions.clear_health.version().get(),
                actions.layout.version().get(),
                actions.sharing.version().get(),
                refresh.get(),
                actions.set_spares.version().get(),
                actions.clear_spares.version().get(),
            )
        };
        let spares = Resource::new(reload, |_| api::list_spares());
        let nodes = Resource::new(reload, |(offset, ..)| {
            api::list_nodes(PageRequest::new(offset, PAGE_SIZE))
        });
        let telemetry = Resource::new(
            move || (reload(), telemetry_tick.get()),
            move |_| async move {
                let mut all = Vec::new();
                if let Ok(page) = nodes.await {
                    for node in page.items {
                        let id = node.id.to_string();
                        let t = api::get_node_telemetry(id.clone(), HISTORY_SAMPLES).await;
                        all.push((id, t));
                    }
                }
                Telemetry(Arc::new(all))
            },
        );
        NodesData {
            actions,
            refresh,
            nodes,
            telemetry,
            spares,
        }
    }
}

#[component]
fn NodeList(page: NodesData) -> impl IntoView {
    let NodesData {
        actions,
        refresh,
        nodes,
        telemetry,
        spares,
    } = page;
    let actions = NodeActions {
        admin: is_admin(),
        ..actions
    };
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
            .map(|e| alert(format!("Could not set the MIG layout: {}", e.error)))
    };
    view! {
        {form_error(move || actions.revoke.value().get())}
        {form_error(move || actions.drain.value().get())}
        {form_error(move || actions.undrain.value().get())}
        {form_error(move || actions.clear_health.value().get())}
        {revoked}
        {layout_error}
        <Transition fallback=Loading>
            {move || Suspend::new(async move {
                let spare_list = spares.await.unwrap_or_default();
                let spare_gpus: Arc<std::collections::BTreeSet<String>> = Arc::new(
                    spare_list.iter().flat_map(|s| s.spare_gpus.iter().cloned()).collect(),
                );
                match nodes.await {
                    Ok(page) if page.total == 0 => view! { <NoNodes admin=actions.admin /> }.into_any(),
                    Ok(page) => {
                        let pager = pager(&page, "/nodes");
                        let cards = page
                            .items
                            .into_iter()
                            .map(|node| {
                                let spares = spare_gpus.clone();
                                view! { <NodeCard node actions telemetry spares /> }
                            })
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
                            <SparesCard spares=spare_list actions />
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

/// The portal's own server processes and which one leads (platform admins): with several
/// replicas on PostgreSQL, one runs the scheduler and the other background passes.
#[component]
fn Servers(servers: Resource<Result<Vec<ServerReplicaView>, UiError>>) -> impl IntoView {
    view! {
        <section class="card wide" data-testid="servers">
            <h2>"Portal servers"</h2>
            <p class="hint">
                "Every server answers pages, the API, agents and notebooks; the leader also runs \
                 the scheduler, metering and idle reclaim. If it stops, another takes over \
                 within seconds."
            </p>
            <Transition fallback=Loading>
                {move || Suspend::new(async move {
                    match servers.await {
                        Ok(list) if list.is_empty() => view! {
                            <Empty><p>"No server has reported yet."</p></Empty>
                        }.into_any(),
                        Ok(list) => view! {
                            <table class="list" data-testid="server-list">
                                <thead>
                                    <tr>
                                        <th>"Server"</th>
                                        <th>"Role"</th>
                                        <th>"Version"</th>
                                        <th>"Started"</th>
                                        <th>"Last report"</th>
                                    </tr>
                                </thead>
                                <tbody>
                                    {list.into_iter().map(|r| view! { <ServerRow r /> }).collect_view()}
                                </tbody>
                            </table>
                        }.into_any(),
                        Err(e) => view! { <Problem error=e.error /> }.into_any(),
                    }
                })}
            </Transition>
        </section>
    }
}

#[component]
fn ServerRow(r: ServerReplicaView) -> impl IntoView {
    let (role, class) = match (r.responding, r.leading) {
        (false, _) => ("not responding", "badge danger"),
        (true, true) => ("leader", "badge ok"),
        (true, false) => ("standby", "badge muted"),
    };
    view! {
        <tr>
            <td><code>{r.name}</code></td>
            <td><span class=class>{role}</span></td>
            <td>{r.version}</td>
            <td><When t=r.started_at /></td>
            <td><When t=r.seen_at /></td>
        </tr>
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
fn NodeCard(
    node: NodeView,
    actions: NodeActions,
    telemetry: Resource<Telemetry>,
    spares: Arc<std::collections::BTreeSet<String>>,
) -> impl IntoView {
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
    let dropped_for = node_id.clone();
    let gpus = node
        .gpus
        .iter()
        .map(|gpu| {
            let spare = spares.contains(&gpu.uuid);
            view! {
                <GpuBlock gpu=gpu.clone() node_id=node_id.clone() editable actions telemetry spare />
            }
        })
        .collect_view();
    view! {
        <article class="node" data-testid="node" data-hostname=node.hostname.clone()>
            <header class="node-head">
                <h2>{node.hostname.clone()}</h2>
                <span class=class data-testid="node-status">
                    {status}
                </span>
                {node.drain.clone().map(|d| view! { <DrainBadge d /> })}
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
                    <dt>"Workload sandbox"</dt>
                    {if node.workload_sandbox {
                        view! { <dd>"on"</dd> }.into_any()
                    } else {
                        view! {
                            <dd class="warn" id="sandbox-off">
                                "OFF: workloads here run without isolation and can reach other teams' files and every GPU"
                            </dd>
                        }
                            .into_any()
                    }}
                </div>
                <div>
                    <dt>"Registered"</dt>
                    <dd>
                        <When t=node.registered_at />
                    </dd>
                </div>
            </dl>
            <Transition fallback=|| ()>
                {move || {
                    let node_id = dropped_for.clone();
                    Suspend::new(async move {
                        dropped_warning(telemetry.await.of_node(&node_id))
                    })
                }}
            </Transition>
            {node
                .gpus
                .is_empty()
                .then(|| view! { <p class="hint">"This node reported no GPUs."</p> })}
            <div class="gpus">{gpus}</div>
            {editable
                .then(|| {
                    view! {
                        <DrainNodeForm
                            node_id=node_id.clone()
                            drained=node.drain.is_some()
                            actions
                        />
                        <RevokeNodeForm node_id=node_id.clone() action=actions.revoke />
                    }
                })}
        </article>
    }
    .into_any()
}

#[component]
fn GpuBlock(
    gpu: GpuView,
    node_id: String,
    editable: bool,
    actions: NodeActions,
    telemetry: Resource<Telemetry>,
    /// Kept idle as a hot spare.
    spare: bool,
) -> impl IntoView {
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
                {gpu
                    .sharing
                    .as_ref()
                    .map(|sh| {
                        view! {
                            <span class="badge" data-testid="shared-badge">
                                {format!("shared · {}", method_label(&sh.method))}
                            </span>
                        }
                    })}
                {gpu
                    .unhealthy
                    .clone()
                    .map(|h| {
                        view! {
                            <span class="badge danger" data-testid="gpu-unhealthy" title=h.reason.clone()>
                                "unhealthy: " {h.reason.clone()}
                            </span>
                        }
                    })}
                {gpu.drain.clone().map(|d| view! { <DrainBadge d /> })}
                {spare
                    .then(|| {
                        view! {
                            <span
                                class="badge"
                                data-testid="gpu-spare"
                                title="Kept idle for high-priority work moved off a faulty GPU or a lost node"
                            >
                                "hot spare"
                            </span>
                        }
                    })}
            </header>
            {(editable && gpu.unhealthy.is_some())
                .then(|| {
                    let (node, uuid) = (node_id.clone(), gpu.uuid.clone());
                    view! {
                        <ActionForm action=actions.clear_health>
                            <input type="hidden" name="node_id" value=node />
                            <input type="hidden" name="gpu_uuid" value=uuid />
                            <button type="submit" disabled=move || actions.clear_health.pending().get()>
                                "Repaired: clear and take work again"
                            </button>
                        </ActionForm>
                    }
                })}
            {match gpu.sharing.clone() {
                Some(sharing) => view! { <SharedGpu sharing /> }.into_any(),
                None => view! { <MigLayout gpu=gpu.clone() /> }.into_any(),
            }}
            <GpuTelemetrySlot gpu=gpu.clone() node_id=node_id.clone() telemetry />
            {gpu
                .desired
                .clone()
                .filter(|d| d.state.as_deref() != Some("success"))
                .map(|desired| view! { <DesiredStatus desired /> })}
            {editable
                .then(|| {
                    view! {
                        <SharingForm gpu=gpu.clone() node_id=node_id.clone() actions />
                        {gpu.sharing.is_none().then(|| view! { <LayoutForm gpu node_id actions /> })}
                    }
                })}
        </section>
    }
    .into_any()
}

/// "MPS", "time-slicing".
fn method_label(method: &str) -> &'static str {
    match method {
        "mps" => "MPS",
        "time_slice" => "time-slicing",
        _ => "unknown",
    }
}

/// A shared GPU: whether its node runs it so, how much is handed out, and to whom.
#[component]
fn SharedGpu(sharing: SharingView) -> impl IntoView {
    let used = sharing.used_milli.min(1000);
    let pct = f64::from(used) / 10.0;
    let status = if sharing.ready {
        view! { <span class="badge">"ready"</span> }.into_any()
    } else {
        view! { <span class="badge warn">"not ready"</span> }.into_any()
    };
    let tenants = sharing
        .tenants
        .iter()
        .map(|t| {
            let who = t.team.clone().unwrap_or_else(|| "a share".to_owned());
            view! {
                <li data-testid="share-tenant">
                    {format!("{} milli-GPU ({}%) · {who}", t.milli, f64::from(t.milli) / 10.0)}
                </li>
            }
        })
        .collect_view();
    view! {
        <div class="shared-gpu" data-testid="shared-gpu">
            <p>
                {status} " "
                <span data-testid="share-used">
                    {format!("{used} of 1000 milli-GPU handed out ({pct}%)")}
                </span>
                {(sharing.daemon_restarts > 0)
                    .then(|| {
                        format!(
                            " · MPS daemon restarted {} time{}",
                            sharing.daemon_restarts,
                            if sharing.daemon_restarts == 1 { "" } else { "s" },
                        )
                    })}
            </p>
            <div
                class="share-bar"
                role="img"
                aria-label=format!("{pct}% of the GPU handed out")
            >
                <span style=format!("width: {pct}%")></span>
            </div>
            {sharing.error.map(|e| view! { <p class="hint" data-testid="share-error">{e}</p> })}
            {if sharing.tenants.is_empty() {
                view! { <p class="hint">"No shares on it yet."</p> }.into_any()
            } else {
                view! { <ul class="share-tenants">{tenants}</ul> }.into_any()
            }}
        </div>
    }
    .into_any()
}

/// Whether GPU `uuid`'s form was the last one submitted on the page (the page has one
/// action of each kind for all its GPUs).
fn submitted_here(target: RwSignal<Option<String>>, uuid: &str) -> Memo<bool> {
    let uuid = uuid.to_owned();
    Memo::new(move |_| target.read().as_deref() == Some(uuid.as_str()))
}

/// A GPU's form, folded away under `summary` unless `open`.
#[component]
fn GpuDetails(
    class: &'static str,
    summary: &'static str,
    open: bool,
    children: Children,
) -> impl IntoView {
    view! {
        <details class=class open=open>
            <summary>{summary}</summary>
            {children()}
        </details>
    }
}

/// The start of a GPU's form: which GPU (hidden fields), and what went wrong with the
/// form as a whole.
fn gpu_fields<T: 'static>(
    node_id: String,
    uuid: String,
    value: impl Fn() -> Option<Result<T, UiError>> + Send + Sync + 'static,
) -> impl IntoView {
    view! {
        <input type="hidden" name="node_id" value=node_id />
        <input type="hidden" name="gpu_uuid" value=uuid />
        {form_error(value)}
    }
}

/// The admin's switch between a partitioned-or-whole GPU and a shared one.
#[component]
fn SharingForm(gpu: GpuView, node_id: String, actions: NodeActions) -> impl IntoView {
    let action = actions.sharing;
    let target = actions.layout_target;
    let uuid = gpu.uuid.clone();
    let mine = submitted_here(target, &uuid);
    let value = move || mine.get().then(|| action.value().get()).flatten();
    let current = gpu
        .sharing
        .as_ref()
        .map_or("off".to_owned(), |s| s.method.clone());
    let open = untrack(value).is_some_and(|r| r.is_err());
    view! {
        <GpuDetails class="set-sharing" summary="Sharing" open>
            <ActionForm action=action attr:novalidate=true>
                {gpu_fields(node_id, uuid.clone(), value)}
                <Field
                    result=value
                    id=format!("sharing-{uuid}")
                    name="sharing"
                    label="How this GPU is offered"
                >
                    <option value="off" selected=current == "off">
                        "Not shared: MIG slices or the whole GPU, as requests need"
                    </option>
                    <option value="mps" selected=current == "mps">
                        "Shared with MPS: each share gets its compute and memory fraction"
                    </option>
                    <option value="time_slice" selected=current == "time_slice">
                        "Shared by time-slicing: shares take turns, no limits"
                    </option>
                </Field>
                <p class="hint">
                    "A shared GPU runs with MIG off and takes only fractional requests (e.g. "
                    <code>"H100-80GB:share:250"</code>
                    ", a quarter), counted against a team's "
                    <code>"MODEL:shared"</code>
                    " quota in milli-GPU. MPS limits each share's compute (active thread percentage) and pinned memory; time-slicing shares the whole GPU in turns and isolates nothing. The mode changes only while nothing runs on the GPU."
                </p>
                <button
                    type="submit"
                    on:click=move |_| target.set(Some(uuid.clone()))
                    disabled=move || action.pending().get()
                >
                    "Save"
                </button>
            </ActionForm>
        </GpuDetails>
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

/// "3 devices", "1 process".
fn count(n: u32, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Says so when the node's agent had to drop samples; they are gone for good.
fn dropped_warning(
    telemetry: Option<&Result<NodeTelemetry, UiError>>,
) -> Option<impl IntoView + use<>> {
    let dropped = telemetry?.as_ref().ok()?.dropped_total;
    (dropped > 0).then(|| {
        view! {
            <div class="notice warn" role="status" data-testid="telemetry-dropped">
                {format!(
                    "{} dropped by the agent's spool: it was full while the server could not be reached.",
                    if dropped == 1 {
                        "1 telemetry sample was".to_owned()
                    } else {
                        format!("{dropped} telemetry samples were")
                    },
                )}
            </div>
        }
    })
}

/// This GPU's part of its node's telemetry.
#[component]
fn GpuTelemetrySlot(
    gpu: GpuView,
    node_id: String,
    telemetry: Resource<Telemetry>,
) -> impl IntoView {
    let mig_on = gpu.mig_enabled == Some(true);
    let ids = StoredValue::new((node_id, gpu.uuid));
    let loading = || {
        view! {
            <p class="loading telemetry-state" role="status" aria-busy="true">
                "Loading telemetry…"
            </p>
        }
    };
    view! {
        <Transition fallback=loading>
            {move || Suspend::new(async move {
                let all = telemetry.await;
                let (node_id, uuid) = ids.get_value();
                match all.of_node(&node_id) {
                    // Only while the list and the telemetry disagree, until the next reload.
                    None => loading().into_any(),
                    Some(Err(e)) => {
                        view! {
                            <p class="telemetry-state form-error" role="alert">
                                {format!("Telemetry could not be loaded: {}", e.error)}
                            </p>
                        }
                            .into_any()
                    }
                    Some(Ok(t)) => {
                        let points = t
                            .gpus
                            .iter()
                            .find(|s| s.gpu_uuid == uuid)
                            .map(|s| s.points.clone())
                            .unwrap_or_default();
                        if points.is_empty() {
                            view! {
                                <p class="telemetry-state empty" role="status" data-testid="telemetry-empty">
                                    "No telemetry yet (agents report every 10 s)."
                                </p>
                            }
                                .into_any()
                        } else {
                            view! { <GpuTelemetry points mig_on /> }.into_any()
                        }
                    }
                }
            })}
        </Transition>
    }
}

/// The newest sample's values and a sparkline of the history (memory and utilization in %).
/// What the driver cannot tell is said in words, never shown as 0.
#[component]
fn GpuTelemetry(points: Vec<GpuPoint>, mig_on: bool) -> impl IntoView {
    let Some(latest) = points.last().cloned() else {
        return ().into_any();
    };
    let mig_on = mig_on || latest.mig_devices > 0;
    let missing = if mig_on {
        "n/a (MIG on)"
    } else {
        "unavailable"
    };
    let unknown = || "unavailable".to_owned();
    let memory_text = match (latest.memory_used_mib, latest.memory_total_mib) {
        (Some(used), Some(total)) => format!("{} / {}", memory(used), memory(total)),
        (Some(used), None) => memory(used),
        _ => unknown(),
    };
    let memory_bar = chart::memory_pct(&latest).map(|pct| {
        let pct = pct.clamp(0.0, 100.0);
        view! {
            <span
                class="meter"
                role="meter"
                aria-label="memory in use"
                aria-valuemin="0"
                aria-valuemax="100"
                aria-valuenow=format!("{pct:.0}")
                title=format!("{pct:.0} % in use")
            >
                <span style=format!("width: {pct:.1}%")></span>
            </span>
        }
    });
    let temperature = latest
        .temperature_c
        .map_or_else(unknown, |c| format!("{c} °C"));
    let power = latest
        .power_mw
        .map_or_else(unknown, |mw| format!("{} W", mw.saturating_add(500) / 1000));
    let (utilization, utilization_class) = match latest.utilization_pct {
        Some(pct) => (format!("{pct} %"), ""),
        None => (missing.to_owned(), "na"),
    };
    let mig = if mig_on {
        format!(
            "{}, {}",
            count(latest.mig_devices, "device", "devices"),
            count(latest.mig_processes, "process", "processes")
        )
    } else {
        "off".to_owned()
    };
    let memory_line = chart::percent_path(&points, chart::memory_pct);
    let utilization_line = chart::percent_path(&points, chart::utilization_pct);
    let utilization_key = if utilization_line.is_empty() {
        format!("utilization {missing}")
    } else {
        "utilization %".to_owned()
    };
    let summary = chart::summary(&points, missing);
    let label = summary.clone();
    let covered = chart::duration(
        latest.at_unix_ms - points.first().map_or(latest.at_unix_ms, |p| p.at_unix_ms),
    );
    let updated = DateTime::from_timestamp_millis(latest.at_unix_ms).unwrap_or_default();
    view! {
        <div class="telemetry" data-testid="telemetry">
            <dl class="gauges">
                <div class="gauge-memory">
                    <dt>"Memory"</dt>
                    <dd data-testid="telemetry-memory">{memory_text} {memory_bar}</dd>
                </div>
                <div>
                    <dt>"Temp."</dt>
                    <dd data-testid="telemetry-temperature">{temperature}</dd>
                </div>
                <div>
                    <dt>"Power"</dt>
                    <dd data-testid="telemetry-power">{power}</dd>
                </div>
                <div>
                    <dt>"Utilization"</dt>
                    <dd class=utilization_class data-testid="telemetry-utilization">
                        {utilization}
                    </dd>
                </div>
                <div>
                    <dt>"MIG"</dt>
                    <dd data-testid="telemetry-mig">{mig}</dd>
                </div>
            </dl>
            <figure class="spark" title=summary>
                <svg
                    viewBox=format!("0 0 {} {}", chart::WIDTH, chart::HEIGHT)
                    preserveAspectRatio="none"
                    role="img"
                    aria-label=label
                    data-testid="sparkline"
                >
                    {(!memory_line.is_empty())
                        .then(|| {
                            view! {
                                <path
                                    class="line memory"
                                    d=memory_line
                                    vector-effect="non-scaling-stroke"
                                />
                            }
                        })}
                    {(!utilization_line.is_empty())
                        .then(|| {
                            view! {
                                <path
                                    class="line utilization"
                                    d=utilization_line
                                    vector-effect="non-scaling-stroke"
                                />
                            }
                        })}
                </svg>
                <figcaption>
                    <span class="key memory">"memory %"</span>
                    <span class="key utilization">{utilization_key}</span>
                    <span class="span">
                        {format!("last {covered} · updated ")} <When t=updated />
                    </span>
                </figcaption>
            </figure>
        </div>
    }
    .into_any()
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
    let mine = submitted_here(target, &uuid);
    let value = move || mine.get().then(|| action.value().get()).flatten();
    let saved = move || mine.get() && !action.pending().get() && matches!(value(), Some(Ok(_)));
    let last = untrack(value).map(|r| r.map(|_| ()));
    let (open, layout, enabled) = layout_form_start(&gpu, last);
    let profiles = profile_hint(&gpu).map(|p| view! { <span class="profiles">{p}</span> });
    let mode_id = format!("mode-{uuid}");
    let layout_id = format!("layout-{uuid}");
    view! {
        <GpuDetails class="set-layout" summary="Set MIG layout" open>
            <ActionForm action=action attr:novalidate=true>
                {gpu_fields(node_id, uuid.clone(), value)}
                <Field result=value id=mode_id name="mode" label="MIG mode">
                    <option value="enabled" selected=enabled>
                        "enabled"
                    </option>
                    <option value="disabled" selected=!enabled>
                        "disabled"
                    </option>
                </Field>
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
        </GpuDetails>
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

/// "draining until …" while work still runs there, then "drained".
#[component]
fn DrainBadge(d: DrainView) -> impl IntoView {
    let title = format!("Drained by a platform admin: {}", d.reason);
    match d.state {
        DrainState::Draining => view! {
            <span class="badge warn" data-testid="node-drain" title=title>
                "draining, work moves off " <When t=d.deadline />
            </span>
        }
        .into_any(),
        DrainState::Drained => view! {
            <span class="badge muted" data-testid="node-drain" title=title>
                "drained"
            </span>
        }
        .into_any(),
    }
}

/// Drain (no new work; running work warned and moved off at the deadline) or undrain.
#[component]
fn DrainNodeForm(node_id: String, drained: bool, actions: NodeActions) -> impl IntoView {
    if drained {
        return view! {
            <ActionForm action=actions.undrain>
                <input type="hidden" name="node_id" value=node_id />
                <button type="submit" disabled=move || actions.undrain.pending().get()>
                    "Undrain: take work again"
                </button>
            </ActionForm>
        }
        .into_any();
    }
    let minutes_id = format!("drain-minutes-{node_id}");
    let reason_id = format!("drain-reason-{node_id}");
    view! {
        <details class="drain-zone">
            <summary>"Drain node…"</summary>
            <p class="hint">
                "Nothing new is placed here. Running work is warned now (its deadline file and,                  if it asked, a signal) and moved off at the deadline: jobs are queued again                  on other nodes."
            </p>
            <ActionForm action=actions.drain>
                <input type="hidden" name="node_id" value=node_id />
                <label for=minutes_id.clone()>"Move work off within (minutes)"</label>
                <input id=minutes_id type="number" name="minutes" min="0" value="30" required />
                <label for=reason_id.clone()>"Reason (shown to the owners)"</label>
                <input id=reason_id type="text" name="reason" maxlength="200" placeholder="maintenance" />
                <button type="submit" disabled=move || actions.drain.pending().get()>
                    "Drain node"
                </button>
            </ActionForm>
        </details>
    }
    .into_any()
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

/// Hot spares per model: the rule, how many it asks for now and how many are kept; a
/// platform admin sets or clears a model's rule.
#[component]
fn SparesCard(spares: Vec<SpareView>, actions: NodeActions) -> impl IntoView {
    if spares.is_empty() && !actions.admin {
        return ().into_any();
    }
    let rows = spares
        .into_iter()
        .map(|s| {
            let rule = match (s.gpus, s.percent) {
                (Some(n), _) => format!("{n} GPU{}", if n == 1 { "" } else { "s" }),
                (_, Some(p)) => format!("{p} %"),
                _ => String::new(),
            };
            let kept = s.spare_gpus.len();
            let short = (kept < s.wanted as usize)
                .then(|| view! { <span class="badge warn">"short: refills as GPUs free"</span> });
            let model = s.model.clone();
            view! {
                <tr data-testid="spare-row" data-model=s.model.clone()>
                    <th scope="row">{s.model.clone()}</th>
                    <td>{rule}</td>
                    <td>{format!("{kept} of {}", s.wanted)} " " {short}</td>
                    <td>
                        {actions
                            .admin
                            .then(|| {
                                view! {
                                    <ActionForm action=actions.clear_spares>
                                        <input type="hidden" name="model" value=model />
                                        <button type="submit" class="secondary">
                                            "Keep none"
                                        </button>
                                    </ActionForm>
                                }
                            })}
                    </td>
                </tr>
            }
        })
        .collect_view();
    let value = move || actions.set_spares.value().get();
    view! {
        <section class="card wide" data-testid="spares">
            <h2>"Hot spares"</h2>
            <p class="hint">
                "GPUs kept idle: ordinary work is not placed on them, and high-priority work on a GPU that turns unhealthy (or a node that is lost) moves onto one at once."
            </p>
            <table>
                <thead>
                    <tr>
                        <th scope="col">"Model"</th>
                        <th scope="col">"Rule"</th>
                        <th scope="col">"Kept now"</th>
                        <th scope="col"></th>
                    </tr>
                </thead>
                <tbody>{rows}</tbody>
            </table>
            {actions
                .admin
                .then(|| {
                    view! {
                        {form_error(value)}
                        {form_error(move || actions.clear_spares.value().get())}
                        <ActionForm action=actions.set_spares>
                            <div class="row">
                                <label>
                                    "Model" <input name="model" required placeholder="H100-80GB" />
                                </label>
                                {field_error(value, "model")}
                                <label>
                                    "GPUs" <input name="gpus" type="number" min="0" />
                                </label>
                                {field_error(value, "gpus")}
                                <label>
                                    "or percent" <input name="percent" type="number" min="0" max="50" />
                                </label>
                                {field_error(value, "percent")}
                                <button type="submit">"Keep as spares"</button>
                            </div>
                        </ActionForm>
                    }
                })}
        </section>
    }
    .into_any()
}
