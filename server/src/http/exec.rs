//! `tessera exec`: a command or shell inside a running workload, streamed the way
//! `kubectl exec` goes through the API server.
//!
//! The user opens `GET /api/v1/workloads/{id}/exec?command=…` as a WebSocket; core
//! authorizes and audits it ([`tessera_core::services::workloads::ExecTarget`]). The
//! session then waits here, in this replica's memory, for the node's agent: the node's
//! signal is bumped so its long poll answers at once, the agent's next workload sync
//! lists the session (`WorkloadSync::execs`), and the agent opens
//! `GET /agent/v1/exec/{session}` as a WebSocket of its own (node credential plus the
//! session's one-time secret). The two sockets are then spliced, frame for frame
//! (`tessera_domain::wire::exec_frame`). A session the agent does not take within
//! [`TAKE_WITHIN`] fails with a message; one with no traffic either way for
//! `TESSERA_EXEC_IDLE_MINUTES` is closed.
//!
//! Sessions live in one replica's memory: the agent's WebSocket must reach the replica
//! that holds the user's (docs/workloads.md, "exec").

use super::auth::{Caller, NodeCaller};
use super::error::{ApiError, Conflict, Forbidden, Invalid, NotFound, Path, Unauthorized};
use crate::AppState;
use crate::config::ServeConfig;
use crate::k8s::{self, KubeExecutor};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, StreamExt};
use http::{HeaderMap, StatusCode, header};
use hyper_util::rt::TokioIo;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};
use tessera_core::auth::secret;
use tessera_core::services::workloads::ExecTarget;
use tessera_domain::error::AppError;
use tessera_domain::ids::NodeId;
use tessera_domain::wire::{ExecRequest, exec_frame};
use tokio::sync::oneshot;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};
use uuid::Uuid;

/// How long a session waits for the node's agent to take it.
pub const TAKE_WITHIN: Duration = Duration::from_secs(15);

/// The header the agent sends the session's one-time secret in.
pub const SECRET_HEADER: &str = "x-tessera-exec-secret";

type Socket = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// A session waiting for its agent.
struct Pending {
    node: NodeId,
    req: ExecRequest,
    since: Instant,
    deliver: oneshot::Sender<Socket>,
}

/// This replica's sessions not yet taken, by session id.
static PENDING: LazyLock<Mutex<HashMap<Uuid, Pending>>> = LazyLock::new(Default::default);

fn pending() -> std::sync::MutexGuard<'static, HashMap<Uuid, Pending>> {
    PENDING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The sessions waiting for `node`'s agent (for its workload sync); forgets stale ones.
pub fn pending_for(node: NodeId) -> Vec<ExecRequest> {
    let mut map = pending();
    map.retain(|_, p| p.since.elapsed() < TAKE_WITHIN && !p.deliver.is_closed());
    map.values()
        .filter(|p| p.node == node)
        .map(|p| p.req.clone())
        .collect()
}

/// The query of the exec route (documentation only: `command` repeats, which the
/// query extractor cannot read, so [`parse_query`] reads it).
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(super) struct ExecQuery {
    /// The program and its arguments, one `command=` each, in order.
    command: Vec<String>,
    /// Run it on a pseudo-terminal (`true` for an interactive shell).
    tty: Option<bool>,
    /// The rank of a multi-node job to run it in (0, the default, is the job itself).
    rank: Option<u32>,
}

#[derive(Debug, PartialEq, Eq)]
struct ExecAsk {
    argv: Vec<String>,
    tty: bool,
    rank: u32,
}

fn parse_query(query: Option<&str>) -> Result<ExecAsk, AppError> {
    let url = reqwest::Url::parse(&format!("http://x/?{}", query.unwrap_or("")))
        .map_err(|_| AppError::invalid("query", "the query does not parse"))?;
    let mut ask = ExecAsk {
        argv: Vec::new(),
        tty: false,
        rank: 0,
    };
    for (k, v) in url.query_pairs() {
        match k.as_ref() {
            "command" => ask.argv.push(v.into_owned()),
            "tty" => {
                ask.tty = v
                    .parse()
                    .map_err(|_| AppError::invalid("tty", "give true or false"))?;
            }
            "rank" => {
                ask.rank = v
                    .parse()
                    .map_err(|_| AppError::invalid("rank", "give a rank number (0, 1, …)"))?;
            }
            other => {
                return Err(AppError::invalid(
                    "query",
                    format!("unknown parameter `{other}`"),
                ));
            }
        }
    }
    Ok(ask)
}

/// Whether the request asks for a WebSocket; its key, when it does.
fn websocket_key(h: &HeaderMap) -> Option<&[u8]> {
    let upgrade = h.get(header::UPGRADE)?.to_str().ok()?;
    if !upgrade.eq_ignore_ascii_case("websocket") {
        return None;
    }
    Some(h.get(header::SEC_WEBSOCKET_KEY)?.as_bytes())
}

fn not_websocket() -> Response {
    (
        StatusCode::BAD_REQUEST,
        "open this route as a WebSocket (Upgrade: websocket)",
    )
        .into_response()
}

/// The 101 answer to a WebSocket handshake with `key`.
fn switching(key: &[u8]) -> Response {
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key);
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "upgrade")
        .header(header::UPGRADE, "websocket")
        .header(header::SEC_WEBSOCKET_ACCEPT, accept)
        .body(Body::empty())
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// Runs a command in a running workload: a WebSocket carrying `exec_frame`s (binary
/// messages: a channel byte, then the payload).
#[utoipa::path(get, path = "/api/v1/workloads/{id}/exec", tag = "workloads",
    params(("id" = Uuid, Path, description = "The workload"), ExecQuery),
    description = "Runs a command (or, with `tty=true`, an interactive shell) inside a running \
                   workload's sandbox on its node, as the workload's user with its environment; \
                   owner, team admins and platform admins; audited (`workload.exec`, the command \
                   only). Open it as a WebSocket. Binary messages carry one channel byte and the \
                   payload: 0 stdin (to the process; empty closes it), 1 stdout, 2 stderr, 3 a \
                   terminal resize as JSON `{\"cols\":…,\"rows\":…}` (to it), 4 the exit as JSON \
                   `{\"code\":…}` (last). A session the node's agent does not take within 15 s, or \
                   with no traffic for `TESSERA_EXEC_IDLE_MINUTES`, is closed with a message.",
    responses((status = 101, description = "Switching to the WebSocket"),
        (status = 400, description = "Not a WebSocket handshake"),
        Invalid, Unauthorized, Forbidden, NotFound, Conflict))]
pub(super) async fn exec_workload(
    State(s): State<AppState>,
    Caller(p): Caller,
    Path(id): Path<Uuid>,
    mut req: Request,
) -> Result<Response, ApiError> {
    // A browser session's cookie rides along on any site's WebSocket: only the
    // portal's own pages may use it. An API token is never sent by a browser on its own.
    if !req.headers().contains_key(header::AUTHORIZATION)
        && super::csrf::same_origin(req.headers(), &s.config.public_url()).is_err()
    {
        return Ok((
            StatusCode::FORBIDDEN,
            "exec accepts browser connections from the portal's own pages only",
        )
            .into_response());
    }
    let ask = parse_query(req.uri().query())?;
    let target = s
        .services
        .workloads
        .exec_target(&p, id.into(), ask.rank, &ask.argv, ask.tty)
        .await?;
    let Some(key) = websocket_key(req.headers()) else {
        return Ok(not_websocket());
    };
    if let Some(kube) = s.kube.clone() {
        let answer = switching(key);
        return pod_exec(&kube, req, answer, &target, ask, &s.config).await;
    }
    let answer = switching(key);
    let session = Uuid::new_v4();
    let (deliver, taken) = oneshot::channel();
    pending().insert(
        session,
        Pending {
            node: target.node_id,
            req: ExecRequest {
                session: session.to_string(),
                secret: secret::random_hex(32),
                workload_id: target.workload_id.to_string(),
                argv: ask.argv,
                tty: ask.tty,
            },
            since: Instant::now(),
            deliver,
        },
    );
    s.services.signals.bump(target.node_id);
    let idle = Duration::from_secs(s.config.exec_idle_minutes.saturating_mul(60));
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let user = match upgrade.await {
            Ok(u) => WebSocketStream::from_raw_socket(TokioIo::new(u), Role::Server, None).await,
            Err(e) => {
                tracing::debug!(error = %e, "exec: the client's upgrade failed");
                pending().remove(&session);
                return;
            }
        };
        run_session(session, user, taken, idle).await;
    });
    Ok(answer)
}

/// `tessera exec` with the Kubernetes executor: the command runs in the workload's pod
/// through the API server (`k8s::exec`), and this replica turns Kubernetes' channels into
/// Tessera's exec frames.
async fn pod_exec(
    kube: &Arc<KubeExecutor>,
    mut req: Request,
    answer: Response,
    target: &ExecTarget,
    ask: ExecAsk,
    config: &ServeConfig,
) -> Result<Response, ApiError> {
    let pod = k8s::exec::find_pod(
        kube,
        &target.team_id.to_string(),
        &target.job.to_string(),
        target.rank,
    )
    .await
    .map_err(|e| {
        tracing::warn!(error = %format!("{e:#}"), "exec: finding the pod");
        AppError::conflict("the cluster's API server could not be asked for the workload's pod")
    })?;
    let Some((ns, name)) = pod else {
        return Err(AppError::conflict("the workload has no running pod (yet)").into());
    };
    let process = kube
        .exec(&ns, &name, &ask.argv, ask.tty)
        .await
        .map_err(|e| AppError::conflict(format!("the pod did not start the command: {e:#}")))?;
    let idle = Duration::from_secs(config.exec_idle_minutes.saturating_mul(60));
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match upgrade.await {
            Ok(u) => {
                let user =
                    WebSocketStream::from_raw_socket(TokioIo::new(u), Role::Server, None).await;
                pod_session(user, process, idle).await;
            }
            Err(e) => {
                tracing::debug!(error = %e, "exec: the client's upgrade failed");
                process.abort();
            }
        }
    });
    Ok(answer)
}

/// Copies the user's stdin and terminal sizes to the pod's process and its output back,
/// then sends its exit code; the process is ended when the user goes or nothing moves for
/// `idle`.
async fn pod_session(user: Socket, mut process: kube::api::AttachedProcess, idle: Duration) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut user_tx, mut user_rx) = user.split();
    let mut stdin = process.stdin();
    let mut stdout = process.stdout();
    let mut stderr = process.stderr();
    let mut resize = process.terminal_size();
    let status = process.take_status();
    // The final `Status` (`None`: the connection ended without one). The output pipes
    // end only when the connection ends cleanly: once the status is in, what is left of
    // the output is read for at most 2 s.
    let mut status = Box::pin(async move {
        match status {
            Some(s) => s.await,
            None => None,
        }
    });
    let mut ended = None;
    let mut drain = tokio::time::Instant::now();
    let (mut out_buf, mut err_buf) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    let mut deadline = tokio::time::Instant::now() + idle;
    let frame = |c: exec_frame::Channel, b: &[u8]| Message::Binary(exec_frame::encode(c, b).into());
    let mut gone = false;
    while stdout.is_some() || stderr.is_some() || ended.is_none() {
        tokio::select! {
            n = async { stdout.as_mut()?.read(&mut out_buf).await.ok() }, if stdout.is_some() => {
                match n {
                    Some(n) if n > 0 => {
                        deadline = tokio::time::Instant::now() + idle;
                        if user_tx.send(frame(exec_frame::Channel::Stdout, &out_buf[..n])).await.is_err() {
                            gone = true;
                            break;
                        }
                    }
                    _ => stdout = None,
                }
            }
            n = async { stderr.as_mut()?.read(&mut err_buf).await.ok() }, if stderr.is_some() => {
                match n {
                    Some(n) if n > 0 => {
                        deadline = tokio::time::Instant::now() + idle;
                        if user_tx.send(frame(exec_frame::Channel::Stderr, &err_buf[..n])).await.is_err() {
                            gone = true;
                            break;
                        }
                    }
                    _ => stderr = None,
                }
            }
            st = &mut status, if ended.is_none() => {
                ended = Some(st);
                drain = tokio::time::Instant::now() + Duration::from_secs(2);
            }
            () = tokio::time::sleep_until(drain), if ended.is_some() => break,
            m = user_rx.next() => match m {
                Some(Ok(Message::Binary(b))) => {
                    deadline = tokio::time::Instant::now() + idle;
                    match exec_frame::decode(&b) {
                        Some((exec_frame::Channel::Stdin, [])) => {
                            // The pipe's halves share it: only a shutdown tells the other
                            // end it ended (then the API server is told the stream closed).
                            if let Some(mut w) = stdin.take() {
                                let _ = w.shutdown().await;
                            }
                        }
                        Some((exec_frame::Channel::Stdin, data)) => {
                            if let Some(w) = stdin.as_mut()
                                && w.write_all(data).await.is_err()
                            {
                                stdin = None;
                            }
                        }
                        Some((exec_frame::Channel::Resize, data)) => {
                            let size: Option<serde_json::Value> = serde_json::from_slice(data).ok();
                            let dim = |k: &str| {
                                size.as_ref()
                                    .and_then(|v| v[k].as_u64())
                                    .and_then(|n| u16::try_from(n).ok())
                            };
                            if let (Some(r), Some(width), Some(height)) =
                                (resize.as_mut(), dim("cols"), dim("rows"))
                            {
                                let _ = r
                                    .try_send(kube::api::TerminalSize { width, height });
                            }
                        }
                        _ => {}
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => {
                    gone = true;
                    break;
                }
                Some(Ok(_)) => {}
            },
            () = tokio::time::sleep_until(deadline) => {
                let msg = format!(
                    "tessera: exec closed after {} minutes without traffic\n",
                    idle.as_secs() / 60
                );
                let _ = user_tx.send(frame(exec_frame::Channel::Stderr, msg.as_bytes())).await;
                gone = true;
                break;
            }
        }
    }
    if gone {
        process.abort();
    } else {
        let code = k8s::exec::exit_code(ended.flatten().as_ref());
        let _ = user_tx
            .send(frame(
                exec_frame::Channel::Exit,
                serde_json::json!({ "code": code }).to_string().as_bytes(),
            ))
            .await;
    }
    let _ = user_tx.send(Message::Close(None)).await;
    closing_handshake(&mut user_rx).await;
}

/// Waits for the agent's socket, then splices the two.
async fn run_session(
    session: Uuid,
    mut user: Socket,
    taken: oneshot::Receiver<Socket>,
    idle: Duration,
) {
    let agent = match tokio::time::timeout(TAKE_WITHIN, taken).await {
        Ok(Ok(agent)) => agent,
        _ => {
            pending().remove(&session);
            let msg = format!(
                "the node's agent did not take the exec session within {} s (is the node \
                 online, and does its agent reach this server replica?)",
                TAKE_WITHIN.as_secs()
            );
            fail(&mut user, &msg).await;
            return;
        }
    };
    splice(user, agent, idle).await;
}

/// Tells the user why (stderr frame) and closes.
async fn fail(user: &mut Socket, msg: &str) {
    let _ = user
        .send(Message::Binary(
            exec_frame::encode(
                exec_frame::Channel::Stderr,
                format!("tessera: {msg}\n").as_bytes(),
            )
            .into(),
        ))
        .await;
    let reason: String = msg.chars().take(100).collect();
    let _ = user
        .send(Message::Close(Some(CloseFrame {
            code: CloseCode::Error,
            reason: reason.into(),
        })))
        .await;
}

/// Copies data frames both ways until one side closes or nothing moves for `idle`.
async fn splice(user: Socket, agent: Socket, idle: Duration) {
    let (mut user_tx, mut user_rx) = user.split();
    let (mut agent_tx, mut agent_rx) = agent.split();
    let mut deadline = tokio::time::Instant::now() + idle;
    loop {
        tokio::select! {
            m = user_rx.next() => match m {
                Some(Ok(Message::Binary(b))) => {
                    deadline = tokio::time::Instant::now() + idle;
                    if agent_tx.send(Message::Binary(b)).await.is_err() {
                        break;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
            m = agent_rx.next() => match m {
                Some(Ok(Message::Binary(b))) => {
                    deadline = tokio::time::Instant::now() + idle;
                    if user_tx.send(Message::Binary(b)).await.is_err() {
                        break;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
            () = tokio::time::sleep_until(deadline) => {
                let msg = format!(
                    "tessera: exec closed after {} minutes without traffic\n",
                    idle.as_secs() / 60
                );
                let _ = user_tx
                    .send(Message::Binary(
                        exec_frame::encode(exec_frame::Channel::Stderr, msg.as_bytes()).into(),
                    ))
                    .await;
                break;
            }
        }
    }
    let _ = user_tx.send(Message::Close(None)).await;
    let _ = agent_tx.send(Message::Close(None)).await;
    closing_handshake(&mut user_rx).await;
}

/// Reads what the user still sends (a closed stdin, its Close) for up to 2 s after the
/// server's Close: a connection closed with input unread is reset, and a reset can reach
/// the client before the exit frame it has not read yet.
async fn closing_handshake(user_rx: &mut futures_util::stream::SplitStream<Socket>) {
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while let Some(Ok(m)) = user_rx.next().await {
            if m.is_close() {
                break;
            }
        }
    })
    .await;
}

/// The agent takes a session: `GET /agent/v1/exec/{session}` as a WebSocket, with the
/// node credential and the session's secret. Only the node the workload runs on may
/// take it, once; anything else is 404.
pub(super) async fn agent_exec(
    NodeCaller(node): NodeCaller,
    Path(session): Path<Uuid>,
    mut req: Request,
) -> Result<Response, ApiError> {
    let Some(key) = websocket_key(req.headers()) else {
        return Ok(not_websocket());
    };
    let secret = req
        .headers()
        .get(SECRET_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let deliver = {
        let mut map = pending();
        let ok = map.get(&session).is_some_and(|p| {
            p.node == node.id()
                // Digests compared: the time taken says nothing of the secret.
                && secret::hash(&p.req.secret) == secret::hash(&secret)
        });
        if !ok {
            return Err(AppError::NotFound.into());
        }
        map.remove(&session).map(|p| p.deliver)
    }
    .ok_or(AppError::NotFound)?;
    let answer = switching(key);
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match upgrade.await {
            Ok(u) => {
                let ws =
                    WebSocketStream::from_raw_socket(TokioIo::new(u), Role::Server, None).await;
                // The user gave up meanwhile: the agent's socket just closes.
                let _ = deliver.send(ws);
            }
            Err(e) => tracing::debug!(error = %e, "exec: the agent's upgrade failed"),
        }
    });
    Ok(answer)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_query_keeps_the_command_in_order() {
        let a = parse_query(Some(
            "command=sh&command=-c&command=echo%20a%26b&tty=true&rank=2",
        ))
        .unwrap();
        assert_eq!(a.argv, ["sh", "-c", "echo a&b"]);
        assert!(a.tty);
        assert_eq!(a.rank, 2);
        assert_eq!(parse_query(None).unwrap().argv, Vec::<String>::new());
        assert_eq!(
            parse_query(Some("tty=maybe")).unwrap_err(),
            AppError::invalid("tty", "give true or false")
        );
        assert!(matches!(
            parse_query(Some("rank=-1")).unwrap_err(),
            AppError::Invalid { field, .. } if field == "rank"
        ));
        assert!(parse_query(Some("cmd=ls")).is_err());
    }
}
