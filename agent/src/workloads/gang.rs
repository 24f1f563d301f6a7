//! Gang members (issue 42): one workload per node of a gang job, started in two steps
//! (the contract is [`tessera_domain::wire::GangSpec`]'s).
//!
//! 1. A spec with `gang` and no `peers` is *prepared*: everything a start does before the
//!    process (names, devices, the team workspace and its quota, the team uid, a port,
//!    the network slot) but no process. It reports `starting` with `gang_addr`, the
//!    address its processes will have: its slot's, or the node's workload host when
//!    workloads share the node's network. `runs/<id>/prepared.json` keeps what was made
//!    (spec, port, slot, image digest), so a restarted agent adopts it as prepared.
//! 2. The same id with `peers` starts the process in what was prepared: the network is
//!    opened to the peers ([`crate::network::open_to_peers`]: their addresses both ways,
//!    unmasqueraded, routes to peers on other nodes, anti-spoofing), the Open MPI
//!    hostfile is written into the control folder (`<addr> slots=<slots>`, one line per
//!    member by rank), and the environment gets [`HOSTFILE_VAR`], [`SECRET_VAR`],
//!    [`RSH_PORT_VAR`], `OMPI_MCA_plm_rsh_agent` (the remote agent),
//!    `OMPI_MCA_plm_rsh_no_tree_spawn=1`, `OMPI_MCA_orte_leave_session_attached=1` (an
//!    `orted` started through the remote agent stays in `serve`'s process group and
//!    ends with it) and `OMPI_MCA_btl_vader_single_copy_mechanism=none` (the sandbox
//!    may refuse cross-memory attach) on top of the server's launch variables. In the
//!    sandbox the member's host name is `rank-<N>` and `runs/<id>/hosts` (`localhost`
//!    and `<addr> rank-<rank>` per member, its own included) is bound read-only over
//!    `/etc/hosts`, so that its host name resolves to its gang address (what gloo,
//!    NCCL's bootstrap and Open MPI advertise).
//!
//! The remote agent, `tessera-rsh`, is the agent's own executable under that name
//! ([`crate::gang_rsh`]): bound read-only at [`RSH_MOUNT`] in every member's sandbox, or,
//! without the sandbox, a symlink `runs/<id>/tessera-rsh`. With the `rank0` launcher,
//! members other than rank 0 run `tessera-rsh serve` (the daemon `mpirun` reaches
//! through the client) instead of the command.
//!
//! A stop (or the server forgetting it) before the peers came removes what was prepared.

use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::net::{Ipv4Addr, UdpSocket};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tessera_domain::wire::{GangLauncher, GangPeer, GangSpec, WorkloadSpec};

use super::{
    LocalExecutor, Status, Workload, image, needs_port, open_run_dir, safe_name, share_devices,
    write_atomic,
};
use crate::network::{self, Peer, Slot};
use crate::oci::Image;
use crate::sandbox::{CONTROL_MOUNT, Names, RSH_MOUNT};

/// The hostfile's path, as the workload sees it.
pub const HOSTFILE_VAR: &str = "TESSERA_HOSTFILE";
/// The gang's secret, which the remote agent asks for.
pub const SECRET_VAR: &str = "TESSERA_GANG_SECRET";
/// The port the remote agent listens on in every member.
pub const RSH_PORT_VAR: &str = "TESSERA_GANG_RSH_PORT";
/// The remote agent's program name (the agent dispatches on it, see [`crate::gang_rsh`]).
pub const RSH_PROGRAM: &str = "tessera-rsh";
/// The hostfile's name in the control folder (sandbox) or the run folder.
pub const HOSTFILE: &str = "hostfile";
/// The hosts file's name in the run folder (sandbox only; bound over `/etc/hosts`).
pub const HOSTS: &str = "hosts";
/// What a prepared member's run folder keeps for an agent restarted before its start.
const PREPARED_FILE: &str = "prepared.json";

/// A member whose sandbox is ready and whose process waits for its peers.
pub(super) struct Prepared {
    pub(super) port: Option<u16>,
    /// Its network, when it has one of its own.
    pub(super) net: Option<Slot>,
    /// Its image, held.
    pub(super) image: Option<Image>,
    /// The image's digest, when adopted before the image store was set.
    pub(super) image_digest: Option<String>,
}

/// `runs/<id>/prepared.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct PreparedState {
    spec: WorkloadSpec,
    port: Option<u16>,
    #[serde(default)]
    net: Option<Slot>,
    #[serde(default)]
    image_digest: Option<String>,
}

impl Prepared {
    /// Removes what was made for it (its network); the run folder is the caller's.
    pub(super) fn discard(&mut self) {
        if let Some(net) = self.net.take() {
            network::remove(&net);
        }
        self.image = None;
    }
}

/// Whether a member runs the remote agent's daemon instead of the command.
pub fn serves(g: &GangSpec) -> bool {
    g.launcher == GangLauncher::Rank0 && g.rank > 0
}

/// The Open MPI hostfile: one `<addr> slots=<slots>` line per member, by rank.
pub fn hostfile_text(peers: &[GangPeer]) -> String {
    let mut by_rank: Vec<&GangPeer> = peers.iter().collect();
    by_rank.sort_by_key(|p| p.rank);
    by_rank
        .iter()
        .map(|p| format!("{} slots={}\n", p.addr, p.slots))
        .collect()
}

/// A member's host name in the sandbox.
pub fn hostname(rank: u32) -> String {
    format!("rank-{rank}")
}

/// The member's `/etc/hosts`: `localhost`, then `<addr> rank-<rank>` per member, by rank.
pub fn hosts_text(peers: &[GangPeer]) -> String {
    let mut by_rank: Vec<&GangPeer> = peers.iter().collect();
    by_rank.sort_by_key(|p| p.rank);
    let mut text = String::from("127.0.0.1 localhost\n::1 localhost\n");
    for p in by_rank {
        text.push_str(&format!("{} {}\n", p.addr, hostname(p.rank)));
    }
    text
}

/// The peers the server sent must be the whole gang (ranks `0..size`, once each), with
/// this member at its own address.
pub fn check_peers(g: &GangSpec, own_addr: &str) -> Result<Vec<GangPeer>, String> {
    let Some(peers) = &g.peers else {
        return Err("the gang's peers are not known yet".to_owned());
    };
    let mut ranks: Vec<u32> = peers.iter().map(|p| p.rank).collect();
    ranks.sort_unstable();
    if ranks != (0..g.size).collect::<Vec<u32>>() {
        return Err(format!(
            "the gang's peers have ranks {ranks:?}, not each of 0..{} once",
            g.size
        ));
    }
    let own = peers
        .iter()
        .find(|p| p.rank == g.rank)
        .map(|p| p.addr.as_str());
    if own != Some(own_addr) {
        return Err(format!(
            "the gang's peers give rank {} the address {}, but this member's is {own_addr}",
            g.rank,
            own.unwrap_or("(none)")
        ));
    }
    if let Some(p) = peers
        .iter()
        .find(|p| p.addr.trim().is_empty() || p.slots == 0)
    {
        return Err(format!("gang peer {} has no address or no slots", p.rank));
    }
    Ok(peers.clone())
}

/// The peers as the member's network sees them: the others' IPv4 addresses, with
/// their node's address when that node is not this one (`host`: this node's workload
/// host). A peer whose address is its node's own (no network of its own) needs no route.
pub fn network_peers(g: &GangSpec, peers: &[GangPeer], host: &str) -> Result<Vec<Peer>, String> {
    peers
        .iter()
        .filter(|p| p.rank != g.rank)
        .map(|p| {
            let addr: Ipv4Addr = p.addr.parse().map_err(|_| {
                format!(
                    "gang peer {}'s address `{}` is not an IPv4 address",
                    p.rank, p.addr
                )
            })?;
            if p.via == p.addr || p.via == host || is_local(&p.via) {
                return Ok(Peer { addr, via: None });
            }
            let via: Ipv4Addr = p.via.parse().map_err(|_| {
                format!(
                    "gang peer {}'s node address `{}` is not an IPv4 address",
                    p.rank, p.via
                )
            })?;
            Ok(Peer {
                addr,
                via: Some(via),
            })
        })
        .collect()
}

/// Whether `addr` is one of this node's own addresses (it can be bound here).
fn is_local(addr: &str) -> bool {
    addr.parse::<Ipv4Addr>()
        .is_ok_and(|a| a.is_loopback() || UdpSocket::bind((a, 0)).is_ok())
}

/// The variables a member gets besides the server's launch environment.
pub fn gang_env(g: &GangSpec, hostfile: &Path, rsh: &Path) -> Vec<(OsString, OsString)> {
    vec![
        (HOSTFILE_VAR.into(), hostfile.into()),
        (SECRET_VAR.into(), g.secret.clone().into()),
        (RSH_PORT_VAR.into(), g.rsh_port.to_string().into()),
        ("OMPI_MCA_plm_rsh_agent".into(), rsh.into()),
        ("OMPI_MCA_plm_rsh_no_tree_spawn".into(), "1".into()),
        ("OMPI_MCA_orte_leave_session_attached".into(), "1".into()),
        (
            "OMPI_MCA_btl_vader_single_copy_mechanism".into(),
            "none".into(),
        ),
    ]
}

/// What a gang member's launch adds to its start, worked out by [`LocalExecutor::try_start`].
pub(super) struct Launch {
    pub(super) spec: GangSpec,
    pub(super) peers: Vec<GangPeer>,
    /// The remote agent's path as the workload sees it.
    pub(super) rsh: PathBuf,
    /// The hostfile's path as the workload sees it.
    pub(super) hostfile: PathBuf,
}

impl Launch {
    /// `spec`'s gang with its peers checked, and the paths the member gets.
    pub(super) fn new(
        g: &GangSpec,
        own_addr: &str,
        run: &Path,
        sandboxed: bool,
    ) -> Result<Launch, String> {
        let peers = check_peers(g, own_addr)?;
        let (rsh, hostfile) = if sandboxed {
            (
                PathBuf::from(RSH_MOUNT),
                Path::new(CONTROL_MOUNT).join(HOSTFILE),
            )
        } else {
            (run.join(RSH_PROGRAM), run.join(HOSTFILE))
        };
        Ok(Launch {
            spec: g.clone(),
            peers,
            rsh,
            hostfile,
        })
    }

    /// The command: `tessera-rsh serve` for the members that serve, else `argv`.
    pub(super) fn argv(&self) -> Option<Vec<String>> {
        serves(&self.spec).then(|| vec![self.rsh.to_string_lossy().into_owned(), "serve".into()])
    }

    /// What the sandbox gives the member: its host name and hosts file (`run`: its run
    /// folder, where [`Launch::write_files`] writes that file).
    pub(super) fn names(&self, run: &Path) -> Names {
        Names {
            hostname: hostname(self.spec.rank),
            hosts: run.join(HOSTS),
        }
    }

    /// Writes the hostfile (and, in the sandbox, the hosts file; without it, the remote agent's symlink to
    /// `exe`) into the run folder `run` before the process starts.
    pub(super) fn write_files(
        &self,
        run: &Path,
        sandboxed: bool,
        exe: &Path,
    ) -> Result<(), String> {
        let dir = if sandboxed {
            run.join("ctl")
        } else {
            run.to_owned()
        };
        fs::create_dir_all(&dir).map_err(|e| format!("cannot create the run folder: {e}"))?;
        super::write_untrusted_dir(&dir.join(HOSTFILE), hostfile_text(&self.peers).as_bytes())
            .map_err(|e| format!("cannot write the gang's hostfile: {e}"))?;
        if sandboxed {
            // In the run folder, not the control folder: the workload cannot rewrite it.
            let tmp = run.join(format!("{HOSTS}.tmp"));
            let _ = fs::remove_file(&tmp);
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(&tmp)
                .and_then(|mut f| f.write_all(hosts_text(&self.peers).as_bytes()))
                .and_then(|()| fs::rename(&tmp, run.join(HOSTS)))
                .map_err(|e| format!("cannot write the gang's hosts file: {e}"))?;
        } else {
            let link = run.join(RSH_PROGRAM);
            let _ = fs::remove_file(&link);
            std::os::unix::fs::symlink(exe, &link)
                .map_err(|e| format!("cannot link the gang's remote agent: {e}"))?;
        }
        Ok(())
    }
}

impl LocalExecutor {
    /// Sets the executable gang members get as `tessera-rsh` (default: this process's
    /// own, resolved; tests name the built `tessera-agent`).
    pub fn with_gang_rsh(mut self, exe: &Path) -> Self {
        self.rsh = exe.canonicalize().ok().or_else(|| Some(exe.to_owned()));
        self
    }

    /// Prepares gang member `spec` (step 1, see the module docs), in `image` when it has
    /// one; any failure becomes a `FailedToStart` workload.
    pub(super) fn prepare(&self, spec: &WorkloadSpec, image: Option<Image>) -> Workload {
        match self.try_prepare(spec, image) {
            Ok(w) => {
                tracing::info!(id = spec.id, addr = w.gang_addr, "gang member prepared");
                w
            }
            Err(message) => {
                tracing::warn!(id = spec.id, message, "gang member failed to start");
                Workload::new(self.run_dir(&spec.id), Status::FailedToStart(message))
            }
        }
    }

    fn try_prepare(&self, spec: &WorkloadSpec, image: Option<Image>) -> Result<Workload, String> {
        let Some(g) = &spec.gang else {
            return Err("not a gang member".to_owned());
        };
        if !safe_name(&spec.id) {
            return Err(format!(
                "workload id `{}` is not a safe folder name ([A-Za-z0-9._-])",
                spec.id
            ));
        }
        if spec.argv.is_empty() && image.is_none() && !serves(g) {
            return Err("nothing to run: argv is empty".to_owned());
        }
        if image.is_some() && self.sandbox.is_none() {
            return Err(image::NEEDS_SANDBOX.to_owned());
        }
        if self.rsh.is_none() {
            return Err(
                "cannot find the agent's own executable, which gang members run as tessera-rsh"
                    .to_owned(),
            );
        }
        let devices = match &spec.share {
            Some(share) => share_devices(spec, share)?,
            None => spec.devices.clone(),
        };
        // The workspace, its quota and the team's uid, as a start checks them.
        self.team_workspace(spec)?;
        let port = if needs_port(spec) {
            Some(
                self.free_port()
                    .map_err(|e| format!("cannot choose a port: {e}"))?,
            )
        } else {
            None
        };
        let run = self.root.join("runs").join(&spec.id);
        let net = match &self.sandbox {
            Some(sb) => sb.make_network(port)?,
            None => None,
        };
        let state = PreparedState {
            spec: image::without_login(spec),
            port,
            net: net.clone(),
            image_digest: image.as_ref().map(|i| i.digest().to_string()),
        };
        let written = open_run_dir(&run)
            .map_err(|e| format!("cannot create the run folder: {e}"))
            .and_then(|_| {
                write_atomic(&run.join(PREPARED_FILE), &state)
                    .map_err(|e| format!("cannot write {PREPARED_FILE}: {e}"))
            });
        if let Err(e) = written {
            if let Some(n) = &net {
                network::remove(n);
            }
            let _ = fs::remove_dir_all(&run);
            return Err(e);
        }
        let mut w = Workload::new(
            Some(run),
            Status::Prepared(Box::new(Prepared {
                port,
                net,
                image,
                image_digest: None,
            })),
        );
        w.port = port;
        w.devices = devices;
        w.gang_addr = Some(self.gang_addr(w.prepared_net()));
        Ok(w)
    }

    /// A member's address: its network's, else the node's workload host.
    pub(super) fn gang_addr(&self, net: Option<&Slot>) -> String {
        net.map_or_else(|| self.host.clone(), |n| n.addr.to_string())
    }

    /// Prepares gang member `spec` and, when it already names its peers (an agent that
    /// lost what it had prepared), launches it at once.
    pub(super) fn prepare_or_launch(&self, spec: &WorkloadSpec, image: Option<Image>) -> Workload {
        let w = self.prepare(spec, image);
        match (&w.status, &spec.gang) {
            (Status::Prepared(_), Some(g)) if g.peers.is_some() => self.launch(w, spec),
            _ => w,
        }
    }

    /// Starts prepared member `w` now that `spec` brings its peers (step 2).
    pub(super) fn launch(&self, mut w: Workload, spec: &WorkloadSpec) -> Workload {
        let Status::Prepared(prepared) =
            std::mem::replace(&mut w.status, Status::Lost(String::new()))
        else {
            return w;
        };
        let Prepared {
            port, net, image, ..
        } = *prepared;
        let gang_addr = w.gang_addr.clone();
        let acked = w.acked;
        let kept_net = net.clone();
        let started = if spec.image.is_some() && image.is_none() {
            // Adopted without its image in the store: never the node's root instead.
            Err("the member's image is no longer held on this node".to_owned())
        } else {
            self.try_start(spec, image, Some((port, net)))
        };
        let mut started = match started {
            Ok(w) => {
                tracing::info!(id = spec.id, "gang member started");
                w
            }
            Err(message) => {
                tracing::warn!(id = spec.id, message, "gang member failed to start");
                if let Some(n) = &kept_net {
                    network::remove(n);
                }
                if let Some(dir) = &w.dir {
                    Self::forget_prepared(dir);
                }
                Workload::new(self.run_dir(&spec.id), Status::FailedToStart(message))
            }
        };
        started.gang_addr = gang_addr;
        started.acked = acked;
        started
    }

    /// A run folder with `prepared.json` and no `state.json`: a member prepared by an
    /// earlier run of the agent.
    pub(super) fn adopt_prepared(&self, dir: &Path) -> Option<Workload> {
        if dir.join("state.json").exists() {
            return None;
        }
        if !dir.join(PREPARED_FILE).exists() && dir.join("stopped").exists() {
            return Some(Workload::exited(
                Some(dir.to_owned()),
                "stopped before it started",
            ));
        }
        let bytes = fs::read(dir.join(PREPARED_FILE)).ok()?;
        let state: PreparedState = match serde_json::from_slice(&bytes) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "unreadable prepared.json");
                return None;
            }
        };
        let devices = match &state.spec.share {
            Some(share) => share_devices(&state.spec, share).unwrap_or_default(),
            None => state.spec.devices.clone(),
        };
        let addr = self.gang_addr(state.net.as_ref());
        let mut w = Workload::new(
            Some(dir.to_owned()),
            Status::Prepared(Box::new(Prepared {
                port: state.port,
                net: state.net,
                image: None,
                image_digest: state.image_digest,
            })),
        );
        w.port = state.port;
        w.devices = devices;
        w.gang_addr = Some(addr);
        tracing::info!(dir = %dir.display(), "adopted a prepared gang member");
        Some(w)
    }

    /// After a launch: the run folder no longer holds a prepared member.
    pub(super) fn forget_prepared(run: &Path) {
        let _ = fs::remove_file(run.join(PREPARED_FILE));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn gang(rank: u32, launcher: GangLauncher) -> GangSpec {
        GangSpec {
            job: "job-1".into(),
            rank,
            size: 3,
            launcher,
            secret: "s3cret".into(),
            rsh_port: 2222,
            peers: Some(vec![
                GangPeer {
                    rank: 2,
                    addr: "10.215.0.2".into(),
                    via: "192.0.2.30".into(),
                    slots: 4,
                },
                GangPeer {
                    rank: 0,
                    addr: "10.213.0.2".into(),
                    via: "192.0.2.10".into(),
                    slots: 8,
                },
                GangPeer {
                    rank: 1,
                    addr: "10.214.0.2".into(),
                    via: "192.0.2.20".into(),
                    slots: 8,
                },
            ]),
        }
    }

    #[test]
    fn the_hostfile_lists_every_member_by_rank() {
        let g = gang(0, GangLauncher::Each);
        assert_eq!(
            hostfile_text(g.peers.as_ref().unwrap()),
            "10.213.0.2 slots=8\n10.214.0.2 slots=8\n10.215.0.2 slots=4\n"
        );
    }

    #[test]
    fn peers_must_be_the_whole_gang_with_this_member_at_its_address() {
        let g = gang(1, GangLauncher::Each);
        assert_eq!(check_peers(&g, "10.214.0.2").unwrap().len(), 3);
        let e = check_peers(&g, "10.214.0.6").unwrap_err();
        assert!(e.contains("10.214.0.6") && e.contains("rank 1"), "{e}");
        let mut short = g.clone();
        short.peers.as_mut().unwrap().pop();
        assert!(check_peers(&short, "10.214.0.2").is_err());
        let mut twice = g.clone();
        twice.peers.as_mut().unwrap()[0].rank = 0;
        assert!(check_peers(&twice, "10.214.0.2").is_err());
        let none = GangSpec { peers: None, ..g };
        assert!(check_peers(&none, "10.214.0.2").is_err());
    }

    #[test]
    fn remote_peers_are_routed_through_their_node_and_local_ones_not() {
        let g = gang(0, GangLauncher::Each);
        let mut peers = g.peers.clone().unwrap();
        // Rank 2 on this node (its node address is this node's host).
        peers[0].via = "192.0.2.10".into();
        let net = network_peers(&g, &peers, "192.0.2.10").unwrap();
        assert_eq!(
            net,
            [
                Peer {
                    addr: "10.215.0.2".parse().unwrap(),
                    via: None
                },
                Peer {
                    addr: "10.214.0.2".parse().unwrap(),
                    via: Some("192.0.2.20".parse().unwrap())
                },
            ]
        );
        // A loopback node address is this node.
        peers[2].via = "127.0.0.1".into();
        assert_eq!(
            network_peers(&g, &peers, "192.0.2.10").unwrap()[1].via,
            None
        );
        peers[2].addr = "node-b.example".into();
        assert!(network_peers(&g, &peers, "192.0.2.10").is_err());
    }

    #[test]
    fn with_rank0_only_rank0_runs_the_command() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path();
        for (rank, addr) in [(0, "10.213.0.2"), (1, "10.214.0.2")] {
            let g = gang(rank, GangLauncher::Rank0);
            let l = Launch::new(&g, addr, run, true).unwrap();
            assert_eq!(l.argv().is_some(), rank > 0);
            let each = Launch::new(&gang(rank, GangLauncher::Each), addr, run, true).unwrap();
            assert!(each.argv().is_none());
        }
        let l = Launch::new(&gang(1, GangLauncher::Rank0), "10.214.0.2", run, true).unwrap();
        assert_eq!(l.argv().unwrap(), [RSH_MOUNT, "serve"]);
        let env: Vec<(String, String)> = gang_env(&l.spec, &l.hostfile, &l.rsh)
            .into_iter()
            .map(|(k, v)| (k.into_string().unwrap(), v.into_string().unwrap()))
            .collect();
        assert_eq!(
            env,
            [
                ("TESSERA_HOSTFILE", "/run/tessera/hostfile"),
                ("TESSERA_GANG_SECRET", "s3cret"),
                ("TESSERA_GANG_RSH_PORT", "2222"),
                ("OMPI_MCA_plm_rsh_agent", "/opt/tessera/bin/tessera-rsh"),
                ("OMPI_MCA_plm_rsh_no_tree_spawn", "1"),
                ("OMPI_MCA_orte_leave_session_attached", "1"),
                ("OMPI_MCA_btl_vader_single_copy_mechanism", "none"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
        // In the sandbox: the host name `rank-1`, the hosts file in the run folder
        // (never the control folder the workload can write).
        assert_eq!(l.names(run).hostname, "rank-1");
        assert_eq!(l.names(run).hosts, run.join(HOSTS));
        l.write_files(run, true, Path::new("/bin/true")).unwrap();
        assert_eq!(
            fs::read_to_string(run.join(HOSTS)).unwrap(),
            "127.0.0.1 localhost\n::1 localhost\n10.213.0.2 rank-0\n10.214.0.2 rank-1\n10.215.0.2 rank-2\n"
        );
        assert!(!run.join("ctl").join(HOSTS).exists());
        assert_eq!(
            fs::metadata(run.join(HOSTS)).unwrap().permissions().mode() & 0o777,
            0o644
        );
        // Without the sandbox: the run folder's files.
        let bare = Launch::new(&gang(1, GangLauncher::Rank0), "10.214.0.2", run, false).unwrap();
        assert_eq!(bare.rsh, run.join("tessera-rsh"));
        bare.write_files(run, false, Path::new("/bin/true"))
            .unwrap();
        assert_eq!(
            fs::read_link(run.join("tessera-rsh")).unwrap(),
            Path::new("/bin/true")
        );
        assert!(
            fs::read_to_string(run.join(HOSTFILE))
                .unwrap()
                .starts_with("10.213.0.2 slots=8\n")
        );
    }
}
