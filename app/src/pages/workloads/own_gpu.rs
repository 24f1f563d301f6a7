//! "A new GPU": the fields of a workload that asks for a GPU of its own, with their estimate, and a gang's size.

use super::*;

/// The price estimate of "a new GPU": what the form asks for, and its cost.
#[derive(Clone, Copy)]
pub(super) struct NewGpuEstimate {
    pub(super) input: RwSignal<Option<EstimateInput>>,
    pub(super) cost: Resource<Result<String, UiError>>,
}

/// The kind, count and hours of "a new GPU" as last submitted from a form, kept in the
/// browser's localStorage (nothing on the server): the next form starts from them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct LastGpu {
    pub(super) gpu: String,
    pub(super) count: String,
    pub(super) hours: String,
}

impl LastGpu {
    #[cfg(feature = "hydrate")]
    pub(super) fn key(kind: WorkloadKind) -> String {
        format!("tessera.new-gpu.{}", kind.as_str())
    }

    pub(super) fn encode(&self) -> String {
        format!("{}\n{}\n{}", self.gpu, self.count, self.hours)
    }

    /// `None` for anything but three lines: a kind, and a count and hours that are empty
    /// or whole numbers of 1 or more.
    pub(super) fn decode(text: &str) -> Option<Self> {
        let mut lines = text.split('\n');
        let (gpu, count, hours) = (lines.next()?, lines.next()?, lines.next()?);
        let number = |v: &str| v.is_empty() || v.parse::<u32>().is_ok_and(|n| n >= 1);
        (lines.next().is_none() && !gpu.is_empty() && number(count) && number(hours)).then(|| {
            LastGpu {
                gpu: gpu.to_owned(),
                count: count.to_owned(),
                hours: hours.to_owned(),
            }
        })
    }

    /// What a submitted form asked for, when it asked for a new GPU.
    pub(super) fn of(
        allocation_id: &str,
        gpu: &Option<String>,
        count: &Option<String>,
        hours: &Option<String>,
    ) -> Option<Self> {
        let trim = |v: &Option<String>| v.as_deref().unwrap_or_default().trim().to_owned();
        (allocation_id.trim() == api::NEW_GPU).then(|| LastGpu {
            gpu: trim(gpu),
            count: trim(count),
            hours: trim(hours),
        })
    }

    pub(super) fn load(kind: WorkloadKind) -> Option<Self> {
        Self::read(kind).as_deref().and_then(Self::decode)
    }

    pub(super) fn save(&self, kind: WorkloadKind) {
        Self::write(kind, &self.encode());
    }

    #[cfg(feature = "hydrate")]
    pub(super) fn storage() -> Option<web_sys::Storage> {
        web_sys::window()?.local_storage().ok()?
    }

    #[cfg(feature = "hydrate")]
    pub(super) fn read(kind: WorkloadKind) -> Option<String> {
        Self::storage()?.get_item(&Self::key(kind)).ok()?
    }

    #[cfg(feature = "hydrate")]
    pub(super) fn write(kind: WorkloadKind, text: &str) {
        if let Some(storage) = Self::storage() {
            // A full or refused storage only loses the convenience.
            let _ = storage.set_item(&Self::key(kind), text);
        }
    }

    /// The server keeps no choice: its forms start from what is free now.
    #[cfg(not(feature = "hydrate"))]
    pub(super) fn read(_: WorkloadKind) -> Option<String> {
        None
    }

    #[cfg(not(feature = "hydrate"))]
    pub(super) fn write(_: WorkloadKind, _: &str) {}
}

/// The workload's own GPU request: kind, hours (a job's time limit), priority (jobs) and
/// the paying team when the caller has several, with what it would cost. Shown while "a
/// new GPU" is chosen. Starts from the caller's last submitted choice (this browser's),
/// else from a kind free right now.
#[component]
pub(super) fn OwnGpuFields(
    gpus: Vec<(String, String)>,
    teams: Vec<(String, String)>,
    high: bool,
    free_now: BTreeMap<String, u32>,
    kind: WorkloadKind,
    new_gpu: RwSignal<bool>,
    errors: Callback<&'static str, AnyView>,
    estimate: NewGpuEstimate,
) -> impl IntoView {
    let prefix = match kind {
        WorkloadKind::Notebook => "nb",
        WorkloadKind::Job => "job",
    };
    // Preselected: the first kind (smallest first) that is free right now.
    let default_gpu = gpus
        .iter()
        .find(|(v, _)| free_now.get(v).copied().unwrap_or(0) > 0)
        .or(gpus.first())
        .map(|(v, _)| v.clone())
        .unwrap_or_default();
    let offered: Vec<String> = gpus.iter().map(|(v, _)| v.clone()).collect();
    // What the chosen kind meets right now: it fits, or it waits (and why).
    let chosen_gpu = RwSignal::new(default_gpu.clone());
    let chosen_count = RwSignal::new("1".to_owned());
    let chosen_hours = RwSignal::new(String::new());
    let chosen_priority = RwSignal::new("normal".to_owned());
    // Jobs: on how many nodes at once (more than 1: a gang, `count` on each).
    let chosen_nodes = RwSignal::new("1".to_owned());
    let gang = move || gang_size(&chosen_nodes.get());
    // Once hydrated (effects run only in the browser): the last choice, where still offered.
    Effect::new(move |_| {
        if let Some(last) = LastGpu::load(kind).filter(|l| offered.contains(&l.gpu)) {
            chosen_gpu.set(last.gpu);
            chosen_count.set(if last.count.is_empty() {
                "1".to_owned()
            } else {
                last.count
            });
            chosen_hours.set(last.hours);
        }
    });
    Effect::new(move |_| {
        let input = new_gpu.get().then(|| {
            let hours = chosen_hours.get();
            let count = chosen_count.get();
            // A gang costs its GPUs on every node.
            let count = match (gang(), count.trim().parse::<u32>()) {
                (Some(n), Ok(c)) => n.saturating_mul(c).to_string(),
                _ => count,
            };
            EstimateInput {
                kind: chosen_gpu.get(),
                count,
                // Empty: 8 hours, like the request.
                hours: if hours.trim().is_empty() {
                    "8".to_owned()
                } else {
                    hours
                },
                priority: chosen_priority.get(),
            }
        });
        estimate.input.set(input);
    });
    let fits = {
        let free_now = free_now.clone();
        move || {
            let kind = chosen_gpu.get();
            let text = crate::components::free_text(&free_now, &kind);
            if let Some(nodes) = gang() {
                let per_node = chosen_count.with(|c| c.trim().parse().unwrap_or(1));
                return gang_fits(nodes, per_node, free_now.get(&kind).copied(), &text);
            }
            match free_now.get(&kind).copied() {
                Some(n) if n > 0 => format!("Fits now: {text}."),
                _ if text == "fits now" => "Fits now.".to_owned(),
                _ => format!("Waits: {text}; it queues until one is free."),
            }
        }
    };
    let gpu_options = gpus
        .into_iter()
        .map(|(v, label)| {
            let label = format!("{label} — {}", crate::components::free_text(&free_now, &v));
            let selected = v == default_gpu;
            let value = v.clone();
            view! {
                <option
                    value=v
                    selected=selected
                    prop:selected=move || chosen_gpu.with(|c| *c == value)
                >
                    {label}
                </option>
            }
        })
        .collect_view();
    let team_field = (teams.len() > 1).then(|| {
        let options = teams
            .into_iter()
            .map(|(id, name)| view! { <option value=id>{name}</option> })
            .collect_view();
        view! {
            <div>
                <label for=format!("{prefix}-team")>"Team that pays"</label>
                <select id=format!("{prefix}-team") name="team_id">
                    {options}
                </select>
                {errors.run("team_id")}
            </div>
        }
    });
    let priority_field = (kind == WorkloadKind::Job).then(|| {
        view! {
            <div>
                <label for="job-priority">"Priority"</label>
                <select
                    id="job-priority"
                    name="priority"
                    on:change=move |ev| chosen_priority.set(event_target_value(&ev))
                >
                    <option value="normal" selected>"normal"</option>
                    {high.then(|| view! { <option value="high">"high (granted to your team)"</option> })}
                    <option value="preemptible">"preemptible (spare capacity, stopped first)"</option>
                </select>
                {errors.run("priority")}
            </div>
        }
    });
    // Jobs: the nodes, and once more than one, who runs the command.
    let nodes_field = (kind == WorkloadKind::Job).then(|| {
        let nodes = NumberField {
            testid: Some("own-gpu-nodes"),
            ..NumberField::new(prefix, "nodes", chosen_nodes)
        };
        nodes.view("Nodes", errors.run("nodes"))
    });
    let gang_fields = (kind == WorkloadKind::Job).then(|| {
        let hint = move || {
            gang().map(|n| gang_hint(n, chosen_count.with(|c| c.trim().parse().unwrap_or(1))))
        };
        view! {
            <div class="gang" data-testid="gang-fields" hidden=move || gang().is_none()>
                {GANG_CHOICES.map(|(name, label, [(first, says), (other, other_says)])| view! {
                    <label for=format!("job-{name}")>{label}</label>
                    <select id=format!("job-{name}") name=name data-testid=format!("own-gpu-{name}")>
                        <option value=first selected>{says}</option>
                        <option value=other>{other_says}</option>
                    </select>
                    {errors.run(name)}
                })}
                <p class="hint" data-testid="gang-hint">{hint}</p>
            </div>
        }
    });
    let count_label = move || {
        if gang().is_some() {
            "GPUs per node"
        } else {
            "How many"
        }
    };
    let (hours_label, hours_hint) = match kind {
        WorkloadKind::Notebook => (
            "Hours",
            "At most this long; stopping it earlier gives the GPU back.",
        ),
        WorkloadKind::Job => (
            "Time limit (hours)",
            "The job is stopped after this long; its GPU is given back as soon as it ends.",
        ),
    };
    view! {
        <fieldset class="own-gpu" data-testid="own-gpu" hidden=move || !new_gpu.get()>
            <legend>"The GPU it queues for"</legend>
            <div class="field-row three">
                <div>
                    <label for=format!("{prefix}-gpu")>"GPU or MIG slice"</label>
                    <select
                        id=format!("{prefix}-gpu")
                        name="gpu"
                        data-testid="own-gpu-kind"
                        on:change=move |ev| chosen_gpu.set(event_target_value(&ev))
                    >
                        {gpu_options}
                    </select>
                    <p class="hint" data-testid="own-gpu-fits">{fits}</p>
                    {errors.run("gpu")}
                </div>
                {nodes_field}
                {NumberField::new(prefix, "count", chosen_count)
                    .view(count_label, (errors.run("count"), errors.run("gpus_per_node")))}
                {NumberField { placeholder: Some("8"), ..NumberField::new(prefix, "hours", chosen_hours) }
                    .view(hours_label, (errors.run("hours"), errors.run("duration_minutes")))}
                {priority_field}
                {team_field}
            </div>
            {gang_fields}
            <CostEstimate
                cost=estimate.cost
                testid="own-gpu-estimate"
                terms=" at today's prices, if it runs the whole time"
            />
            <p class="hint">
                {hours_hint}
                " It waits in your team's queue like any request; its page says why while it waits."
            </p>
        </fieldset>
    }
}

/// The form's "Nodes" as a gang's size: a whole number above 1 (anything else is one node
/// here; the server says what is wrong with it).
pub(super) fn gang_size(nodes: &str) -> Option<u32> {
    nodes.trim().parse::<u32>().ok().filter(|n| *n > 1)
}

/// What a gang of `nodes` × `per_node` is, and what each node is told.
pub(super) fn gang_hint(nodes: u32, per_node: u32) -> String {
    format!(
        "{} × {}, placed all at once; each node gets MASTER_ADDR, RANK, WORLD_SIZE… and \
         $TESSERA_HOSTFILE.",
        tessera_domain::text::count(u64::from(nodes), "node", "nodes"),
        tessera_domain::text::count(u64::from(per_node), "GPU", "GPUs"),
    )
}

/// "Fits now / waits" for a gang: the free count is the cluster's, not per node, so
/// enough in all only means it may fit.
pub(super) fn gang_fits(nodes: u32, per_node: u32, free: Option<u32>, free_text: &str) -> String {
    let needed = nodes.saturating_mul(per_node);
    let each = format!("{per_node} free");
    if free.unwrap_or(0) >= needed {
        format!("Fits now if {nodes} nodes each have {each} ({free_text} in all).")
    } else {
        format!(
            "Waits: {free_text}; it needs {needed} in all, {per_node} on each of {nodes} \
             nodes, and queues until they are free at once."
        )
    }
}

/// A gang job's two choices: each field's name and label, then its values and their words,
/// the default first.
#[allow(clippy::type_complexity)]
const GANG_CHOICES: [(&str, &str, [(&str, &str); 2]); 2] = [
    (
        "launcher",
        "Launcher",
        [
            ("each", "Every node runs the command"),
            ("rank0", "Only rank 0 runs it (mpirun)"),
        ],
    ),
    (
        "ranks",
        "Processes",
        [
            ("per_node", "One per node (torchrun, mpirun)"),
            ("per_gpu", "One per GPU"),
        ],
    ),
];

/// A whole-number field of the fieldset (`{prefix}-{name}`), kept in `value`. The server
/// renders the value it starts with (`1`, or empty under a `placeholder`).
struct NumberField {
    id: String,
    name: &'static str,
    value: RwSignal<String>,
    placeholder: Option<&'static str>,
    testid: Option<&'static str>,
}

impl NumberField {
    fn new(prefix: &str, name: &'static str, value: RwSignal<String>) -> Self {
        NumberField {
            id: format!("{prefix}-{name}"),
            name,
            value,
            placeholder: None,
            testid: None,
        }
    }

    /// The label, the input and, under it, `errors`.
    fn view(
        self,
        label: impl IntoView + 'static,
        errors: impl IntoView + 'static,
    ) -> impl IntoView {
        let value = self.value;
        let start = value.get_untracked();
        view! {
            <div>
                <label for=self.id.clone()>{label}</label>
                <input
                    id=self.id
                    name=self.name
                    type="number"
                    min="1"
                    inputmode="numeric"
                    value=(!start.is_empty()).then_some(start)
                    placeholder=self.placeholder
                    data-testid=self.testid
                    prop:value=move || value.get()
                    on:input=move |ev| value.set(event_target_value(&ev))
                />
                {errors}
            </div>
        }
    }
}
