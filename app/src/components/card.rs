//! The frames pages put their sections in: a page's [`Card`] and a dashboard [`Panel`].

use crate::api::UiError;
use leptos::prelude::*;

/// A page card: a `<section class="card">` named by its `<h2>` (id `{id}-title`), the
/// `hint` under the heading when there is one, then `children`.
#[component]
pub fn Card(
    /// What the heading's id starts with.
    id: &'static str,
    title: &'static str,
    /// Spans the page's width.
    #[prop(optional)]
    wide: bool,
    #[prop(optional)] hint: Option<&'static str>,
    #[prop(optional)] testid: Option<&'static str>,
    children: Children,
) -> impl IntoView {
    let heading = format!("{id}-title");
    let named_by = heading.clone();
    view! {
        <section
            class=if wide { "card wide" } else { "card" }
            aria-labelledby=named_by
            data-testid=testid
        >
            <h2 id=heading>{title}</h2>
            {hint.map(|h| view! { <p class="hint">{h}</p> })}
            {children()}
        </section>
    }
}

/// A dashboard panel: a `<section class="panel">` named `title`, `children`, then the links
/// to the pages where its work is done (`(href, text)`).
#[component]
pub fn Panel(
    title: &'static str,
    testid: &'static str,
    /// Classes besides `panel` (`wide`, …).
    #[prop(optional)]
    class: &'static str,
    links: &'static [(&'static str, &'static str)],
    children: Children,
) -> impl IntoView {
    let class = if class.is_empty() {
        "panel".to_owned()
    } else {
        format!("panel {class}")
    };
    let links = links
        .iter()
        .enumerate()
        .map(|(i, (href, text))| view! { {(i > 0).then_some(" ")} <a href=*href>{*text}</a> })
        .collect_view();
    view! {
        <section class=class aria-label=title data-testid=testid>
            <h2>{title}</h2>
            {children()}
            {links}
        </section>
    }
}

/// A card whose form makes a secret (an API or join token): the heading, what `shown`
/// makes of the secret once `made` (the form's last answer) holds one, then the form
/// (`children`).
#[component]
pub fn SecretCard<T, M, S, V>(
    /// What the heading's id starts with.
    id: &'static str,
    title: &'static str,
    made: M,
    shown: S,
    children: Children,
) -> impl IntoView
where
    T: Send + Sync + 'static,
    M: Fn() -> Option<Result<T, UiError>> + Send + Sync + 'static,
    S: Fn(T) -> V + Send + Sync + 'static,
    V: IntoView + 'static,
{
    view! {
        <Card id title>
            {move || made().and_then(Result::ok).map(&shown)}
            {children()}
        </Card>
    }
}
