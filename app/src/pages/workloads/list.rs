//! The workload list of /notebooks and /jobs, with the jobs filter.

use super::*;

#[component]
pub(super) fn ListSection(data: ListData) -> impl IntoView {
    let ListData {
        kind,
        stop,
        options,
        teams,
        filter,
        list,
        ..
    } = data;
    let (title, testid) = match kind {
        WorkloadKind::Notebook => ("Your notebooks", "notebooks"),
        WorkloadKind::Job => ("Jobs", "jobs"),
    };
    let filters = (kind == WorkloadKind::Job).then(|| view! { <JobFilter filter teams /> });
    view! {
        <section class="card wide" aria-labelledby="list-title">
            <h2 id="list-title">{title}</h2>
            {filters}
            {stop_error(stop)}
            <Transition fallback=Loading>
                {move || Suspend::new(async move {
                    let f = filter.get_untracked();
                    let labels = options.await.map(|o| o.labels).unwrap_or_default();
                    match list.await {
                        Ok(page) if page.total == 0 => {
                            let text = match kind {
                                WorkloadKind::Notebook => "No notebooks yet — launch one above.",
                                WorkloadKind::Job if f.is_default() => "No jobs yet — submit one above.",
                                WorkloadKind::Job => "No jobs match this filter.",
                            };
                            view! {
                                <Empty>
                                    <p>{text}</p>
                                </Empty>
                            }
                                .into_any()
                        }
                        Ok(page) => {
                            let pager = pager_with(&page, &|offset| f.href(kind, offset));
                            let rows = page
                                .items
                                .into_iter()
                                .map(|w| view! { <ListRow w labels=labels.clone() stop /> })
                                .collect_view();
                            let heads = match kind {
                                WorkloadKind::Notebook => {
                                    &["Name", "State", "Allocation", "Where", "Created", ""][..]
                                }
                                WorkloadKind::Job => {
                                    &[
                                        "Name",
                                        "State",
                                        "Exit code",
                                        "Attempt",
                                        "Allocation",
                                        "Team",
                                        "User",
                                        "Created",
                                        "",
                                    ][..]
                                }
                            };
                            view! {
                                {list_table(&Columns::new(testid, heads).class("list workloads"), rows)}
                                {pager}
                            }
                                .into_any()
                        }
                        Err(e) => view! { <Problem error=e.error /> }.into_any(),
                    }
                })}
            </Transition>
        </section>
    }
}

/// Team and "mine only" as a GET form: works without JavaScript, navigates in place with it.
#[component]
pub(super) fn JobFilter(
    filter: Memo<Filter>,
    teams: Resource<Result<Page<TeamView>, UiError>>,
) -> impl IntoView {
    view! {
        <Transition fallback=|| ()>
            {move || Suspend::new(async move {
                let current = filter.get_untracked();
                let options = teams
                    .await
                    .map(|p| p.items)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|t| {
                        let id = t.id.to_string();
                        let selected = id == current.team;
                        view! {
                            <option value=id selected=selected>
                                {t.name}
                            </option>
                        }
                    })
                    .collect_view();
                view! {
                    <MineFilter action="/jobs" id="filter-team" name="team" label="Team" mine=current.mine>
                        <option value="" selected=current.team.is_empty()>
                            "All my teams"
                        </option>
                        {options}
                    </MineFilter>
                }
            })}
        </Transition>
    }
}

#[component]
pub(super) fn ListRow(
    w: WorkloadView,
    labels: BTreeMap<String, String>,
    stop: ServerAction<StopWorkload>,
) -> impl IntoView {
    let href = format!("/workloads/{}", w.id);
    let alloc_href = format!("/allocations/{}", w.allocation_id);
    let alloc_label = labels
        .get(&w.allocation_id.to_string())
        .cloned()
        .unwrap_or_else(|| "allocation".to_owned());
    let stoppable = w.state.is_live() && w.state != WorkloadState::Stopping;
    let stop_button = stoppable.then(|| {
        view! { <StopButton id=w.id.to_string() kind=w.kind name=w.name.clone() action=stop /> }
    });
    let open = w.url.clone().map(|url| {
        view! {
            <a class="button small" href=url target="_blank" rel="noopener" data-testid="open-notebook">
                "Open"
            </a>
        }
    });
    let common_start = view! {
        <td>
            <a href=href data-testid="workload-link">
                {w.name.clone()}
            </a>
            {w.pull.map(|p| view! { " " <span class="badge muted" data-testid="pull-label">{p.label()}</span> })}
        </td>
        <td>
            <WorkloadBadge state=w.state />
        </td>
    };
    let cells = match w.kind {
        WorkloadKind::Notebook => view! {
            {common_start}
            <td>
                <a href=alloc_href>{alloc_label}</a>
            </td>
            <td class="where">{where_view(&w)}</td>
            <td>
                <When t=w.created_at />
            </td>
            <td class="actions">{open} {stop_button}</td>
        }
        .into_any(),
        WorkloadKind::Job => view! {
            {common_start}
            <td data-testid="exit-code">{w.exit_code.map(|c| c.to_string()).unwrap_or_else(|| "—".to_owned())}</td>
            <td>{tessera_domain::workload::attempt_label(w.attempt, w.retries)}</td>
            <td>
                <a href=alloc_href>{alloc_label}</a>
            </td>
            <td>{w.team_name.clone()}</td>
            <td>{w.username.clone()}</td>
            <td>
                <When t=w.created_at />
            </td>
            <td class="actions">{stop_button}</td>
        }
        .into_any(),
    };
    view! {
        <tr data-testid="workload-row" data-state=w.state.as_str() data-id=w.id.to_string() data-name=w.name.clone()>
            {cells}
        </tr>
    }
}
