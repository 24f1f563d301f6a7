//! The launch section and its forms (a notebook, a job).

use super::*;

#[component]
pub(super) fn LaunchSection(data: ListData) -> impl IntoView {
    let ListData {
        kind,
        launch,
        submit,
        options,
        preselect,
        estimate_for,
        estimate,
        ..
    } = data;
    let estimate = NewGpuEstimate {
        input: estimate_for,
        cost: estimate,
    };
    let title = match kind {
        WorkloadKind::Notebook => "Launch a notebook",
        WorkloadKind::Job => "Submit a job",
    };
    view! {
        <section class="card wide" aria-labelledby="launch-title">
            <h2 id="launch-title">{title}</h2>
            <Transition fallback=Loading>
                {move || Suspend::new(async move {
                    let chosen = preselect.get_untracked();
                    match options.await {
                        Ok(o) if o.free.is_empty() && o.gpus.is_empty() && o.profiles.is_empty() => {
                            view! { <NoFreeAllocation o kind /> }.into_any()
                        }
                        Ok(o) => {
                            let unusable = (!chosen.is_empty() && !o.free.iter().any(|c| c.id == chosen))
                                .then(|| {
                                    view! {
                                        <div class="notice warn" role="status" data-testid="preselect-unusable">
                                            "That allocation cannot take a workload now: it is not "
                                            "active, not yours, or already runs one. Choose another."
                                        </div>
                                    }
                                });
                            let form = match kind {
                                WorkloadKind::Notebook => {
                                    view! { <LaunchForm o chosen action=launch estimate /> }.into_any()
                                }
                                WorkloadKind::Job => {
                                    view! { <SubmitForm o chosen action=submit estimate /> }.into_any()
                                }
                            };
                            view! {
                                {unusable}
                                {form}
                            }
                                .into_any()
                        }
                        Err(e) => {
                            alert(format!("Your allocations could not be loaded: {}", e.error))
                        }
                    }
                })}
            </Transition>
        </section>
    }
}

/// Nothing to launch on: says why and where to get an allocation.
#[component]
pub(super) fn NoFreeAllocation(o: LaunchOptions, kind: WorkloadKind) -> impl IntoView {
    let what = match kind {
        WorkloadKind::Notebook => "A notebook",
        WorkloadKind::Job => "A job",
    };
    let why = if o.busy > 0 {
        format!(
            "{what} runs on one of your active GPU allocations, and each of yours already runs \
             a notebook or job. Stop one, or request another GPU."
        )
    } else {
        format!(
            "{what} needs an active GPU allocation of yours, and you have none. Request one \
             (a 1g.10gb MIG slice is plenty to start with); once it is active, come back here."
        )
    };
    let waiting = (o.pending > 0).then(|| {
        view! {
            <p class="hint">
                {format!(
                    "{} still waiting: ",
                    tessera_domain::text::count(
                        o.pending as u64,
                        "of your requests is",
                        "of your requests are",
                    ),
                )} <a href="/allocations">"see them"</a> "."
            </p>
        }
    });
    view! {
        <Empty>
            <p data-testid="no-allocation">{why}</p>
            {waiting}
            <a href="/allocations">"Request a GPU →"</a>
        </Empty>
    }
}

/// "Run on": one of the caller's free active allocations, or a GPU of the workload's own
/// (queued for, given back when it ends). `new_gpu` follows the choice.
#[component]
pub(super) fn RunOnSelect(
    choices: Vec<Choice>,
    chosen: String,
    input_id: &'static str,
    kind: WorkloadKind,
    can_request: bool,
    new_gpu: RwSignal<bool>,
    /// Notebooks: the team profiles, offered first.
    #[prop(optional)]
    profiles: Vec<Choice>,
) -> impl IntoView {
    // Nothing asked for: the caller's own free allocation first (a GPU they hold and pay
    // for already), then a team profile, then a new GPU.
    let chosen = match (chosen.is_empty(), choices.first(), profiles.first()) {
        (false, ..) => chosen,
        (true, Some(c), _) => c.id.clone(),
        (true, None, Some(p)) => p.id.clone(),
        (true, None, None) => api::NEW_GPU.to_owned(),
    };
    let option_list = |list: Vec<Choice>| {
        list.into_iter()
            .map(|c| {
                let selected = c.id == chosen;
                view! {
                    <option value=c.id selected=selected>
                        {c.label}
                    </option>
                }
            })
            .collect_view()
    };
    let profile_options = option_list(profiles);
    let options = option_list(choices);
    new_gpu.set(chosen == api::NEW_GPU);
    let own = can_request.then(|| {
        let label = match kind {
            WorkloadKind::Notebook => "A new GPU for this notebook (given back when it stops)",
            WorkloadKind::Job => "A new GPU for this job (queued; given back when it ends)",
        };
        view! {
            <option value=api::NEW_GPU selected=chosen == api::NEW_GPU>
                {label}
            </option>
        }
    });
    view! {
        <label for=input_id>"Run on"</label>
        <select
            id=input_id
            name="allocation_id"
            required
            on:change=move |ev| new_gpu.set(event_target_value(&ev) == api::NEW_GPU)
        >
            {options}
            {profile_options}
            {own}
        </select>
    }
}

/// The form's errors that belong to no field it shows (`fields`, in groups).
pub(super) fn other_error<T: 'static>(
    value: impl Fn() -> Option<Result<T, UiError>> + Send + Sync + Copy + 'static,
    fields: &'static [&'static [&'static str]],
) -> impl IntoView {
    move || {
        error_of(value())
            .filter(|e| {
                e.error
                    .field()
                    .is_none_or(|f| !fields.iter().any(|group| group.contains(&f)))
            })
            .map(|e| {
                view! {
                    <div class="form-error" role="alert" data-testid="launch-error">
                        {e.error.to_string()}
                    </div>
                }
            })
    }
}

/// The fields both forms show errors beside ([`WorkloadFields`] and the name).
pub(super) const WORKLOAD_FIELDS: [&str; 9] = [
    "allocation_id",
    "name",
    "image",
    "env",
    "gpu",
    "count",
    "hours",
    "duration_minutes",
    "team_id",
];
/// The fields only a job's form shows errors beside: its command and a gang's shape.
pub(super) const JOB_ONLY_FIELDS: [&str; 7] = [
    "command",
    "workdir",
    "retries",
    "nodes",
    "gpus_per_node",
    "launcher",
    "ranks",
];

pub(super) const ENV_PLACEHOLDER: &str =
    "One NAME=value per line, e.g.\nWANDB_PROJECT=resnet\nHF_HOME=cache/hf";

/// Keeps what a submitted "new GPU" asked for (`asked` of the action's `input`) as the
/// next form's start.
fn remember_gpu<A: Send + Sync + 'static>(
    kind: WorkloadKind,
    input: MappedSignal<Option<A>>,
    asked: fn(&A) -> Option<LastGpu>,
) {
    Effect::new(move |_| {
        if let Some(last) = input.with(|i| i.as_ref().and_then(asked)) {
            last.save(kind);
        }
    });
}

/// What the notebook and the job forms share: where the workload runs (one of the
/// caller's free allocations, `chosen` unless a failed submission echoed another, or a
/// new GPU), then `children` (what its kind asks for), then its environment and
/// variables, each with its error.
#[component]
fn WorkloadFields(
    o: LaunchOptions,
    chosen: String,
    kind: WorkloadKind,
    /// What a failed submission echoed for `field`.
    echo: Callback<&'static str, String>,
    /// The error of `field`, from the last submission.
    errors: Callback<&'static str, AnyView>,
    estimate: NewGpuEstimate,
    children: Children,
) -> impl IntoView {
    let (allocation_id, image_id, env_id) = match kind {
        WorkloadKind::Notebook => ("nb-allocation", "nb-image", "nb-env"),
        WorkloadKind::Job => ("job-allocation", "job-image", "job-env"),
    };
    let echoed_allocation = echo.run("allocation_id");
    let chosen = if echoed_allocation.is_empty() {
        chosen
    } else {
        echoed_allocation
    };
    // Team profiles are a notebook's only.
    let profiles = match kind {
        WorkloadKind::Notebook => o.profiles,
        WorkloadKind::Job => Vec::new(),
    };
    let new_gpu = RwSignal::new(false);
    view! {
        <input type="hidden" name="idempotency_key" value=o.key />
        <RunOnSelect
            choices=o.free
            chosen
            input_id=allocation_id
            kind
            can_request=!o.gpus.is_empty()
            new_gpu
            profiles
        />
        {errors.run("allocation_id")}
        <OwnGpuFields
            gpus=o.gpus
            teams=o.teams
            high=o.high
            free_now=o.free_now
            kind
            new_gpu
            errors
            estimate
        />
        {children()}
        <EnvironmentSelect input_id=image_id images=o.images chosen=echo.run("image") />
        {errors.run("image")}
        <label for=env_id>"Environment variables (optional)"</label>
        <textarea id=env_id name="env" rows="3" placeholder=ENV_PLACEHOLDER></textarea>
        {errors.run("env")}
    }
}

#[component]
pub(super) fn LaunchForm(
    o: LaunchOptions,
    chosen: String,
    action: ServerAction<LaunchNotebook>,
    estimate: NewGpuEstimate,
) -> impl IntoView {
    let value = move || action.value().get();
    remember_gpu(
        WorkloadKind::Notebook,
        action.input(),
        |i: &LaunchNotebook| LastGpu::of(&i.allocation_id, &i.gpu, &i.count, &i.hours),
    );
    let echo = Callback::new(move |f| untrack(echoed(value, f)));
    let errors = Callback::new(move |f| field_error(value, f).into_any());
    view! {
        <ActionForm action=action attr:data-testid="launch-form" attr:novalidate=true>
            {other_error(value, &[&WORKLOAD_FIELDS])}
            <WorkloadFields o chosen kind=WorkloadKind::Notebook echo errors estimate>
                <Field result=value id="nb-name" name="name" label="Name" keep=true default="default"
                    input=FieldInput::text().maxlength("32")
                    hint="Lowercase letters, digits and -; part of the notebook's address." />
            </WorkloadFields>
            <button type="submit" class="primary" disabled=move || action.pending().get()>
                {move || if action.pending().get() { "Launching…" } else { "Launch notebook" }}
            </button>
        </ActionForm>
    }
}

#[component]
pub(super) fn SubmitForm(
    o: LaunchOptions,
    chosen: String,
    action: ServerAction<SubmitJob>,
    estimate: NewGpuEstimate,
) -> impl IntoView {
    let value = move || action.value().get();
    remember_gpu(WorkloadKind::Job, action.input(), |i: &SubmitJob| {
        LastGpu::of(&i.allocation_id, &i.gpu, &i.count, &i.hours)
    });
    let echo = Callback::new(move |f| untrack(echoed(value, f)));
    let errors = Callback::new(move |f| field_error(value, f).into_any());
    view! {
        <ActionForm action=action attr:data-testid="submit-form" attr:novalidate=true>
            {other_error(value, &[&WORKLOAD_FIELDS, &JOB_ONLY_FIELDS])}
            <WorkloadFields o chosen kind=WorkloadKind::Job echo errors estimate>
                <label for="job-command">"Command"</label>
                <textarea
                    id="job-command"
                    name="command"
                    rows="3"
                    required
                    placeholder="python train.py --epochs 10"
                >
                    {echo.run("command")}
                </textarea>
                <p class="hint">
                    "Run by /bin/sh in the working folder; the exit code decides success."
                </p>
                {errors.run("command")}
                <div class="field-row three">
                    <div>
                        <Field result=value id="job-name" name="name" label="Name (optional)" keep=true
                            input=FieldInput::text().maxlength("80").placeholder("the command") />
                    </div>
                    <div>
                        <Field result=value id="job-workdir" name="workdir"
                            label="Working folder (optional)" keep=true
                            input=FieldInput::text().placeholder("projects/resnet") />
                    </div>
                    <div>
                        <Field result=value id="job-retries" name="retries" label="Retries on failure"
                            keep=true default="0" input=FieldInput::number("0").max("5") />
                    </div>
                </div>
                <p class="hint">
                    "The working folder is inside your team's workspace; empty: its top."
                </p>
            </WorkloadFields>
            <button type="submit" class="primary" disabled=move || action.pending().get()>
                {move || if action.pending().get() { "Submitting…" } else { "Submit job" }}
            </button>
        </ActionForm>
    }
}
