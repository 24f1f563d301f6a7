//! Small building blocks shared by pages: the signed-in layout, form errors, list states
//! (loading, empty, pagination), error pages and times.

pub mod card;
pub mod images;

pub use card::{Card, Panel, SecretCard};

/// Asks before a destructive form post once hydrated (a native confirmation); without the
/// wasm bundle the button posts the form directly.
pub fn confirm_or_cancel(ev: &leptos::ev::MouseEvent, question: &str) {
    #[cfg(feature = "hydrate")]
    if !window().confirm_with_message(question).unwrap_or(false) {
        ev.prevent_default();
    }
    #[cfg(not(feature = "hydrate"))]
    let _ = (ev, question);
}

/// A list's filter as a GET form to `action` (it works without JavaScript): one select
/// (`id`, `name`, its `label`, `children` its options) and a "Mine only" box.
#[component]
pub fn MineFilter(
    action: &'static str,
    id: &'static str,
    name: &'static str,
    label: &'static str,
    mine: bool,
    children: Children,
) -> impl IntoView {
    view! {
        <Form method="get" action=action attr:class="filters">
            <input type="hidden" name="filtered" value="1" />
            <label for=id>{label}</label>
            <select id=id name=name>
                {children()}
            </select>
            <label class="check">
                <input type="checkbox" name="mine" value="1" checked=mine />
                " Mine only"
            </label>
            <button type="submit">"Show"</button>
        </Form>
    }
}

/// A token row's revoke form's inside: the hidden `id` and the button.
pub fn revoke_fields<S>(id: uuid::Uuid, revoke: ServerAction<S>) -> impl IntoView
where
    S: leptos::server_fn::ServerFn + Clone + Send + Sync + 'static,
    S::Output: Send + Sync + 'static,
    S::Error: Send + Sync + 'static,
{
    let pending = revoke.pending();
    view! {
        <input type="hidden" name="id" value=id.to_string() />
        <button type="submit" class="danger" disabled=move || pending.get()>
            "Revoke"
        </button>
    }
}

/// A form's "Remove" submit button that asks `question` first, after the hidden field
/// (`name`, `value`) that says what to remove.
#[component]
pub fn RemoveButton(name: &'static str, value: String, question: String) -> impl IntoView {
    view! {
        <input type="hidden" name=name value=value />
        <ConfirmSubmit question>"Remove"</ConfirmSubmit>
    }
}

/// A submit button that asks `question` before its form is sent, off while `pending`.
#[component]
pub fn ConfirmSubmit(
    question: String,
    #[prop(default = "danger")] class: &'static str,
    #[prop(optional)] testid: Option<&'static str>,
    #[prop(optional, into)] pending: Signal<bool>,
    children: Children,
) -> impl IntoView {
    view! {
        <button
            type="submit"
            class=class
            data-testid=testid
            disabled=move || pending.get()
            on:click=move |ev| confirm_or_cancel(&ev, &question)
        >
            {children()}
        </button>
    }
}

use crate::api::{self, UiError};
use chrono::{DateTime, Utc};
use leptos::prelude::*;
use leptos_router::components::{A, Form, Redirect};
use leptos_router::hooks::use_query_map;
use tessera_domain::account::Me;
use tessera_domain::error::AppError;
use tessera_domain::mig::Catalog;
use tessera_domain::tenancy::{Page, PageRequest};

/// Items per page on every list.
pub const PAGE_SIZE: u32 = 25;

/// Sets `body[data-hydrated]` once the wasm bundle has taken over the whole page (lazily
/// loaded routes included), so browser tests (and curious humans) can tell a hydrated page
/// from a server-rendered one.
#[cfg(feature = "hydrate")]
pub fn set_hydrated() {
    if let Some(body) = web_sys::window()
        .and_then(|w| w.document())
        .and_then(|d| d.body())
    {
        let _ = body.set_attribute("data-hydrated", "true");
    }
}

/// What moved, as the live stream (`GET /events`, one per tab) reports it: counters that
/// pages follow to reload their data at once, and whether the stream is open (while it
/// is, pages do not poll).
#[derive(Clone, Copy)]
pub struct Live {
    work: RwSignal<u32>,
    nodes: RwSignal<u32>,
    connected: RwSignal<bool>,
}

/// What a page follows: allocations and workloads of the viewer's teams (queues and
/// dashboards with them), or the nodes' GPU layouts.
#[derive(Clone, Copy)]
pub enum Topic {
    Work,
    Nodes,
}

impl Live {
    fn counter(self, topic: Topic) -> RwSignal<u32> {
        match topic {
            Topic::Work => self.work,
            Topic::Nodes => self.nodes,
        }
    }
}

/// Opens the tab's live stream once hydrated (the app calls it once).
pub fn provide_live() {
    let live = Live {
        work: RwSignal::new(0),
        nodes: RwSignal::new(0),
        connected: RwSignal::new(false),
    };
    provide_context(live);
    Effect::new(move |_| {
        #[cfg(feature = "hydrate")]
        live_stream::start(live);
    });
}

/// Whether this tab is in the background (never on the server).
fn tab_hidden() -> bool {
    #[cfg(feature = "hydrate")]
    {
        live_stream::hidden()
    }
    #[cfg(not(feature = "hydrate"))]
    {
        false
    }
}

/// The tab's stream. Only a visible tab holds one: over plain HTTP/1.1 a browser opens at
/// most six connections to a host, and a stream per background tab would use them up.
/// A tab coming back to the front opens it again and reloads what it shows.
#[cfg(feature = "hydrate")]
mod live_stream {
    use super::Live;
    use leptos::prelude::*;
    use std::cell::RefCell;
    use wasm_bindgen::JsCast;
    use wasm_bindgen::closure::Closure;

    /// After the stream fails for good (signed out, server gone): try again this late.
    const RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

    thread_local! {
        static SOURCE: RefCell<Option<web_sys::EventSource>> = const { RefCell::new(None) };
    }

    pub(super) fn hidden() -> bool {
        web_sys::window()
            .and_then(|w| w.document())
            .is_some_and(|d| d.hidden())
    }

    pub(super) fn start(live: Live) {
        if let Some(document) = web_sys::window().and_then(|w| w.document()) {
            let on_visibility = Closure::<dyn Fn()>::new(move || {
                if hidden() {
                    close(live);
                } else if SOURCE.with(|s| s.borrow().is_none()) {
                    open(live);
                    // What changed while in the background.
                    live.work.update(|n| *n = n.wrapping_add(1));
                    live.nodes.update(|n| *n = n.wrapping_add(1));
                }
            });
            let _ = document.add_event_listener_with_callback(
                "visibilitychange",
                on_visibility.as_ref().unchecked_ref(),
            );
            on_visibility.forget();
        }
        if !hidden() {
            open(live);
        }
    }

    fn close(live: Live) {
        if let Some(source) = SOURCE.with(|s| s.borrow_mut().take()) {
            source.close();
        }
        live.connected.set(false);
    }

    fn open(live: Live) {
        let Ok(source) = web_sys::EventSource::new("/events") else {
            return;
        };
        let on_change =
            Closure::<dyn Fn(web_sys::MessageEvent)>::new(move |e: web_sys::MessageEvent| {
                let moved = e.data().as_string().unwrap_or_default();
                for (name, counter) in [("work", live.work), ("nodes", live.nodes)] {
                    if moved.split(',').any(|m| m == name) {
                        counter.update(|n| *n = n.wrapping_add(1));
                    }
                }
            });
        let _ =
            source.add_event_listener_with_callback("change", on_change.as_ref().unchecked_ref());
        on_change.forget();
        let on_open = Closure::<dyn Fn()>::new(move || live.connected.set(true));
        source.set_onopen(Some(on_open.as_ref().unchecked_ref()));
        on_open.forget();
        let stream = source.clone();
        let on_error = Closure::<dyn Fn()>::new(move || {
            live.connected.set(false);
            // The browser retries a dropped stream by itself; one it gave up on (an error
            // status, e.g. signed out) is opened again later, if the tab is in front.
            if stream.ready_state() == web_sys::EventSource::CLOSED {
                SOURCE.with(|s| s.borrow_mut().take());
                set_timeout(
                    move || {
                        if !hidden() && SOURCE.with(|s| s.borrow().is_none()) {
                            open(live);
                        }
                    },
                    RETRY_AFTER,
                );
            }
        });
        source.set_onerror(Some(on_error.as_ref().unchecked_ref()));
        on_error.forget();
        SOURCE.with(|s| *s.borrow_mut() = Some(source));
    }
}

/// A counter that moves when what a page shows may have changed: at once when the live
/// stream says one of `topics` moved, and every `every` when `poll(streaming)` says so
/// (most pages: only while the stream is down; some, like a queued allocation whose
/// position moves with other teams' requests, also while it is open).
pub fn refresher(
    topics: &'static [Topic],
    every: std::time::Duration,
    poll: impl Fn(bool) -> bool + 'static,
) -> RwSignal<u32> {
    let tick = RwSignal::new(0u32);
    let live = use_context::<Live>();
    if let Some(live) = live {
        Effect::new(move |seen: Option<()>| {
            for t in topics {
                live.counter(*t).track();
            }
            if seen.is_some() {
                tick.update(|n| *n = n.wrapping_add(1));
            }
        });
    }
    let poll = std::rc::Rc::new(poll);
    Effect::new(move |_| {
        let poll = poll.clone();
        if let Ok(handle) = set_interval_with_handle(
            move || {
                let streaming = live.is_some_and(|l| l.connected.get_untracked());
                // A background tab waits: it reloads when it comes back to the front.
                if !tab_hidden() && poll(streaming) {
                    tick.update(|n| *n = n.wrapping_add(1));
                }
            },
            every,
        ) {
            on_cleanup(move || handle.clear());
        }
    });
    tick
}

/// `true` once the wasm bundle runs; always `false` while rendering on the server.
pub fn use_hydrated() -> ReadSignal<bool> {
    let (hydrated, set) = signal(false);
    Effect::new(move |_| set.set(true));
    hydrated
}

/// Whether the signed-in user is a platform admin (see [`Authenticated`]).
pub fn is_admin() -> bool {
    use_context::<Me>().is_some_and(|me| me.is_admin)
}

/// The error of an action's last result, if it failed.
pub fn error_of<T>(value: Option<Result<T, UiError>>) -> Option<UiError> {
    value.and_then(Result::err)
}

/// The error message for one field, from the last submission.
pub fn field_error<T: 'static>(
    value: impl Fn() -> Option<Result<T, UiError>> + Send + Sync + 'static,
    field: &'static str,
) -> impl IntoView {
    move || {
        error_of(value()).and_then(|e| e.for_field(field)).map(|m| {
            view! {
                <p class="field-error" id=format!("{field}-error") role="alert">
                    {m}
                </p>
            }
        })
    }
}

/// The form-level error (anything not tied to a field).
pub fn form_error<T: 'static>(
    value: impl Fn() -> Option<Result<T, UiError>> + Send + Sync + 'static,
) -> impl IntoView {
    move || error_of(value()).and_then(|e| e.general()).map(alert)
}

/// A refused action's message as an alert (`testid`): `forbidden` where the caller may not
/// do it, else the error's own words.
pub fn refusal(e: UiError, forbidden: impl Into<String>, testid: &'static str) -> impl IntoView {
    let text = match e.error {
        AppError::Forbidden => forbidden.into(),
        other => other.to_string(),
    };
    view! {
        <div class="form-error" role="alert" data-testid=testid>
            {text}
        </div>
    }
}

/// What the user typed into `field`, as echoed back by a failed submission (so a form
/// posted without JavaScript keeps its values); empty after a success, which clears the
/// field for the next entry.
pub fn echoed<T: 'static>(
    value: impl Fn() -> Option<Result<T, UiError>> + Send + Sync + Copy + 'static,
    field: &'static str,
) -> impl Fn() -> String + Send + Sync + Copy + 'static {
    move || {
        error_of(value())
            .and_then(|e| e.echoed(field))
            .unwrap_or_default()
    }
}

/// What a [`Field`] asks for: the type of its input and the constraints the browser shows.
/// Built like `FieldInput::number("1").placeholder("never")`.
#[derive(Debug, Clone, Copy)]
pub struct FieldInput {
    kind: Option<&'static str>,
    min: Option<&'static str>,
    max: Option<&'static str>,
    inputmode: Option<&'static str>,
    placeholder: Option<&'static str>,
    autocomplete: Option<&'static str>,
    maxlength: Option<&'static str>,
    /// A `<textarea>` of this many rows instead of an `<input>`.
    rows: Option<&'static str>,
    required: bool,
}

impl FieldInput {
    /// An input of text with no constraints (or, with options, a plain `<select>`).
    pub const PLAIN: Self = Self {
        kind: None,
        min: None,
        max: None,
        inputmode: None,
        placeholder: None,
        autocomplete: None,
        maxlength: None,
        rows: None,
        required: false,
    };

    /// Free text the browser should not complete from history (names, notes).
    pub const fn text() -> Self {
        Self::PLAIN.autocomplete("off")
    }

    /// A whole number from `min` up, with the numeric keypad on phones.
    pub const fn number(min: &'static str) -> Self {
        Self {
            kind: Some("number"),
            min: Some(min),
            inputmode: Some("numeric"),
            ..Self::PLAIN
        }
    }

    /// An input of another `type` (`url`, `email`, `datetime-local`…).
    pub const fn of(kind: &'static str) -> Self {
        Self {
            kind: Some(kind),
            ..Self::PLAIN
        }
    }

    /// Text over several lines: a `<textarea>` of `rows` rows.
    pub const fn lines(rows: &'static str) -> Self {
        Self {
            rows: Some(rows),
            ..Self::PLAIN
        }
    }

    pub const fn placeholder(self, placeholder: &'static str) -> Self {
        Self {
            placeholder: Some(placeholder),
            ..self
        }
    }

    pub const fn autocomplete(self, autocomplete: &'static str) -> Self {
        Self {
            autocomplete: Some(autocomplete),
            ..self
        }
    }

    pub const fn inputmode(self, inputmode: &'static str) -> Self {
        Self {
            inputmode: Some(inputmode),
            ..self
        }
    }

    pub const fn max(self, max: &'static str) -> Self {
        Self {
            max: Some(max),
            ..self
        }
    }

    pub const fn maxlength(self, maxlength: &'static str) -> Self {
        Self {
            maxlength: Some(maxlength),
            ..self
        }
    }

    pub const fn required(self) -> Self {
        Self {
            required: true,
            ..self
        }
    }
}

impl Default for FieldInput {
    fn default() -> Self {
        Self::PLAIN
    }
}

/// A form field: its label, its input (see [`FieldInput`]), an optional hint and the error
/// the last submission gave it. The input shows what the user typed when a submission
/// failed (so a form posted without JavaScript keeps its values), else `default`; a success
/// clears it for the next entry unless `keep` says otherwise. A password is never shown
/// again.
#[component]
pub fn Field<T, R>(
    /// The form's last result (`move || action.value().get()`).
    result: R,
    /// The element id the label points at.
    #[prop(into)]
    id: String,
    /// The form field's name, as the server function and its errors call it.
    name: &'static str,
    label: &'static str,
    #[prop(optional)] input: FieldInput,
    /// What the input shows when nothing was echoed back.
    #[prop(optional, into)]
    default: String,
    /// A line under the input that describes it (`id="{id}-hint"`).
    #[prop(optional)]
    hint: Option<&'static str>,
    /// Leaves what the user typed in place after a success.
    #[prop(optional)]
    keep: bool,
    /// Follows what the user types or chooses, for what the form works out from it (an
    /// estimate).
    #[prop(optional)]
    typed: Option<RwSignal<String>>,
    /// The options of a `<select>`, which the field then is instead of an input.
    #[prop(optional)]
    children: Option<Children>,
) -> impl IntoView
where
    T: 'static,
    R: Fn() -> Option<Result<T, UiError>> + Send + Sync + Copy + 'static,
{
    let echo = echoed(result, name);
    let value = move || {
        let typed = echo();
        if typed.is_empty() {
            default.clone()
        } else {
            typed
        }
    };
    let FieldInput {
        kind,
        min,
        max,
        inputmode,
        placeholder,
        autocomplete,
        maxlength,
        rows,
        required,
    } = input;
    let hint_id = hint.map(|_| format!("{id}-hint"));
    let hint = hint.map(|text| {
        view! {
            <p class="hint" id=hint_id.clone()>
                {text}
            </p>
        }
    });
    let echoes = kind != Some("password");
    let follow = move |ev: leptos::ev::Event| {
        if let Some(typed) = typed {
            typed.set(event_target_value(&ev));
        }
    };
    let control = match (children, rows) {
        (Some(options), _) => view! {
            <select id=id.clone() name=name required=required on:change=follow>
                {options()}
            </select>
        }
        .into_any(),
        (None, Some(rows)) => {
            let typed = untrack(value.clone());
            view! {
                <textarea
                    id=id.clone()
                    name=name
                    rows=rows
                    maxlength=maxlength
                    placeholder=placeholder
                    required=required
                    prop:value=move || (!keep).then(&value)
                >
                    {typed}
                </textarea>
            }
            .into_any()
        }
        (None, None) => view! {
            <input
                id=id.clone()
                name=name
                type=kind
                min=min
                max=max
                inputmode=inputmode
                placeholder=placeholder
                autocomplete=autocomplete
                maxlength=maxlength
                required=required
                aria-describedby=hint_id
                value={
                    let value = value.clone();
                    move || echoes.then(&value)
                }
                prop:value=move || (echoes && !keep).then(&value)
                on:input=follow
            />
        }
        .into_any(),
    };
    view! {
        <label for=id>{label}</label>
        {control}
        {hint}
        {field_error(result, name)}
    }
}

/// A password input with a show/hide toggle (the toggle needs the wasm bundle), and the
/// error the last submission gave it.
#[component]
pub fn PasswordInput<T, R>(
    /// The form's last result (`move || action.value().get()`).
    result: R,
    name: &'static str,
    label: &'static str,
    #[prop(default = "current-password")] autocomplete: &'static str,
    /// Overrides the element id (defaults to `name`), for forms repeated on one page.
    #[prop(optional, into)]
    id: Option<String>,
) -> impl IntoView
where
    T: 'static,
    R: Fn() -> Option<Result<T, UiError>> + Send + Sync + Copy + 'static,
{
    let visible = RwSignal::new(false);
    let id = id.unwrap_or_else(|| name.to_owned());
    view! {
        <label for=id.clone()>{label}</label>
        <div class="password-input">
            <input
                id=id.clone()
                name=name
                type=move || if visible.get() { "text" } else { "password" }
                autocomplete=autocomplete
                required
            />
            <button
                type="button"
                class="toggle"
                data-toggle-for=id
                aria-label=move || if visible.get() { "Hide password" } else { "Show password" }
                on:click=move |_| visible.update(|v| *v = !*v)
            >
                {move || if visible.get() { "Hide" } else { "Show" }}
            </button>
        </div>
        {field_error(result, name)}
    }
}

/// Renders `children` inside the app layout for a signed-in user; sends everyone else to the
/// login page. The signed-in user is provided as context ([`Me`]).
#[component]
pub fn Authenticated(children: ChildrenFn) -> impl IntoView {
    let me = Resource::new(|| (), |_| api::current_user());
    let children = StoredValue::new(children);
    view! {
        <Suspense fallback=Loading>
            {move || Suspend::new(async move {
                match me.await {
                    Ok(Some(user)) => {
                        provide_context(user.clone());
                        view! { <Layout me=user>{children.read_value()()}</Layout> }.into_any()
                    }
                    Ok(None) => view! { <Redirect path="/login" /> }.into_any(),
                    Err(e) => {
                        alert(e.error.to_string())
                    }
                }
            })}
        </Suspense>
    }
}

/// The main navigation after "Dashboard": `(path, label)`.
const MAIN_NAV: &[(&str, &str)] = &[
    ("/allocations", "GPUs"),
    ("/bookings", "Bookings"),
    ("/notebooks", "Notebooks"),
    ("/jobs", "Jobs"),
    ("/usage", "Usage"),
    ("/nodes", "Nodes"),
    ("/teams", "Teams"),
];

/// The platform admins' pages, in their own group of the navigation.
const ADMIN_NAV: &[(&str, &str)] = &[
    ("/admin/users", "Users"),
    ("/admin/join-tokens", "Join tokens"),
    ("/admin/queue", "Queue"),
    ("/admin/billing", "Billing"),
    ("/admin/images", "Images"),
    ("/admin/audit", "Audit"),
];

/// Links to `pages` (marked `aria-current` on the page one is on).
fn nav_links(pages: &'static [(&'static str, &'static str)]) -> impl IntoView {
    pages
        .iter()
        .map(|&(href, label)| view! { <A href=href>{label}</A> })
        .collect_view()
}

#[component]
fn Layout(me: Me, children: Children) -> impl IntoView {
    let logout = ServerAction::<api::Logout>::new();
    view! {
        <header class="topbar">
            <a class="brand" href="/">
                "Tessera"
            </a>
            <nav aria-label="Main">
                <A href="/" exact=true>
                    "Dashboard"
                </A>
                {nav_links(MAIN_NAV)}
                {me
                    .is_admin
                    .then(|| {
                        view! {
                            <span class="nav-group" aria-label="Administration">
                                {nav_links(ADMIN_NAV)}
                            </span>
                        }
                    })}
                <A href="/account">"My account"</A>
            </nav>
            <div class="user">
                <span class="username" data-testid="current-user">
                    {me.username.clone()}
                </span>
                {me.is_admin.then(|| view! { <span class="badge">"admin"</span> })}
                <ActionForm action=logout attr:class="inline">
                    <button type="submit" class="link" disabled=move || logout.pending().get()>
                        "Log out"
                    </button>
                </ActionForm>
            </div>
        </header>
        <main class="content">{children()}</main>
    }
}

/// Shown while a page or list loads for the first time.
#[component]
pub fn Loading() -> impl IntoView {
    view! {
        <p class="loading" role="status" aria-busy="true">
            "Loading…"
        </p>
    }
}

/// A list with nothing in it: says so, and what to do next.
#[component]
pub fn Empty(children: Children) -> impl IntoView {
    view! {
        <div class="empty-state" role="status">
            {children()}
        </div>
    }
}

/// A page whose data could not be shown: no permission, not found, or another failure.
/// Sets the matching HTTP status when rendered on the server.
#[component]
pub fn Problem(
    error: AppError,
    /// Who may see it, said instead of "It is for platform admins" on a 403.
    #[prop(optional)]
    forbidden: Option<&'static str>,
) -> impl IntoView {
    #[cfg(feature = "ssr")]
    if let Some(res) = use_context::<leptos_axum::ResponseOptions>()
        && let Ok(code) = http::StatusCode::from_u16(error.status())
    {
        res.set_status(code);
    }
    match error {
        AppError::Forbidden => view! {
            <section class="problem" role="alert" data-testid="forbidden">
                <h2>"You do not have permission to see this page"</h2>
                <p>
                    {forbidden.unwrap_or("It is for platform admins.")} " Ask one if you need access."
                </p>
                <a href="/">"Back to the dashboard"</a>
            </section>
        }
        .into_any(),
        AppError::NotFound => view! {
            <section class="problem" role="alert" data-testid="not-found">
                <h2>"Not found"</h2>
                <p>"It does not exist, or you are not a member of its team."</p>
                <a href="/">"Back to the dashboard"</a>
            </section>
        }
        .into_any(),
        AppError::Unauthorized => view! { <Redirect path="/login" /> }.into_any(),
        other => alert(other.to_string()),
    }
}

/// Renders `children` for platform admins; everyone else reads that they may not. (The
/// server refuses the data anyway; this only saves a round trip and says it kindly.)
#[component]
pub fn AdminOnly(children: Children) -> impl IntoView {
    if is_admin() {
        children().into_any()
    } else {
        view! { <Problem error=AppError::Forbidden /> }.into_any()
    }
}

/// The `?offset=` of the current list page.
pub fn use_offset() -> Memo<u32> {
    let query = use_query_map();
    Memo::new(move |_| {
        query
            .read()
            .get("offset")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    })
}

/// "Showing 26–50 of 73" with previous/next links (`path?offset=…`), or nothing when the
/// whole list fits on one page.
pub fn pager<T: 'static>(page: &Page<T>, path: &str) -> impl IntoView + use<T> {
    pager_with(page, &|offset| format!("{path}?offset={offset}"))
}

/// The pager with links made by `href(offset)`, for lists whose URL carries a filter too.
pub fn pager_with<T: 'static>(
    page: &Page<T>,
    href: &dyn Fn(u32) -> String,
) -> impl IntoView + use<T> {
    let shown = page.items.len() as u64;
    let first = u64::from(page.offset) + 1;
    let last = u64::from(page.offset) + shown;
    let total = page.total;
    let single = !page.has_prev() && !page.has_next();
    let prev = page
        .has_prev()
        .then(|| href(page.offset.saturating_sub(page.limit)));
    let next = page
        .has_next()
        .then(|| href(page.offset.saturating_add(page.limit)));
    let summary = if shown == 0 {
        format!("Nothing on this page ({total} in all)")
    } else {
        format!("Showing {first}–{last} of {total}")
    };
    (!single).then(|| {
        view! {
            <nav class="pager" aria-label="Pages">
                <span class="range" data-testid="page-range">
                    {summary}
                </span>
                {prev
                    .map(|href| {
                        view! {
                            <a href=href rel="prev">
                                "← Previous"
                            </a>
                        }
                    })}
                {next
                    .map(|href| {
                        view! {
                            <a href=href rel="next">
                                "Next →"
                            </a>
                        }
                    })}
            </nav>
        }
    })
}

/// The current time: the server's clock when rendering there, the browser's after hydration.
pub fn now() -> DateTime<Utc> {
    #[cfg(feature = "hydrate")]
    {
        DateTime::from_timestamp_millis(web_sys::js_sys::Date::now() as i64).unwrap_or_default()
    }
    #[cfg(not(feature = "hydrate"))]
    {
        Utc::now()
    }
}

/// An absolute UTC time, to the minute.
pub fn timestamp(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M UTC").to_string()
}

/// "12 s ago", "in 3 h", "just now".
pub fn relative(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let secs = (now - t).num_seconds();
    let span = secs.unsigned_abs();
    let amount = match span {
        0..=4 => return "just now".to_owned(),
        5..=59 => format!("{span} s"),
        60..=3_599 => format!("{} min", span / 60),
        3_600..=86_399 => format!("{} h", span / 3_600),
        _ => format!("{} d", span / 86_400),
    };
    if secs > 0 {
        format!("{amount} ago")
    } else {
        format!("in {amount}")
    }
}

/// A time shown relative to now, with the exact time on hover.
#[component]
pub fn When(t: DateTime<Utc>) -> impl IntoView {
    view! {
        <time datetime=t.to_rfc3339() title=timestamp(t)>
            {relative(t, now())}
        </time>
    }
}

/// This portal's address as the browser sees it (`https://gpu.example.org`), once hydrated.
pub fn origin() -> Option<String> {
    #[cfg(feature = "hydrate")]
    {
        window().location().origin().ok()
    }
    #[cfg(not(feature = "hydrate"))]
    {
        None
    }
}

/// The submit button of a form whose answer is a secret shown once. A plain form post
/// cannot carry the secret back, so the button waits for the wasm bundle (and says why
/// when JavaScript is off).
#[component]
pub fn SecretSubmit(label: &'static str, pending: Memo<bool>) -> impl IntoView {
    let hydrated = use_hydrated();
    view! {
        <noscript>
            <p class="hint">
                "Creating a token needs JavaScript: its secret is shown only once, on this page."
            </p>
        </noscript>
        <button type="submit" class="primary" disabled=move || !hydrated.get() || pending.get()>
            {label}
        </button>
    }
}

/// A secret shown exactly once, with what to do with it.
#[component]
pub fn SecretBox(
    #[prop(into)] title: String,
    secret: String,
    /// A ready-to-run command that contains the secret, if any.
    #[prop(optional)]
    command: Option<String>,
) -> impl IntoView {
    view! {
        <section class="secret-box" role="status" data-testid="secret-box">
            <h3>{title}</h3>
            <p>
                <strong>"Copy it now: it will not be shown again."</strong>
                " Only a hash is stored. Click the value to select it, then copy."
            </p>
            <code class="secret" data-testid="secret">
                {secret}
            </code>
            {command
                .map(|c| {
                    view! {
                        <p class="hint">"On the GPU host, run:"</p>
                        <code class="secret command" data-testid="command">
                            {c}
                        </code>
                    }
                })}
        </section>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_times_read_naturally() {
        let now = DateTime::<Utc>::from_timestamp(1_000_000, 0).expect("time");
        let at = |s: i64| now - chrono::Duration::seconds(s);
        assert_eq!(relative(at(2), now), "just now");
        assert_eq!(relative(at(42), now), "42 s ago");
        assert_eq!(relative(at(150), now), "2 min ago");
        assert_eq!(relative(at(-7_300), now), "in 2 h");
        assert_eq!(relative(at(3 * 86_400), now), "3 d ago");
    }
}

/// How a list's table looks: its CSS class, test id, accessible name and column headings.
#[derive(Debug, Clone)]
pub struct Columns {
    class: &'static str,
    testid: Option<&'static str>,
    label: Option<String>,
    headers: Vec<&'static str>,
    /// Headings marked `scope="col"`.
    scoped: bool,
    /// Columns of numbers (from 0), right-aligned by `class="num"`.
    numeric: Vec<usize>,
}

impl Columns {
    pub fn new(testid: &'static str, headers: &[&'static str]) -> Self {
        Columns::unnamed(headers).testid(testid)
    }

    /// A table without a test id.
    pub fn unnamed(headers: &[&'static str]) -> Self {
        Columns {
            class: "list",
            testid: None,
            label: None,
            headers: headers.to_vec(),
            scoped: false,
            numeric: Vec::new(),
        }
    }

    /// The table's test id.
    pub fn testid(self, testid: &'static str) -> Self {
        Columns {
            testid: Some(testid),
            ..self
        }
    }

    /// The table's class instead of `list` (e.g. `list audit`, for its column widths).
    pub fn class(self, class: &'static str) -> Self {
        Columns { class, ..self }
    }

    /// The table's accessible name (`aria-label`).
    pub fn label(self, label: impl Into<String>) -> Self {
        Columns {
            label: Some(label.into()),
            ..self
        }
    }

    /// Headings that say they head columns (`scope="col"`), `numeric` ones right-aligned.
    pub fn scoped(self, numeric: &[usize]) -> Self {
        Columns {
            scoped: true,
            numeric: numeric.to_vec(),
            ..self
        }
    }
}

/// Page links for the list at `path` (`path?offset=N`).
pub fn at(path: impl Into<String>) -> impl Fn(u32) -> String + Send + Sync + Clone + 'static {
    let path = path.into();
    move |offset| format!("{path}?offset={offset}")
}

/// The table of a list: headings and rows.
pub fn list_table<R: IntoView>(columns: &Columns, rows: R) -> impl IntoView + use<R> {
    footed_table(columns, rows, None::<()>)
}

/// [`list_table`] with a footer where `foot` holds one (its rows: totals and the like).
pub fn footed_table<R: IntoView, F: IntoView>(
    columns: &Columns,
    rows: R,
    foot: Option<F>,
) -> impl IntoView + use<R, F> {
    let scope = columns.scoped.then_some("col");
    let heads = columns
        .headers
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let class = columns.numeric.contains(&i).then_some("num");
            view! {
                <th scope=scope class=class>
                    {*h}
                </th>
            }
        })
        .collect_view();
    view! {
        <table class=columns.class aria-label=columns.label.clone() data-testid=columns.testid>
            <thead>
                <tr>{heads}</tr>
            </thead>
            <tbody>{rows}</tbody>
            {foot.map(|f| view! { <tfoot>{f}</tfoot> })}
        </table>
    }
}

/// What a list's resource may hold: server-function results, which the server renders
/// and the browser receives again to hydrate.
pub trait Loadable:
    Clone + Send + Sync + serde::Serialize + serde::de::DeserializeOwned + 'static
{
}
impl<T> Loadable for T where
    T: Clone + Send + Sync + serde::Serialize + serde::de::DeserializeOwned + 'static
{
}

/// The empty state a list shows instead of its table.
fn empty_state(empty: &impl Fn() -> AnyView) -> AnyView {
    let text = empty();
    view! { <Empty>{text}</Empty> }.into_any()
}

/// A loading value: the loading state while `list` loads, its error (under `heading`, on a
/// page of its own), or what `show` makes of it.
fn loaded<L: Loadable>(
    list: Resource<Result<L, UiError>>,
    heading: Option<&'static str>,
    show: impl Fn(L) -> AnyView + Send + Sync + Clone + 'static,
) -> impl IntoView {
    view! {
        <Transition fallback=Loading>
            {move || {
                let show = show.clone();
                Suspend::new(async move {
                    match (list.await, heading) {
                        (Ok(l), _) => show(l),
                        (Err(e), Some(heading)) => {
                            view! {
                                <h1>{heading}</h1>
                                <Problem error=e.error />
                            }
                                .into_any()
                        }
                        (Err(e), None) => view! { <Problem error=e.error /> }.into_any(),
                    }
                })
            }}
        </Transition>
    }
}

/// What `resource` holds once loaded: the loading state while it loads (the previous value
/// while it reloads), the problem if it failed, else what `children` makes of the value.
#[component]
pub fn Loaded<T, V, F>(
    resource: Resource<Result<T, UiError>>,
    /// The page's heading, kept above the problem when the page is this one value.
    #[prop(optional)]
    heading: Option<&'static str>,
    children: F,
) -> impl IntoView
where
    T: Loadable,
    V: IntoView + 'static,
    F: Fn(T) -> V + Send + Sync + Clone + 'static,
{
    loaded(resource, heading, move |value| children(value).into_any())
}

/// [`Loaded`] for a whole list: its empty state (`empty`, inside [`Empty`]) when it holds
/// nothing.
#[component]
pub fn LoadedList<T, V, F>(
    list: Resource<Result<Vec<T>, UiError>>,
    #[prop(into)] empty: ViewFn,
    children: F,
) -> impl IntoView
where
    T: Loadable,
    V: IntoView + 'static,
    F: Fn(Vec<T>) -> V + Send + Sync + Clone + 'static,
{
    loaded(list, None, move |items: Vec<T>| {
        if items.is_empty() {
            empty_state(&|| empty.run())
        } else {
            children(items).into_any()
        }
    })
}

/// A team the caller may pick (report and statement selects, statement links).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TeamChoice {
    pub id: String,
    pub name: String,
    pub archived: bool,
}

/// The caller's teams (every team for a platform admin), as choices.
pub async fn load_teams() -> Result<Vec<TeamChoice>, UiError> {
    Ok(api::list_teams(PageRequest::new(0, PageRequest::MAX_LIMIT))
        .await?
        .items
        .into_iter()
        .map(|t| TeamChoice {
            id: t.id.to_string(),
            name: t.name,
            archived: t.archived,
        })
        .collect())
}

/// An error said where it happened (`role="alert"`, read out by screen readers).
pub fn alert(text: impl IntoView + 'static) -> AnyView {
    view! {
        <div class="form-error" role="alert">
            {text}
        </div>
    }
    .into_any()
}

/// A paged list as a table: loading state, empty state, errors, rows and the pager, whose
/// links `href(offset)` makes (keeping the page's filter). Every paged list shows its data
/// through this, so they all behave the same.
pub fn paged_table<T: Loadable, V: IntoView + 'static>(
    list: Resource<Result<Page<T>, UiError>>,
    href: impl Fn(u32) -> String + Send + Sync + Clone + 'static,
    columns: Columns,
    empty: impl Fn() -> AnyView + Send + Sync + Clone + 'static,
    row: impl Fn(T) -> V + Send + Sync + Clone + 'static,
) -> impl IntoView {
    loaded(list, None, move |page: Page<T>| {
        if page.total == 0 {
            return empty_state(&empty);
        }
        let pager = pager_with(&page, &href);
        let rows = page.items.into_iter().map(row.clone()).collect_view();
        view! {
            {list_table(&columns, rows)}
            {pager}
        }
        .into_any()
    })
}

/// The unpaged twin of [`paged_table`], for short lists loaded whole.
pub fn unpaged_table<T: Loadable, V: IntoView + 'static>(
    list: Resource<Result<Vec<T>, UiError>>,
    columns: Columns,
    empty: impl Fn() -> AnyView + Send + Sync + Clone + 'static,
    row: impl Fn(T) -> V + Send + Sync + Clone + 'static,
) -> impl IntoView {
    loaded(list, None, move |items: Vec<T>| {
        if items.is_empty() {
            return empty_state(&empty);
        }
        list_table(&columns, items.into_iter().map(row.clone()).collect_view()).into_any()
    })
}

/// A random-enough idempotency key: a v4 UUID on the server, time and `Math.random` in
/// the browser.
pub fn new_key() -> String {
    #[cfg(feature = "ssr")]
    {
        uuid::Uuid::new_v4().to_string()
    }
    #[cfg(all(feature = "hydrate", not(feature = "ssr")))]
    {
        use web_sys::js_sys::{Date, Math};
        let bits = |scale: f64| (Math::random() * scale) as u128;
        let v = ((Date::now() as u128) << 80) | (bits(2f64.powi(48)) << 32) | bits(2f64.powi(32));
        uuid::Uuid::from_u128(v).to_string()
    }
    #[cfg(not(any(feature = "ssr", feature = "hydrate")))]
    {
        crate::components::now()
            .timestamp_nanos_opt()
            .unwrap_or_default()
            .to_string()
    }
}

/// What sets a GPU request's cost: kind, count, hours, priority (as typed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EstimateInput {
    pub kind: String,
    pub count: String,
    pub hours: String,
    pub priority: String,
}

/// The cost of `input` at today's prices (`""`: unpriced, or nothing asked yet): the
/// allocation request form's estimate, and the job and notebook forms' for "a new GPU".
pub async fn load_estimate(input: Option<EstimateInput>) -> Result<String, UiError> {
    match input {
        Some(i) if !i.kind.is_empty() => {
            api::estimate_cost(i.kind, i.count, i.hours, i.priority).await
        }
        _ => Ok(String::new()),
    }
}

/// A GPU request's cost estimate ([`load_estimate`]), read out as it changes; hidden while
/// there is none. `terms` follows the cost (" at today's prices").
#[component]
pub fn CostEstimate(
    cost: Resource<Result<String, UiError>>,
    testid: &'static str,
    terms: &'static str,
) -> impl IntoView {
    let text = move || cost.get().and_then(Result::ok).filter(|s| !s.is_empty());
    view! {
        <p class="estimate" data-testid=testid aria-live="polite" hidden=move || text().is_none()>
            {move || {
                text()
                    .map(|cost| {
                        view! {
                            "Estimated cost: "
                            <strong>{cost}</strong>
                            {terms}
                        }
                    })
            }}
        </p>
    }
}

/// How many devices of `kind` are free now, for its option's label (a share: whether one
/// shared GPU has that much free).
pub fn free_text(free: &std::collections::BTreeMap<String, u32>, kind: &str) -> String {
    if let Ok(tessera_domain::alloc::GpuKind::Share { model, milli }) =
        kind.parse::<tessera_domain::alloc::GpuKind>()
    {
        return match free.get(&format!("{model}:share")).copied() {
            None => "no shared GPU now (an admin shares GPUs on the Nodes page)".to_owned(),
            Some(most) if most >= milli => "fits now".to_owned(),
            Some(most) => format!("waits: at most {most} milli-GPU free on one shared GPU"),
        };
    }
    match free.get(kind).copied().unwrap_or(0) {
        0 => "none free now (may re-partition)".to_owned(),
        n => format!("{n} free now"),
    }
}

/// `(value, label)` of every kind one may ask for on `model`: the whole GPU, then its MIG
/// profiles, each with its cost in units.
pub fn kind_options(catalog: &Catalog, model: &str) -> Vec<(String, String)> {
    let units = |n: u8| {
        if n == 1 {
            "1 unit".to_owned()
        } else {
            format!("{n} units")
        }
    };
    // The shared quota line (`H100-80GB:shared`): fractions of a shared GPU.
    if let (base, true) = tessera_domain::alloc::split_quota_key(model) {
        return SHARE_CHOICES
            .iter()
            .map(|milli| {
                let kind = format!("{base}:share:{milli}");
                let label = kind
                    .parse::<tessera_domain::alloc::GpuKind>()
                    .map(|k| k.label())
                    .unwrap_or_else(|_| kind.clone());
                (kind, format!("{label} ({milli} milli-GPU)"))
            })
            .collect();
    }
    let Some(m) = catalog.get(model) else {
        return vec![(format!("{model}:whole"), format!("whole {model}"))];
    };
    let mut out = vec![(
        format!("{model}:whole"),
        format!("whole {model} ({})", units(m.compute_slices())),
    )];
    out.extend(m.profiles().iter().map(|p| {
        (
            format!("{model}:{}", p.name),
            format!("{} on {model} ({})", p.name, units(p.compute_slices)),
        )
    }));
    out
}

/// The fractions the form offers on a shared quota line, in milli-GPU.
const SHARE_CHOICES: [u32; 5] = [100, 250, 500, 750, 1000];
