//! A terminal on a running workload's page: a shell inside its sandbox (any rank of a
//! multi-node job), line by line, over the exec WebSocket that `tessera exec` uses
//! (`GET /api/v1/workloads/{id}/exec`, frames of [`tessera_domain::wire::exec_frame`]).
//!
//! The shell is `/bin/sh` without a pseudo-terminal, so its output is plain text that a
//! `<pre>` shows as it is (no escape sequences to interpret); each line typed is echoed as
//! `$ line` and sent to its stdin. The server authorizes and audits the session like the
//! CLI's (owner, team admins, platform admins) and closes it after
//! `TESSERA_EXEC_IDLE_MINUTES` without traffic; a browser's session cookie is accepted
//! only from the portal's own pages.

use super::*;

/// Most terminal text kept on screen (older output is dropped from view).
const SHOWN_MAX: usize = 256 * 1024;

/// Where a terminal session stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Session {
    Closed,
    Connecting,
    Open,
    /// The shell exited with this code (the session's last frame).
    #[cfg_attr(not(feature = "hydrate"), allow(dead_code))]
    Exited(i32),
    /// The connection ended without an exit: the reason shown.
    Ended(String),
}

impl Session {
    fn live(&self) -> bool {
        matches!(self, Session::Connecting | Session::Open)
    }

    fn label(&self) -> String {
        match self {
            Session::Closed => "Not connected.".to_owned(),
            Session::Connecting => "Connecting…".to_owned(),
            Session::Open => "Connected: each line runs when you press Enter.".to_owned(),
            Session::Exited(code) => format!("The shell exited with code {code}."),
            Session::Ended(why) => why.clone(),
        }
    }
}

/// Appends `add` to the terminal text, dropping the oldest output past [`SHOWN_MAX`].
pub(super) fn append_shown(text: &mut String, add: &str) {
    push_keeping_tail(text, add, SHOWN_MAX, "[… earlier output is not shown …]\n");
}

/// The exec route's path (and query) for a shell in `rank` of workload `id`.
pub(super) fn shell_path(id: &str, rank: u32) -> String {
    format!("/api/v1/workloads/{id}/exec?command=%2Fbin%2Fsh&rank={rank}")
}

/// What an output frame adds to the screen, or the session's new state for an exit.
#[cfg_attr(not(feature = "hydrate"), allow(dead_code))]
pub(super) fn on_frame(frame: &[u8]) -> Option<Result<String, Session>> {
    use tessera_domain::wire::exec_frame::{Channel, decode, exit_code};
    let (channel, payload) = decode(frame)?;
    match channel {
        Channel::Stdout | Channel::Stderr => {
            Some(Ok(String::from_utf8_lossy(payload).into_owned()))
        }
        Channel::Exit => {
            let code = exit_code(payload).unwrap_or(-1);
            Some(Err(Session::Exited(code)))
        }
        Channel::Stdin | Channel::Resize => None,
    }
}

/// The terminal section: shown while the workload runs and the caller may read its log
/// (the same people may exec into it).
#[component]
pub(super) fn Terminal(
    id: String,
    /// A multi-node job's ranks: (rank, node).
    ranks: Memo<Vec<(u32, String)>>,
) -> impl IntoView {
    let text = RwSignal::new(String::new());
    let session = RwSignal::new(Session::Closed);
    let rank = RwSignal::new(0u32);
    let line = RwSignal::new(String::new());
    let out = NodeRef::<leptos::html::Pre>::new();
    let input = NodeRef::<leptos::html::Input>::new();
    let socket = socket::Handle::new();
    on_cleanup(move || socket.close());
    let connect = {
        let id = id.clone();
        move |_| {
            socket.close();
            text.set(String::new());
            session.set(Session::Connecting);
            socket.open(
                &shell_path(&id, rank.get_untracked()),
                text,
                session,
                out,
                input,
            );
        }
    };
    let send = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        if session.get_untracked() != Session::Open {
            return;
        }
        let typed = line.get_untracked();
        text.update(|t| append_shown(t, &format!("$ {typed}\n")));
        socket.send_line(&typed);
        line.set(String::new());
        scroll_to_bottom(out);
    };
    let rank_select = move || {
        let choices = ranks.get();
        (choices.len() > 1).then(|| {
            let options = choices
                .into_iter()
                .map(|(r, host)| {
                    view! { <option value=r.to_string()>{format!("Rank {r} · {host}")}</option> }
                })
                .collect_view();
            view! {
                <label for="terminal-rank">"In"</label>
                <select
                    id="terminal-rank"
                    data-testid="terminal-rank"
                    prop:value=move || rank.get().to_string()
                    prop:disabled=move || session.with(Session::live)
                    on:change=move |ev| rank.set(event_target_value(&ev).parse().unwrap_or(0))
                >
                    {options}
                </select>
            }
        })
    };
    view! {
        <details class="terminal" data-testid="terminal">
            <summary>"Terminal"</summary>
            <p class="hint">
                "A shell inside the workload's sandbox, as its user, like "
                <code>"tessera exec"</code>
                ". It closes when the shell exits, when you leave the page, or after a while without traffic."
            </p>
            <div class="buttons terminal-bar">
                {rank_select}
                <button
                    type="button"
                    data-testid="terminal-open"
                    prop:disabled=move || session.with(Session::live)
                    on:click=connect
                >
                    {move || {
                        if matches!(session.get(), Session::Closed) { "Open a shell" } else { "New shell" }
                    }}
                </button>
                <button
                    type="button"
                    data-testid="terminal-close"
                    prop:disabled=move || !session.with(Session::live)
                    on:click=move |_| {
                        socket.close();
                        session.set(Session::Ended("Closed.".to_owned()));
                    }
                >
                    "Close"
                </button>
            </div>
            <pre class="log terminal-out" data-testid="terminal-output" node_ref=out aria-live="polite">
                {move || text.get()}
            </pre>
            <form class="terminal-line" on:submit=send>
                <label for="terminal-input" class="visually-hidden">"Command"</label>
                <span aria-hidden="true">"$"</span>
                <input
                    id="terminal-input"
                    data-testid="terminal-input"
                    node_ref=input
                    autocomplete="off"
                    spellcheck="false"
                    placeholder="a command, e.g. nvidia-smi -L"
                    prop:value=move || line.get()
                    prop:disabled=move || session.get() != Session::Open
                    on:input=move |ev| line.set(event_target_value(&ev))
                />
                <button type="submit" prop:disabled=move || session.get() != Session::Open>
                    "Run"
                </button>
            </form>
            <p class="hint" data-testid="terminal-status" role="status">
                {move || session.with(Session::label)}
            </p>
        </details>
    }
}

/// The browser's side of the WebSocket (only in the hydrated page).
mod socket {
    use super::*;

    /// The page's one terminal socket.
    #[derive(Clone, Copy)]
    pub(in super::super) struct Handle {
        #[cfg(feature = "hydrate")]
        ws: StoredValue<Option<web_sys::WebSocket>, LocalStorage>,
    }

    #[cfg(feature = "hydrate")]
    impl Handle {
        pub(in super::super) fn new() -> Self {
            Handle {
                ws: StoredValue::new_local(None),
            }
        }

        pub(in super::super) fn close(self) {
            if let Some(Some(ws)) = self.ws.try_update_value(Option::take) {
                ws.set_onmessage(None);
                ws.set_onclose(None);
                ws.set_onerror(None);
                let _ = ws.close();
            }
        }

        pub(in super::super) fn send_line(self, line: &str) {
            use tessera_domain::wire::exec_frame::{Channel, encode};
            self.ws.with_value(|ws| {
                if let Some(ws) = ws {
                    let _ = ws.send_with_u8_array(&encode(
                        Channel::Stdin,
                        format!("{line}\n").as_bytes(),
                    ));
                }
            });
        }

        pub(in super::super) fn open(
            self,
            path: &str,
            text: RwSignal<String>,
            session: RwSignal<Session>,
            out: NodeRef<leptos::html::Pre>,
            input: NodeRef<leptos::html::Input>,
        ) {
            use wasm_bindgen::JsCast;
            use wasm_bindgen::closure::Closure;
            use web_sys::js_sys::{ArrayBuffer, Uint8Array};
            let Some(location) = web_sys::window().map(|w| w.location()) else {
                return;
            };
            let scheme = match location.protocol().as_deref() {
                Ok("https:") => "wss:",
                _ => "ws:",
            };
            let host = location.host().unwrap_or_default();
            let ws = match web_sys::WebSocket::new(&format!("{scheme}//{host}{path}")) {
                Ok(ws) => ws,
                Err(_) => {
                    session.set(Session::Ended(
                        "The browser could not open a connection.".to_owned(),
                    ));
                    return;
                }
            };
            ws.set_binary_type(web_sys::BinaryType::Arraybuffer);
            let on_open = Closure::<dyn Fn()>::new(move || {
                session.set(Session::Open);
                if let Some(el) = input.get_untracked() {
                    // After the `disabled` property is lifted.
                    request_animation_frame(move || {
                        let _ = el.focus();
                    });
                }
            });
            ws.set_onopen(Some(on_open.as_ref().unchecked_ref()));
            on_open.forget();
            let on_message =
                Closure::<dyn Fn(web_sys::MessageEvent)>::new(move |e: web_sys::MessageEvent| {
                    let Ok(buf) = e.data().dyn_into::<ArrayBuffer>() else {
                        return;
                    };
                    match on_frame(&Uint8Array::new(&buf).to_vec()) {
                        Some(Ok(add)) => {
                            let stick = at_bottom(out);
                            text.update(|t| append_shown(t, &add));
                            if stick {
                                scroll_to_bottom(out);
                            }
                        }
                        Some(Err(end)) => session.set(end),
                        None => {}
                    }
                });
            ws.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
            on_message.forget();
            let on_close =
                Closure::<dyn Fn(web_sys::CloseEvent)>::new(move |e: web_sys::CloseEvent| {
                    // An exit already said how it ended.
                    if session.get_untracked().live() {
                        let why = if e.reason().is_empty() {
                            "The session ended (the workload may have stopped, or you may not \
                             run commands in it)."
                                .to_owned()
                        } else {
                            format!("The session ended: {}", e.reason())
                        };
                        session.set(Session::Ended(why));
                    }
                });
            ws.set_onclose(Some(on_close.as_ref().unchecked_ref()));
            on_close.forget();
            self.ws.set_value(Some(ws));
        }
    }

    #[cfg(not(feature = "hydrate"))]
    impl Handle {
        pub(in super::super) fn new() -> Self {
            Handle {}
        }
        pub(in super::super) fn close(self) {}
        pub(in super::super) fn send_line(self, _line: &str) {}
        pub(in super::super) fn open(
            self,
            _path: &str,
            _text: RwSignal<String>,
            _session: RwSignal<Session>,
            _out: NodeRef<leptos::html::Pre>,
            _input: NodeRef<leptos::html::Input>,
        ) {
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_domain::wire::exec_frame::{Channel, encode, exit};

    #[test]
    fn output_frames_show_and_the_exit_ends_the_session() {
        assert_eq!(
            on_frame(&encode(Channel::Stdout, b"hi\n")),
            Some(Ok("hi\n".to_owned()))
        );
        assert_eq!(
            on_frame(&encode(Channel::Stderr, b"oops")),
            Some(Ok("oops".to_owned()))
        );
        assert_eq!(on_frame(&exit(3)), Some(Err(Session::Exited(3))));
        assert_eq!(
            on_frame(&encode(Channel::Exit, b"not json")),
            Some(Err(Session::Exited(-1)))
        );
        assert_eq!(on_frame(&encode(Channel::Stdin, b"x")), None);
        assert_eq!(on_frame(&[9, 1]), None);
        assert_eq!(on_frame(&[]), None);
    }

    #[test]
    fn the_shell_path_names_the_program_and_the_rank() {
        assert_eq!(
            shell_path("abc", 2),
            "/api/v1/workloads/abc/exec?command=%2Fbin%2Fsh&rank=2"
        );
    }

    #[test]
    fn the_screen_keeps_the_newest_output() {
        let mut t = String::new();
        let chunk = "é".repeat(40 * 1024);
        for _ in 0..5 {
            append_shown(&mut t, &chunk);
        }
        assert!(t.len() <= SHOWN_MAX, "{}", t.len());
        assert!(t.starts_with("[… earlier output is not shown …]\n"));
        assert!(t.ends_with('é'));
    }
}
