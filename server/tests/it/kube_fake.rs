//! A small, faithful fake of the Kubernetes API server for the Kubernetes executor's tests:
//! the REST paths, verbs, status codes and `Status` error bodies of the real one, for
//! namespaces and the namespaced kinds the executor uses. It keeps objects in memory,
//! answers label-selector lists across namespaces, refuses to create in a namespace that
//! does not exist (404) or an object that does (409), plays the Job controller (a Job gets
//! a pod from its template, labelled `job-name`, owned by the Job) and deletes a Job's
//! pods with it. Server-side apply (`PATCH` with `application/apply-patch+yaml`) creates or
//! replaces the object as its one field manager sent it, and needs a `fieldManager`. Tests
//! read what was sent and play the kubelet (pod status, logs); `refuse_writes` plays a
//! validating admission webhook that denies a kind and quotes what it was sent.

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct Store {
    /// Canonical path (`/api/v1/namespaces/ns/pods/name`) → object.
    objects: BTreeMap<String, Value>,
    /// Pod path → its container's log.
    logs: HashMap<String, String>,
    /// Every request: `METHOD path`.
    requests: Vec<String>,
    serial: u64,
    /// Kinds (plurals) whose writes an admission webhook denies.
    refused: std::collections::HashSet<String>,
}

#[derive(Clone)]
pub struct FakeKube {
    pub url: String,
    store: Arc<Mutex<Store>>,
}

/// Where a request points: the API group/version prefix, namespace, plural, name and
/// subresource.
struct Target {
    gv: String,
    namespace: Option<String>,
    plural: String,
    name: Option<String>,
    sub: Option<String>,
}

fn parse(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (gv, rest) = match *segs.first()? {
        "api" => (format!("/api/{}", segs.get(1)?), &segs[2..]),
        "apis" => (
            format!("/apis/{}/{}", segs.get(1)?, segs.get(2)?),
            &segs[3..],
        ),
        _ => return None,
    };
    let t = |namespace: Option<&str>, plural: &str, name: Option<&&str>, sub: Option<&&str>| {
        Some(Target {
            gv: gv.clone(),
            namespace: namespace.map(str::to_owned),
            plural: plural.to_owned(),
            name: name.map(|n| (*n).to_owned()),
            sub: sub.map(|s| (*s).to_owned()),
        })
    };
    match rest {
        ["namespaces", ns, plural, more @ ..] => t(Some(ns), plural, more.first(), more.get(1)),
        [plural, more @ ..] => t(None, plural, more.first(), more.get(1)),
        _ => None,
    }
}

fn key(gv: &str, namespace: Option<&str>, plural: &str, name: &str) -> String {
    match namespace {
        Some(ns) => format!("{gv}/namespaces/{ns}/{plural}/{name}"),
        None => format!("{gv}/{plural}/{name}"),
    }
}

fn status(code: StatusCode, reason: &str, message: String) -> Response {
    (
        code,
        axum::Json(json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": message, "reason": reason,
            "code": code.as_u16(),
        })),
    )
        .into_response()
}

fn selector_matches(selector: &str, labels: &Value) -> bool {
    selector
        .split(',')
        .filter(|s| !s.is_empty())
        .all(|term| match term.split_once('=') {
            Some((k, v)) => labels[k] == v,
            None => !labels[term].is_null(),
        })
}

fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| {
            v.replace("%3D", "=")
                .replace("%2C", ",")
                .replace("%2F", "/")
                .replace('+', " ")
        })
    })
}

impl Store {
    fn stamp(&mut self, obj: &mut Value, namespace: Option<&str>) {
        self.serial += 1;
        let m = &mut obj["metadata"];
        if let Some(ns) = namespace {
            m["namespace"] = json!(ns);
        }
        m["uid"] = json!(format!("uid-{}", self.serial));
        m["resourceVersion"] = json!(self.serial.to_string());
        m["creationTimestamp"] = json!(format!(
            "2026-01-01T00:{:02}:{:02}Z",
            (self.serial / 60) % 60,
            self.serial % 60
        ));
    }

    /// The Job controller's part: a pod from the template per completion (one for a
    /// NonIndexed Job; for an Indexed one, `completions` pods, each with its index as the
    /// `batch.kubernetes.io/job-completion-index` annotation and label, the hostname
    /// `<job>-<index>` and `JOB_COMPLETION_INDEX` in its containers' environment), owned
    /// by the Job.
    fn run_job(&mut self, job: &Value, ns: &str) {
        let job_name = job["metadata"]["name"].clone();
        let base = job_name.as_str().unwrap_or("job").to_owned();
        let indexed = job["spec"]["completionMode"] == "Indexed";
        let pods = if indexed {
            job["spec"]["completions"].as_u64().unwrap_or(1)
        } else {
            1
        };
        for index in 0..pods {
            let name = if indexed {
                format!("{base}-{index}-{:05}", self.serial)
            } else {
                format!("{base}-{:05}", self.serial)
            };
            let mut labels = job["spec"]["template"]["metadata"]["labels"].clone();
            labels["job-name"] = job_name.clone();
            labels["batch.kubernetes.io/job-name"] = job_name.clone();
            let mut annotations = job["spec"]["template"]["metadata"]["annotations"].clone();
            let mut spec = job["spec"]["template"]["spec"].clone();
            if indexed {
                let i = index.to_string();
                labels["batch.kubernetes.io/job-completion-index"] = json!(i);
                if !annotations.is_object() {
                    annotations = json!({});
                }
                annotations["batch.kubernetes.io/job-completion-index"] = json!(i);
                spec["hostname"] = json!(format!("{base}-{index}"));
                for c in spec["containers"].as_array_mut().into_iter().flatten() {
                    if !c["env"].is_array() {
                        c["env"] = json!([]);
                    }
                    if let Some(env) = c["env"].as_array_mut() {
                        env.push(json!({"name": "JOB_COMPLETION_INDEX", "value": i}));
                    }
                }
            }
            let mut pod = json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {
                    "name": name, "labels": labels, "annotations": annotations,
                    "ownerReferences": [{
                        "apiVersion": "batch/v1", "kind": "Job", "name": job_name,
                        "uid": job["metadata"]["uid"], "controller": true,
                    }],
                },
                "spec": spec,
                "status": {"phase": "Pending"},
            });
            self.stamp(&mut pod, Some(ns));
            self.objects
                .insert(key("/api/v1", Some(ns), "pods", &name), pod);
        }
    }
}

/// Every value of query parameter `name`, in order (`command` repeats).
fn query_params(query: &str, name: &str) -> Vec<String> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| *k == name)
        .map(|(_, v)| {
            let v = v.replace('+', " ");
            let mut out = Vec::new();
            let b = v.as_bytes();
            let mut i = 0;
            while i < b.len() {
                if b[i] == b'%'
                    && let Some(h) = v.get(i + 1..i + 3)
                    && let Ok(n) = u8::from_str_radix(h, 16)
                {
                    out.push(n);
                    i += 3;
                } else {
                    out.push(b[i]);
                    i += 1;
                }
            }
            String::from_utf8_lossy(&out).into_owned()
        })
        .collect()
}

/// The kubelet's part of `pods/{name}/exec`, as the API server relays it: a WebSocket
/// with the `v5.channel.k8s.io` subprotocol (the first byte of each binary message is
/// the channel: 0 stdin, 1 stdout, 2 stderr, 3 the final `Status`, 255 a stream closed).
/// The command runs on this host (the fake has no containers); only the `main`
/// container of a running pod takes it.
async fn exec(store: Arc<Mutex<Store>>, mut req: Request, t: Target) -> Response {
    use futures_util::{SinkExt, StreamExt};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_tungstenite::tungstenite::Message;
    let query = req.uri().query().unwrap_or("").to_owned();
    let path = key(
        &t.gv,
        t.namespace.as_deref(),
        "pods",
        t.name.as_deref().unwrap_or(""),
    );
    {
        let mut s = store.lock().expect("fake kube store");
        // The WebSocket upgrade the API server authorizes as `create` on `pods/exec`.
        s.requests.push(format!("CONNECT {path}/exec"));
        match s.objects.get(&path) {
            None => {
                return status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("pods {path} not found"),
                );
            }
            Some(p) if p["status"]["phase"] != "Running" => {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    "pod is not running".into(),
                );
            }
            Some(_) => {}
        }
    }
    if query_params(&query, "container") != ["main"] {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "no such container".into(),
        );
    }
    let argv = query_params(&query, "command");
    let offered = req
        .headers()
        .get("sec-websocket-protocol")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let Some(key) = req.headers().get("sec-websocket-key").cloned() else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "not a WebSocket".into(),
        );
    };
    if !offered.split(',').any(|p| p.trim() == "v5.channel.k8s.io") {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "no supported protocol".into(),
        );
    }
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(u) = upgrade.await else { return };
        let ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
            hyper_util::rt::TokioIo::new(u),
            tokio_tungstenite::tungstenite::protocol::Role::Server,
            None,
        )
        .await;
        let (mut tx, mut rx) = ws.split();
        let Some((program, args)) = argv.split_first() else {
            return;
        };
        let child = tokio::process::Command::new(program)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                let st = json!({"status": "Failure", "message": e.to_string()});
                let _ = tx
                    .send(Message::binary(
                        [&[3u8][..], st.to_string().as_bytes()].concat(),
                    ))
                    .await;
                return;
            }
        };
        let mut stdin = child.stdin.take();
        let (mut out, mut err) = (child.stdout.take(), child.stderr.take());
        let (mut ob, mut eb) = (vec![0u8; 8192], vec![0u8; 8192]);
        while out.is_some() || err.is_some() {
            tokio::select! {
                n = async { out.as_mut()?.read(&mut ob).await.ok() }, if out.is_some() => match n {
                    Some(n) if n > 0 => { let _ = tx.send(Message::binary([&[1u8][..], &ob[..n]].concat())).await; }
                    _ => out = None,
                },
                n = async { err.as_mut()?.read(&mut eb).await.ok() }, if err.is_some() => match n {
                    Some(n) if n > 0 => { let _ = tx.send(Message::binary([&[2u8][..], &eb[..n]].concat())).await; }
                    _ => err = None,
                },
                m = rx.next() => match m {
                    Some(Ok(Message::Binary(b))) => match b.first() {
                        Some(0) => {
                            if let Some(w) = stdin.as_mut() {
                                let _ = w.write_all(&b[1..]).await;
                            }
                        }
                        Some(255) if b.get(1) == Some(&0) => stdin = None,
                        _ => {}
                    },
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                    Some(Ok(_)) => {}
                },
            }
        }
        let code = child
            .wait()
            .await
            .ok()
            .and_then(|s| s.code())
            .unwrap_or(137);
        let st = if code == 0 {
            json!({"metadata": {}, "status": "Success"})
        } else {
            json!({"metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
                   "message": format!("command terminated with non-zero exit code: {code}"),
                   "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]}})
        };
        let _ = tx
            .send(Message::binary(
                [&[3u8][..], st.to_string().as_bytes()].concat(),
            ))
            .await;
        let _ = tx.send(Message::Close(None)).await;
        // The closing handshake, as the API server does it: the connection stays until
        // the client closes too (what it sends meanwhile, e.g. a closed stdin, is read).
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while let Some(Ok(m)) = rx.next().await {
                if m.is_close() {
                    break;
                }
            }
        })
        .await;
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-accept", accept)
        .header("sec-websocket-protocol", "v5.channel.k8s.io")
        .body(axum::body::Body::empty())
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

async fn handle(State(store): State<Arc<Mutex<Store>>>, req: Request) -> Response {
    if let Some(t) = parse(req.uri().path())
        && t.plural == "pods"
        && t.sub.as_deref() == Some("exec")
    {
        return exec(store, req, t).await;
    }
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let apply = req
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/apply-patch"));
    let body: Bytes = axum::body::to_bytes(req.into_body(), 16 << 20)
        .await
        .unwrap_or_default();
    let mut s = store.lock().expect("fake kube store");
    s.requests.push(format!("{method} {path}"));
    let Some(t) = parse(&path) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("no route {path}"),
        );
    };
    // Namespaced objects need their namespace.
    if let Some(ns) = &t.namespace
        && !s
            .objects
            .contains_key(&key("/api/v1", None, "namespaces", ns))
        && method != Method::GET
    {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("namespaces \"{ns}\" not found"),
        );
    }
    if method != Method::GET && s.refused.contains(&t.plural) {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!(
                "admission webhook \"deny.example\" denied the request: {}",
                String::from_utf8_lossy(&body)
            ),
        );
    }
    match (&method, &t.name, &t.sub) {
        // Server-side apply: the object as its field manager sent it, created if missing.
        (&Method::PATCH, Some(name), None) if apply => {
            if query_param(&query, "fieldManager").is_none() {
                return status(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    "fieldManager is required for apply requests".into(),
                );
            }
            let Ok(mut obj) = serde_json::from_slice::<Value>(&body) else {
                return status(StatusCode::BAD_REQUEST, "BadRequest", "not JSON".into());
            };
            if obj["metadata"]["name"] != name.as_str() {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    "the name of the object does not match the name on the URL".into(),
                );
            }
            let k = key(&t.gv, t.namespace.as_deref(), &t.plural, name);
            let old = s.objects.get(&k).cloned();
            if old.is_none() {
                // An apply that creates is authorized as `create` too: say so, as a
                // create of the collection, for the RBAC check.
                let collection = path.trim_end_matches('/').trim_end_matches(name.as_str());
                let line = format!("POST {}", collection.trim_end_matches('/'));
                s.requests.push(line);
            }
            s.stamp(&mut obj, t.namespace.as_deref());
            let code = match old {
                Some(old) => {
                    obj["metadata"]["uid"] = old["metadata"]["uid"].clone();
                    obj["metadata"]["creationTimestamp"] =
                        old["metadata"]["creationTimestamp"].clone();
                    StatusCode::OK
                }
                None => StatusCode::CREATED,
            };
            s.objects.insert(k, obj.clone());
            (code, axum::Json(obj)).into_response()
        }
        (&Method::POST, None, None) => {
            let Ok(mut obj) = serde_json::from_slice::<Value>(&body) else {
                return status(StatusCode::BAD_REQUEST, "BadRequest", "not JSON".into());
            };
            let Some(name) = obj["metadata"]["name"].as_str().map(str::to_owned) else {
                return status(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    "metadata.name: Required value".into(),
                );
            };
            let k = key(&t.gv, t.namespace.as_deref(), &t.plural, &name);
            if s.objects.contains_key(&k) {
                return status(
                    StatusCode::CONFLICT,
                    "AlreadyExists",
                    format!("{} \"{name}\" already exists", t.plural),
                );
            }
            s.stamp(&mut obj, t.namespace.as_deref());
            if t.plural == "jobs"
                && let Some(ns) = &t.namespace
            {
                obj["status"] = json!({"active": 1});
                s.run_job(&obj, ns);
            }
            s.objects.insert(k, obj.clone());
            (StatusCode::CREATED, axum::Json(obj)).into_response()
        }
        (&Method::GET, None, None) => {
            let selector = query_param(&query, "labelSelector").unwrap_or_default();
            let items: Vec<Value> = s
                .objects
                .iter()
                .filter(|(k, _)| {
                    let Some(o) = parse(k) else { return false };
                    o.gv == t.gv
                        && o.plural == t.plural
                        && (t.namespace.is_none() || o.namespace == t.namespace)
                })
                .map(|(_, v)| v)
                .filter(|v| selector_matches(&selector, &v["metadata"]["labels"]))
                .cloned()
                .collect();
            let rv = s.serial.to_string();
            axum::Json(json!({
                "apiVersion": t.gv.trim_start_matches("/api/").trim_start_matches("/apis/"),
                "kind": "List",
                "metadata": {"resourceVersion": rv},
                "items": items,
            }))
            .into_response()
        }
        (&Method::GET, Some(name), None) => {
            match s
                .objects
                .get(&key(&t.gv, t.namespace.as_deref(), &t.plural, name))
            {
                Some(o) => axum::Json(o.clone()).into_response(),
                None => status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("{} \"{name}\" not found", t.plural),
                ),
            }
        }
        (&Method::PUT, Some(name), None) => {
            let k = key(&t.gv, t.namespace.as_deref(), &t.plural, name);
            let Some(old) = s.objects.get(&k).cloned() else {
                return status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("\"{name}\" not found"),
                );
            };
            let Ok(mut obj) = serde_json::from_slice::<Value>(&body) else {
                return status(StatusCode::BAD_REQUEST, "BadRequest", "not JSON".into());
            };
            if obj["metadata"]["resourceVersion"] != old["metadata"]["resourceVersion"] {
                return status(
                    StatusCode::CONFLICT,
                    "Conflict",
                    "the object has been modified".into(),
                );
            }
            s.stamp(&mut obj, t.namespace.as_deref());
            obj["metadata"]["uid"] = old["metadata"]["uid"].clone();
            s.objects.insert(k, obj.clone());
            axum::Json(obj).into_response()
        }
        // A JSON merge patch (RFC 7386), what `kubectl annotate` and kube-rs's
        // `Patch::Merge` send.
        (&Method::PATCH, Some(name), None) => {
            let k = key(&t.gv, t.namespace.as_deref(), &t.plural, name);
            let Some(mut obj) = s.objects.get(&k).cloned() else {
                return status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("{} \"{name}\" not found", t.plural),
                );
            };
            let Ok(patch) = serde_json::from_slice::<Value>(&body) else {
                return status(StatusCode::BAD_REQUEST, "BadRequest", "not JSON".into());
            };
            merge_patch(&mut obj, &patch);
            // Same object: its uid and creation time stay; only its version moves.
            s.serial += 1;
            obj["metadata"]["resourceVersion"] = json!(s.serial.to_string());
            s.objects.insert(k, obj.clone());
            axum::Json(obj).into_response()
        }
        (&Method::DELETE, Some(name), None) => {
            let k = key(&t.gv, t.namespace.as_deref(), &t.plural, name);
            let Some(old) = s.objects.remove(&k) else {
                return status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("{} \"{name}\" not found", t.plural),
                );
            };
            {
                // Background propagation: the garbage collector removes what it owned
                // (a Job's pods, a gang's Service and NetworkPolicy).
                let uid = old["metadata"]["uid"].clone();
                s.objects.retain(|_, o| {
                    !o["metadata"]["ownerReferences"]
                        .as_array()
                        .is_some_and(|rs| rs.iter().any(|r| r["uid"] == uid))
                });
            }
            axum::Json(old).into_response()
        }
        (&Method::GET, Some(name), Some(sub)) if sub == "log" && t.plural == "pods" => {
            let k = key(&t.gv, t.namespace.as_deref(), &t.plural, name);
            let Some(pod) = s.objects.get(&k) else {
                return status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("pods \"{name}\" not found"),
                );
            };
            if pod["status"]["phase"] == "Pending" {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    format!("container \"main\" in pod \"{name}\" is waiting to start"),
                );
            }
            let mut log = s.logs.get(&k).cloned().unwrap_or_default();
            if let Some(limit) = query_param(&query, "limitBytes").and_then(|l| l.parse().ok()) {
                log.truncate(limit);
            }
            log.into_response()
        }
        _ => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("{method} {path}"),
        ),
    }
}

impl FakeKube {
    pub async fn start() -> FakeKube {
        let store: Arc<Mutex<Store>> = Arc::default();
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(store.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeKube {
            url: format!("http://{addr}"),
            store,
        }
    }

    /// A kubeconfig file (in `dir`) that points at this server.
    pub fn kubeconfig(&self, dir: &std::path::Path) -> std::path::PathBuf {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\n\
             clusters:\n- name: fake\n  cluster:\n    server: {}\n\
             users:\n- name: fake\n  user: {{}}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n",
            self.url
        );
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().expect("fake kube store")
    }

    /// Objects of a kind (`pods`, `jobs`, `namespaces`, …) whose labels match `selector`.
    pub fn list(&self, plural: &str, selector: &str) -> Vec<Value> {
        self.lock()
            .objects
            .iter()
            .filter(|(k, _)| parse(k).is_some_and(|t| t.plural == plural))
            .map(|(_, v)| v)
            .filter(|v| selector_matches(selector, &v["metadata"]["labels"]))
            .cloned()
            .collect()
    }

    pub fn get(&self, path: &str) -> Option<Value> {
        self.lock().objects.get(path).cloned()
    }

    /// From now on, every write of kind `plural` is denied (422) with a message that
    /// quotes the request's body, as a validating admission webhook may.
    pub fn refuse_writes(&self, plural: &str) {
        self.lock().refused.insert(plural.to_owned());
    }

    pub fn requests(&self) -> Vec<String> {
        self.lock().requests.clone()
    }

    fn pod_key(pod: &Value) -> String {
        key(
            "/api/v1",
            pod["metadata"]["namespace"].as_str(),
            "pods",
            pod["metadata"]["name"].as_str().unwrap_or(""),
        )
    }

    /// The kubelet's part: sets a pod's status.
    pub fn set_pod_status(&self, pod: &Value, status: Value) {
        let k = Self::pod_key(pod);
        if let Some(p) = self.lock().objects.get_mut(&k) {
            p["status"] = status;
        }
    }

    /// The container runtime's part: what the pod's container printed so far.
    pub fn set_log(&self, pod: &Value, text: &str) {
        let k = Self::pod_key(pod);
        self.lock().logs.insert(k, text.to_owned());
    }
}

/// RFC 7386: objects merge key by key, `null` removes, anything else replaces.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}
