//! Gang members (issue 42) on real sandboxes: the two-step start (sandbox and network
//! first, the process once the peers come), the launch environment, the remote agent
//! bound read-only, a stop before the peers, overlapping workload ranges refused, the
//! `rank0` launcher, and two agents' members reaching each other (and a non-member
//! reaching neither). Needs root, crun, ip and nft (`cargo xtask test` runs as root); the
//! sandboxed tests run in a network namespace of their own (`unshare --net`), which
//! stands for the node, so routes and rules never touch the host's.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_agent::backend::GpuBackend;
use tessera_agent::sandbox::{RSH_MOUNT, Sandbox};
use tessera_agent::sim::{SimNode, write_device_files};
use tessera_agent::workloads::LocalExecutor;
use tessera_domain::wire::{
    GangLauncher, GangPeer, GangSpec, WorkloadPhase, WorkloadReport, WorkloadSpec,
};
use tessera_domain::workload::EnvVar;

use crate::support::{H100, sync};

const WAIT: Duration = Duration::from_secs(30);
const FIRST_UID: u32 = 310_000;
/// Set for the tests run in a network namespace of their own.
const OWN_NETNS: &str = "TESSERA_TEST_GANG_NETNS";
/// This node's address on its uplink (in the test's namespace).
const NODE: &str = "192.0.2.10";
/// Another node's address on the same link (a route's next hop; nobody answers).
const OTHER_NODE: &str = "192.0.2.77";

/// Runs the `gang::own_netns_*` tests in a fresh network namespace.
#[test]
fn gang_members_on_real_sandboxes_in_a_network_namespace_of_their_own() {
    let text = crate::support::run_in_own_netns(&["gang::own_netns_"], OWN_NETNS);
    assert!(text.contains("5 passed"), "{text}");
}

/// The namespace's node: loopback up, an uplink with [`NODE`] (once).
fn node_network() {
    assert!(
        std::env::var_os(OWN_NETNS).is_some(),
        "run through gang_members_on_real_sandboxes_in_a_network_namespace_of_their_own"
    );
    if sh_ok("ip link show uplink") {
        return;
    }
    sh(&format!(
        "ip link set lo up && \
         ip link add uplink type veth peer name uplink-peer && \
         ip addr add {NODE}/24 dev uplink && ip link set uplink up && \
         ip link set uplink-peer up"
    ));
}

fn sh(script: &str) {
    assert!(sh_ok(script), "{script}");
}

fn sh_ok(script: &str) -> bool {
    std::process::Command::new("sh")
        .args(["-c", script])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap()
        .success()
}

fn out(cmd: &[&str]) -> String {
    let o = std::process::Command::new(cmd[0])
        .args(&cmd[1..])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

struct Node {
    dir: tempfile::TempDir,
    backend: Arc<dyn GpuBackend>,
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        write_device_files(&dir.path().join("dev"), &[0]).unwrap();
        Node {
            dir,
            backend: Arc::new(SimNode::new(&[H100], 1).unwrap()),
        }
    }

    /// An agent's executor with workload range `range`, at workload host `host`.
    fn executor(&self, name: &str, range: &str, internet: bool, host: &str) -> LocalExecutor {
        let dev = self.dir.path().join("dev");
        let mut s = crate::support::sandbox_settings(FIRST_UID, 10, 256, (64, 300), dev);
        let net = s.network.as_mut().unwrap();
        net.range = tessera_agent::network::Ipv4Range::parse(range).unwrap();
        net.internet = internet;
        let sb = Sandbox::open(
            s,
            Arc::clone(&self.backend),
            &self.dir.path().join(format!("{name}-sandbox")),
        )
        .unwrap_or_else(|e| panic!("the gang tests need root and crun: {e}"));
        LocalExecutor::open(&self.root(name), host)
            .unwrap()
            .with_sandbox(sb)
            .with_gang_rsh(Path::new(env!("CARGO_BIN_EXE_tessera-agent")))
    }

    fn root(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

fn member(id: &str, rank: u32, launcher: GangLauncher, script: &str) -> WorkloadSpec {
    WorkloadSpec {
        gang: Some(GangSpec {
            job: "job-g".into(),
            rank,
            size: 2,
            launcher,
            secret: "gang-secret-1".into(),
            rsh_port: 7022,
            peers: None,
        }),
        ..WorkloadSpec::job(id, "team-g", &[], &["/bin/sh", "-c", script])
    }
}

fn with_peers(spec: &WorkloadSpec, peers: Vec<GangPeer>, env: &[(&str, &str)]) -> WorkloadSpec {
    let mut s = spec.clone();
    s.gang.as_mut().unwrap().peers = Some(peers);
    s.env = env
        .iter()
        .map(|(k, v)| EnvVar {
            name: (*k).into(),
            value: (*v).into(),
        })
        .collect();
    s
}

fn peer(rank: u32, addr: &str, via: &str, slots: u32) -> GangPeer {
    GangPeer {
        rank,
        addr: addr.into(),
        via: via.into(),
        slots,
    }
}

async fn until(
    ex: &mut LocalExecutor,
    id: &str,
    what: &str,
    done: impl Fn(&WorkloadReport) -> bool,
) -> WorkloadReport {
    crate::support::report_until(ex, id, what, WAIT, done).await
}

async fn file(path: &Path) -> String {
    crate::support::whole_file(path, WAIT).await
}

/// The namespace (and nft table) name of a prepared member's network.
fn prepared_slot(root: &Path, id: &str) -> String {
    let p: serde_json::Value = serde_json::from_slice(
        &std::fs::read(root.join("runs").join(id).join("prepared.json")).unwrap(),
    )
    .unwrap();
    format!("tsr-{}", p["net"]["n"].as_u64().expect("a network slot"))
}

fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

fn table_exists(name: &str) -> bool {
    sh_ok(&format!("nft list table inet {name}"))
}

#[ignore = "run by gang_members_on_real_sandboxes_in_a_network_namespace_of_their_own"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_netns_a_member_waits_for_its_peers_then_runs_with_the_launch_environment() {
    node_network();
    let node = Node::new();
    let mut ex = node.executor("a", "10.221.0.0/16", true, NODE);
    let script = format!(
        r#"echo ran > "$TESSERA_WORKSPACE/ran-m0"
echo "hostfile=$TESSERA_HOSTFILE"
cat "$TESSERA_HOSTFILE"
echo "secret=$TESSERA_GANG_SECRET port=$TESSERA_GANG_RSH_PORT"
echo "agent=$OMPI_MCA_plm_rsh_agent tree=$OMPI_MCA_plm_rsh_no_tree_spawn"
echo "master=$MASTER_ADDR rank=$RANK"
test -x {RSH_MOUNT} && echo rsh=executable
grep " {RSH_MOUNT} " /proc/self/mounts | cut -d' ' -f4 | cut -d, -f1 | sed 's/^/rsh_mount=/'
(echo x > {RSH_MOUNT}) 2>/dev/null && echo rsh=writable
ip=$(/usr/bin/python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(("192.0.2.1", 9)); print(s.getsockname()[0])')
echo "hostname=$(hostname)"
getent hosts rank-0 | awk '{{print "rank0=" $1}}'
getent hosts rank-1 | awk '{{print "rank1=" $1}}'
/usr/bin/python3 -c 'import socket; n = socket.gethostname(); print("py", n, socket.gethostbyname(n))'
grep " /etc/hosts " /proc/self/mounts | cut -d' ' -f4 | cut -d, -f1 | sed 's/^/hosts_mount=/'
(echo x >> /etc/hosts) 2>/dev/null && echo hosts=writable
echo "own=$ip"
while [ ! -e "$TESSERA_WORKSPACE/go-m0" ]; do sleep 0.1; done
"#
    );
    let m0 = member("gang-m0", 0, GangLauncher::Each, &script);
    ex.apply(&sync(std::slice::from_ref(&m0)));
    let r = until(&mut ex, "gang-m0", "prepared", |r| r.gang_addr.is_some()).await;
    assert_eq!(r.phase, WorkloadPhase::Starting);
    let addr = r.gang_addr.clone().unwrap();
    assert!(addr.starts_with("10.221."), "{addr}");
    assert_eq!(r.gang_via.as_deref(), Some(NODE));
    let ns = prepared_slot(&node.root("a"), "gang-m0");
    assert!(netns_exists(&ns) && table_exists(&ns));
    // No process: a second later, still nothing has run.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let r = until(&mut ex, "gang-m0", "still starting", |_| true).await;
    assert_eq!(r.phase, WorkloadPhase::Starting);
    assert!(ex.pid("gang-m0").is_none());
    let ws = node.root("a").join("workspaces/team-g");
    assert!(!ws.join("ran-m0").exists());

    // Peers: rank 1 on another node (routed through it).
    let peers = vec![
        peer(0, &addr, NODE, 2),
        peer(1, "10.222.0.2", OTHER_NODE, 4),
    ];
    let m0 = with_peers(&m0, peers, &[("MASTER_ADDR", &addr), ("RANK", "0")]);
    ex.apply(&sync(std::slice::from_ref(&m0)));
    let r = until(&mut ex, "gang-m0", "running", |r| {
        r.phase == WorkloadPhase::Running
    })
    .await;
    assert_eq!(r.gang_addr.as_deref(), Some(addr.as_str()));
    assert_eq!(file(&ws.join("ran-m0")).await, "ran\n");
    let log_path = node.root("a").join("runs/gang-m0/output.log");
    let deadline = Instant::now() + WAIT;
    let mut log = String::new();
    while !log.contains("own=") {
        assert!(Instant::now() < deadline, "{log}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        log = std::fs::read_to_string(&log_path).unwrap_or_default();
    }
    assert!(log.contains("hostfile=/run/tessera/hostfile\n"), "{log}");
    assert!(
        log.contains(&format!("{addr} slots=2\n10.222.0.2 slots=4\n")),
        "{log}"
    );
    assert!(log.contains("secret=gang-secret-1 port=7022\n"), "{log}");
    assert!(
        log.contains(&format!("agent={RSH_MOUNT} tree=1\n")),
        "{log}"
    );
    assert!(log.contains(&format!("master={addr} rank=0\n")), "{log}");
    assert!(log.contains("rsh=executable\n"), "{log}");
    assert!(log.contains("rsh_mount=ro\n"), "{log}");
    assert!(!log.contains("rsh=writable"), "{log}");
    assert!(log.contains(&format!("own={addr}\n")), "{log}");
    // Its host name is its rank's and resolves to its own gang address (and the peer's
    // to the peer's), through an /etc/hosts it cannot change.
    assert!(log.contains("hostname=rank-0\n"), "{log}");
    assert!(log.contains(&format!("rank0={addr}\n")), "{log}");
    assert!(log.contains("rank1=10.222.0.2\n"), "{log}");
    assert!(log.contains(&format!("py rank-0 {addr}\n")), "{log}");
    assert!(log.contains("hosts_mount=ro\n"), "{log}");
    assert!(!log.contains("hosts=writable"), "{log}");
    // The node routes to the remote peer through its node, and its table names it.
    let route = out(&["ip", "route", "show", "10.222.0.2/32"]);
    assert!(route.contains(&format!("via {OTHER_NODE}")), "{route}");
    let table = out(&["nft", "list", "table", "inet", &ns]);
    assert!(table.contains("ip daddr 10.222.0.2 accept"), "{table}");
    assert!(table.contains("ip saddr 10.222.0.2 accept"), "{table}");
    assert!(
        table.contains(&format!("ip saddr != {addr} drop")),
        "{table}"
    );

    // It ends: its route, rules and namespace go with it.
    std::fs::write(ws.join("go-m0"), "").unwrap();
    let r = until(&mut ex, "gang-m0", "exited", |r| {
        r.phase == WorkloadPhase::Exited
    })
    .await;
    assert_eq!(r.exit_code, Some(0), "{log}");
    assert_eq!(out(&["ip", "route", "show", "10.222.0.2/32"]), "");
    assert!(!netns_exists(&ns) && !table_exists(&ns));
    ex.apply(&sync(&[]));
}

#[ignore = "run by gang_members_on_real_sandboxes_in_a_network_namespace_of_their_own"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_netns_a_stop_before_the_peers_removes_what_was_prepared_also_after_a_restart() {
    node_network();
    let node = Node::new();
    let mut ex = node.executor("b", "10.221.0.0/16", true, NODE);
    let m = member(
        "gang-s0",
        0,
        GangLauncher::Each,
        "echo ran > $TESSERA_WORKSPACE/ran-s0",
    );
    let other = member(
        "gang-s1",
        1,
        GangLauncher::Each,
        "echo ran > $TESSERA_WORKSPACE/ran-s1",
    );
    let both = [m.clone(), other.clone()];
    ex.apply(&sync(&both));
    until(&mut ex, "gang-s0", "prepared", |r| r.gang_addr.is_some()).await;
    let (ns0, ns1) = (
        prepared_slot(&node.root("b"), "gang-s0"),
        prepared_slot(&node.root("b"), "gang-s1"),
    );
    assert_ne!(ns0, ns1);

    // A stop: nothing ran, nothing is left.
    let stop = [
        WorkloadSpec {
            run: false,
            ..m.clone()
        },
        other.clone(),
    ];
    ex.apply(&sync(&stop));
    let r = until(&mut ex, "gang-s0", "stopped", |r| {
        r.phase == WorkloadPhase::Exited
    })
    .await;
    assert_eq!(r.message.as_deref(), Some("stopped before it started"));
    assert!(!netns_exists(&ns0) && !table_exists(&ns0));

    // A restarted agent adopts the other as prepared, and a server that forgets it
    // removes it.
    drop(ex);
    let mut ex = node.executor("b", "10.221.0.0/16", true, NODE);
    let r = until(&mut ex, "gang-s1", "adopted", |_| true).await;
    assert_eq!(r.phase, WorkloadPhase::Starting);
    assert!(
        r.gang_addr
            .as_deref()
            .is_some_and(|a| a.starts_with("10.221."))
    );
    assert!(netns_exists(&ns1) && table_exists(&ns1));
    ex.apply(&sync(&[]));
    assert!(!netns_exists(&ns1) && !table_exists(&ns1));
    let ws = node.root("b").join("workspaces/team-g");
    assert!(!ws.join("ran-s0").exists() && !ws.join("ran-s1").exists());
    assert!(!node.root("b").join("runs/s1").exists());
}

#[ignore = "run by gang_members_on_real_sandboxes_in_a_network_namespace_of_their_own"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_netns_a_peer_inside_the_nodes_own_range_is_refused() {
    node_network();
    let node = Node::new();
    let mut ex = node.executor("c", "10.221.0.0/16", true, NODE);
    let m = member(
        "gang-o0",
        0,
        GangLauncher::Each,
        "echo ran > $TESSERA_WORKSPACE/ran-o0",
    );
    ex.apply(&sync(std::slice::from_ref(&m)));
    let addr = until(&mut ex, "gang-o0", "prepared", |r| r.gang_addr.is_some())
        .await
        .gang_addr
        .unwrap();
    let ns = prepared_slot(&node.root("c"), "gang-o0");
    // The other node was given the same range: its member has an address of ours.
    let m = with_peers(
        &m,
        vec![
            peer(0, &addr, NODE, 1),
            peer(1, "10.221.3.2", OTHER_NODE, 1),
        ],
        &[],
    );
    ex.apply(&sync(std::slice::from_ref(&m)));
    let r = until(&mut ex, "gang-o0", "refused", |r| {
        r.phase == WorkloadPhase::FailedToStart
    })
    .await;
    let msg = r.message.unwrap();
    assert!(msg.contains("10.221.3.2"), "{msg}");
    assert!(msg.contains("distinct --sandbox-net ranges"), "{msg}");
    assert!(!netns_exists(&ns) && !table_exists(&ns));
    assert_eq!(out(&["ip", "route", "show", "10.221.3.2/32"]), "");
    assert!(!node.root("c").join("workspaces/team-g/ran-o0").exists());
    ex.apply(&sync(&[]));
}

#[ignore = "run by gang_members_on_real_sandboxes_in_a_network_namespace_of_their_own"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_netns_with_the_rank0_launcher_other_ranks_run_the_remote_agent() {
    node_network();
    let node = Node::new();
    let mut ex = node.executor("d", "10.221.0.0/16", true, NODE);
    let m = member(
        "gang-r1",
        1,
        GangLauncher::Rank0,
        "echo ran > $TESSERA_WORKSPACE/ran-r1",
    );
    ex.apply(&sync(std::slice::from_ref(&m)));
    let addr = until(&mut ex, "gang-r1", "prepared", |r| r.gang_addr.is_some())
        .await
        .gang_addr
        .unwrap();
    let m = with_peers(
        &m,
        vec![
            peer(0, "10.222.0.2", OTHER_NODE, 1),
            peer(1, &addr, NODE, 1),
        ],
        &[],
    );
    ex.apply(&sync(std::slice::from_ref(&m)));
    until(&mut ex, "gang-r1", "started", |r| {
        r.phase != WorkloadPhase::Starting
    })
    .await;
    // Its container's command is the remote agent's daemon, not the job's.
    let bundle: serde_json::Value = serde_json::from_slice(
        &std::fs::read(node.root("d").join("runs/gang-r1/bundle/config.json")).unwrap(),
    )
    .unwrap();
    let args: Vec<&str> = bundle["process"]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args[args.len() - 2..], [RSH_MOUNT, "serve"], "{args:?}");
    assert!(!args.iter().any(|a| a.contains("ran-r1")), "{args:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = until(&mut ex, "gang-r1", "reported", |_| true).await;
    let log = std::fs::read_to_string(node.root("d").join("runs/gang-r1/output.log")).unwrap();
    // It runs the daemon (argv[0] the remote agent's name) until it is stopped.
    assert_eq!(r.phase, WorkloadPhase::Running, "{log}");
    let pid = ex.pid("gang-r1").unwrap();
    let mut found = false;
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        if cmd.starts_with(format!("{RSH_MOUNT}\0serve\0").as_bytes())
            && stat.split_whitespace().nth(3) == Some(&pid.to_string())
        {
            found = true;
        }
    }
    assert!(found, "no `tessera-rsh serve` under {pid}; log:\n{log}");
    assert!(
        !node.root("d").join("workspaces/team-g/ran-r1").exists(),
        "{log}"
    );
    ex.apply(&sync(&[WorkloadSpec { run: false, ..m }]));
    until(&mut ex, "gang-r1", "ended", |r| {
        matches!(
            r.phase,
            WorkloadPhase::Exited | WorkloadPhase::FailedToStart
        )
    })
    .await;
    ex.apply(&sync(&[]));
}

/// Serves `name saw <peer address>` on the member's own address, port 7000, then
/// connects to `$PEER`:7000 until it answers and writes what it said to
/// `$TESSERA_WORKSPACE/result-<name>`; ends once `done-<name>` exists.
const PAIR: &str = r#"
/usr/bin/python3 - "$NAME" <<'PY' &
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 7000))
s.listen(8)
while True:
    c, (ip, _) = s.accept()
    c.sendall(f"{sys.argv[1]} saw {ip}\n".encode())
    c.close()
PY
/usr/bin/python3 - "$PEER" > "$TESSERA_WORKSPACE/result-$NAME.tmp" <<'PY'
import socket, sys, time
end = time.time() + 20
while True:
    try:
        print(socket.create_connection((sys.argv[1], 7000), timeout=2).recv(64).decode().strip())
        break
    except OSError as e:
        if time.time() > end:
            print("x: " + (e.strerror or str(e)))
            break
        time.sleep(0.2)
PY
mv "$TESSERA_WORKSPACE/result-$NAME.tmp" "$TESSERA_WORKSPACE/result-$NAME"
while [ ! -e "$TESSERA_WORKSPACE/done-$NAME" ]; do sleep 0.1; done
"#;

/// Connects from a non-member to `A` and `B` (port 7000): the answers or errors.
const OUTSIDER: &str = r#"
echo "outsider_host=$(hostname)"
/usr/bin/python3 - "$A" "$B" <<'PY'
import socket, sys
for name, host in (("a", sys.argv[1]), ("b", sys.argv[2])):
    try:
        print(name + ": " + socket.create_connection((host, 7000), timeout=3).recv(64).decode().strip())
    except OSError as e:
        print(name + ": x: " + (e.strerror or str(e)))
PY
"#;

#[ignore = "run by gang_members_on_real_sandboxes_in_a_network_namespace_of_their_own"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_netns_members_of_two_agents_reach_each_other_and_an_outsider_neither() {
    node_network();
    let node = Node::new();
    // Two agents on one host with distinct ranges; B's allows no internet, so only its
    // gang rules let it out.
    let mut ea = node.executor("ea", "10.223.0.0/16", true, "127.0.0.1");
    let mut eb = node.executor("eb", "10.224.0.0/16", false, "127.0.0.1");
    let a = member("gang-pa", 0, GangLauncher::Each, PAIR);
    let b = member("gang-pb", 1, GangLauncher::Each, PAIR);
    ea.apply(&sync(std::slice::from_ref(&a)));
    eb.apply(&sync(std::slice::from_ref(&b)));
    let a_addr = until(&mut ea, "gang-pa", "prepared", |r| r.gang_addr.is_some())
        .await
        .gang_addr
        .unwrap();
    let b_addr = until(&mut eb, "gang-pb", "prepared", |r| r.gang_addr.is_some())
        .await
        .gang_addr
        .unwrap();
    let peers = vec![
        peer(0, &a_addr, "127.0.0.1", 1),
        peer(1, &b_addr, "127.0.0.1", 1),
    ];
    let a = with_peers(&a, peers.clone(), &[("NAME", "a"), ("PEER", &b_addr)]);
    let b = with_peers(&b, peers, &[("NAME", "b"), ("PEER", &a_addr)]);
    ea.apply(&sync(std::slice::from_ref(&a)));
    eb.apply(&sync(std::slice::from_ref(&b)));
    let (ws_a, ws_b) = (
        node.root("ea").join("workspaces/team-g"),
        node.root("eb").join("workspaces/team-g"),
    );
    let (fa, fb) = (ws_a.join("result-a"), ws_b.join("result-b"));
    let (ra, rb) = tokio::join!(file(&fa), file(&fb));
    // Each saw the other's own address: nothing was masqueraded between them.
    assert_eq!(ra.trim(), format!("b saw {a_addr}"));
    assert_eq!(rb.trim(), format!("a saw {b_addr}"));

    // A workload of A's node that is not a member reaches neither.
    let c = WorkloadSpec {
        env: vec![
            EnvVar {
                name: "A".into(),
                value: a_addr.clone(),
            },
            EnvVar {
                name: "B".into(),
                value: b_addr.clone(),
            },
        ],
        ..WorkloadSpec::job("gang-pc", "team-c", &[], &["/bin/sh", "-c", OUTSIDER])
    };
    let wanted = [a.clone(), c.clone()];
    ea.apply(&sync(&wanted));
    let r = until(&mut ea, "gang-pc", "done", |r| {
        r.phase == WorkloadPhase::Exited
    })
    .await;
    let log = std::fs::read_to_string(node.root("ea").join("runs/gang-pc/output.log")).unwrap();
    assert_eq!(r.exit_code, Some(0), "{log}");
    assert!(log.contains("a: x: No route to host"), "{log}");
    assert!(log.contains("b: x: timed out"), "{log}");
    // Not a member: the sandbox's usual host name.
    assert!(log.contains("outsider_host=tessera\n"), "{log}");
    // The members still answer each other (the refusals were the outsider's).
    assert!(!log.contains("saw"), "{log}");

    for (ws, name) in [(&ws_a, "a"), (&ws_b, "b")] {
        std::fs::write(ws.join(format!("done-{name}")), "").unwrap();
    }
    let ra = until(&mut ea, "gang-pa", "exited", |r| {
        r.phase == WorkloadPhase::Exited
    })
    .await;
    let rb = until(&mut eb, "gang-pb", "exited", |r| {
        r.phase == WorkloadPhase::Exited
    })
    .await;
    assert_eq!((ra.exit_code, rb.exit_code), (Some(0), Some(0)));
    ea.apply(&sync(&[]));
    eb.apply(&sync(&[]));
}

/// Without the sandbox: the member's address is the node's, the remote agent a symlink
/// to the agent in its run folder, the hostfile there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gang_member_without_the_sandbox_uses_the_nodes_address_and_its_run_folder() {
    let dir = tempfile::tempdir().unwrap();
    let exe = Path::new(env!("CARGO_BIN_EXE_tessera-agent"));
    let mut ex = LocalExecutor::open(dir.path(), "127.0.0.1")
        .unwrap()
        .with_gang_rsh(exe);
    let m = member(
        "gang-u0",
        0,
        GangLauncher::Each,
        r#"cat "$TESSERA_HOSTFILE" > "$TESSERA_WORKSPACE/hosts"; readlink "$OMPI_MCA_plm_rsh_agent" >> "$TESSERA_WORKSPACE/hosts""#,
    );
    ex.apply(&sync(std::slice::from_ref(&m)));
    let r = until(&mut ex, "gang-u0", "prepared", |r| r.gang_addr.is_some()).await;
    assert_eq!(r.phase, WorkloadPhase::Starting);
    assert_eq!(r.gang_addr.as_deref(), Some("127.0.0.1"));
    assert!(ex.pid("gang-u0").is_none());
    let m = with_peers(
        &m,
        vec![
            peer(0, "127.0.0.1", "127.0.0.1", 3),
            peer(1, "192.0.2.44", "192.0.2.44", 3),
        ],
        &[],
    );
    ex.apply(&sync(std::slice::from_ref(&m)));
    let r = until(&mut ex, "gang-u0", "exited", |r| {
        r.phase == WorkloadPhase::Exited
    })
    .await;
    assert_eq!(r.exit_code, Some(0));
    let hosts = std::fs::read_to_string(dir.path().join("workspaces/team-g/hosts")).unwrap();
    assert_eq!(
        hosts,
        format!(
            "127.0.0.1 slots=3\n192.0.2.44 slots=3\n{}\n",
            exe.canonicalize().unwrap().display()
        )
    );
    ex.apply(&sync(&[]));
}

/// A member in an OCI image: pulled, then prepared (no process), then run with the
/// remote agent read-only at its path in the image and the hostfile.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gang_member_in_an_image_is_pulled_prepared_then_runs_with_the_remote_agent() {
    use tessera_agent::driver_files::DriverFiles;
    use tessera_agent::oci::unpack::Limits;
    use tessera_agent::oci::{ImageStore, StoreLimits};
    use tessera_domain::wire::ImageSpec;
    use tessera_registry::testkit::{Registry, build_image, push, registry_available};
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| {
        use std::os::unix::fs::MetadataExt;
        m.uid() == 0
    });
    if !registry_available() || !root || !Path::new("/bin/busybox").exists() {
        eprintln!("SKIPPED: image gang members need root, crun, busybox and the registry");
        return;
    }
    let reg = Registry::start(None);
    let http = reqwest::Client::new();
    let built = build_image("tessera-gangimage", 0);
    push(&http, &reg, "team/gang", "v1", &built, None).await;
    let image = format!("{}/team/gang@{}", reg.addr, built.digest());

    let node = Node::new();
    let dev = node.dir.path().join("dev");
    let mut s = crate::support::sandbox_settings(FIRST_UID + 20, 4, 128, (64, 600), dev);
    s.network = None;
    s.driver_files = DriverFiles::default();
    let sb = Sandbox::open(s, Arc::clone(&node.backend), &node.root("img-sandbox"))
        .unwrap_or_else(|e| panic!("the gang tests need root and crun: {e}"));
    let store = ImageStore::open(
        &node.root("img/images"),
        StoreLimits {
            image: Limits {
                max_bytes: 64 << 20,
                max_entries: 10_000,
            },
            cache_bytes: 1 << 40,
        },
        reqwest::Client::new(),
    )
    .unwrap();
    let mut ex = LocalExecutor::open(&node.root("img"), "127.0.0.1")
        .unwrap()
        .with_sandbox(sb)
        .with_images(store)
        .with_gang_rsh(Path::new(env!("CARGO_BIN_EXE_tessera-agent")));
    let script = format!(
        "echo ran > /workspace/ran-img; cat \"$TESSERA_HOSTFILE\"; \
         test -x {RSH_MOUNT} && echo rsh=executable; \
         grep \" {RSH_MOUNT} \" /proc/self/mounts | cut -d' ' -f4 | cut -d, -f1 | sed 's/^/rsh_mount=/'; \
         echo \"agent=$OMPI_MCA_plm_rsh_agent\"; \
         read h < /proc/sys/kernel/hostname; echo \"hostname=$h\"; \
         test -e /etc/hosts || echo hosts=none"
    );
    let m = WorkloadSpec {
        image: Some(ImageSpec {
            reference: image,
            requires_cuda: None,
            login: None,
        }),
        argv: vec![script],
        ..member("gang-img0", 0, GangLauncher::Each, "")
    };
    ex.apply(&sync(std::slice::from_ref(&m)));
    let r = until(&mut ex, "gang-img0", "prepared", |r| r.gang_addr.is_some()).await;
    assert_eq!(r.phase, WorkloadPhase::Starting);
    assert_eq!(r.gang_addr.as_deref(), Some("127.0.0.1"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ws = node.root("img").join("workspaces/team-g");
    assert!(!ws.join("ran-img").exists());
    let m = with_peers(
        &m,
        vec![
            peer(0, "127.0.0.1", "127.0.0.1", 1),
            peer(1, "192.0.2.55", "192.0.2.55", 1),
        ],
        &[],
    );
    ex.apply(&sync(std::slice::from_ref(&m)));
    let r = until(&mut ex, "gang-img0", "exited", |r| {
        matches!(
            r.phase,
            WorkloadPhase::Exited | WorkloadPhase::FailedToStart
        )
    })
    .await;
    let log = std::fs::read_to_string(node.root("img").join("runs/gang-img0/output.log"))
        .unwrap_or_default();
    assert_eq!(r.exit_code, Some(0), "{r:#?}\n{log}");
    assert!(ws.join("ran-img").exists(), "{log}");
    assert!(
        log.contains("127.0.0.1 slots=1\n192.0.2.55 slots=1\n"),
        "{log}"
    );
    assert!(log.contains("rsh=executable\n"), "{log}");
    assert!(log.contains("rsh_mount=ro\n"), "{log}");
    assert!(log.contains(&format!("agent={RSH_MOUNT}\n")), "{log}");
    // Its rank's host name; this image has no /etc/hosts, and none is made in it.
    assert!(log.contains("hostname=rank-0\n"), "{log}");
    assert!(log.contains("hosts=none\n"), "{log}");
    ex.apply(&sync(&[]));
}
