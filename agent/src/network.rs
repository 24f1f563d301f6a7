//! A network of its own for every sandboxed workload.
//!
//! Each workload gets a network namespace (`/run/netns/tsr-N`) with its own loopback and
//! one end of a veth pair (`eth0`); the other end (`tsrN`) stays in the agent's namespace.
//! Slot `N` is the `N`-th /30 of the node's range (`--sandbox-net`, default
//! [`DEFAULT_RANGE`]): the node's end is its first address, the workload's the second,
//! and the node routes and masquerades its traffic. Made with the kernel's own tools:
//! `ip` (iproute2) for the namespace, the link and the addresses, `nft` (nftables) for
//! the policy, one table per workload (`inet tsr-N`), so that workloads (and agents
//! sharing a host in tests) never edit each other's rules and a workload's rules go with
//! one `nft delete table`.
//!
//! The policy, in the workload's table ([`ruleset`]):
//! - from the workload, refused (ICMP administratively prohibited, so a program fails at
//!   once with "No route to host"): every address of the node itself (the input hook:
//!   the agent, the portal, anything listening on the node, its end of the veth),
//!   loopback, link-local (`169.254.0.0/16`: a cloud's metadata service), multicast and
//!   broadcast, every workload of the node's range (other teams' notebooks), all of IPv6
//!   (workloads have no IPv6 route; `fd00:ec2::254` included), and the `blocked`
//!   addresses (the portal's, when it runs elsewhere); everything else (the internet)
//!   only when `internet` is on;
//! - to the workload: only its notebook's port, from the node itself (the agent's probe,
//!   a portal on the node) or, through a DNAT of the node's own addresses, from the
//!   `proxies` (the portal's host); and replies to its own connections.
//!
//! A gang member (issue 42, [`open_to_peers`]) also exchanges anything with its gang's
//! other members, and only with them: out to their addresses (even without the
//! internet) and in, new connections, from them, never masqueraded (they see each
//! other's own addresses, which MPI and gloo advertise); nothing from the member leaves
//! with another source address than its own; for each peer on another node, a host route
//! to its address through that node (`ip route replace A/32 via NODE`), removed with the
//! slot. A peer inside this node's own range (nodes with overlapping `--sandbox-net`)
//! could not be routed: the member does not start.
//!
//! The slot is claimed by creating its namespace (`ip netns add` fails on an existing
//! name), so agents sharing a host never take the same one. Every failure undoes what was
//! made, and the workload does not start: it never falls back to the node's network.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

/// Where `ip netns` keeps named namespaces.
pub const NETNS_DIR: &str = "/run/netns";
/// The node's workload range unless set.
pub const DEFAULT_RANGE: &str = "10.213.0.0/16";

/// How the node's workloads are networked. See the module docs.
#[derive(Debug, Clone)]
pub struct NetworkSettings {
    pub range: Ipv4Range,
    /// Whether workloads may reach addresses outside the node (the refused ones aside).
    pub internet: bool,
    /// Addresses that may open a notebook's port from outside the node (the portal).
    pub proxies: Vec<IpAddr>,
    /// Addresses outside the node workloads may never reach (the portal's).
    pub blocked: Vec<SocketAddr>,
}

impl NetworkSettings {
    pub fn new() -> NetworkSettings {
        NetworkSettings {
            range: Ipv4Range::parse(DEFAULT_RANGE).unwrap_or(Ipv4Range {
                base: Ipv4Addr::new(10, 213, 0, 0),
                prefix: 16,
            }),
            internet: true,
            proxies: Vec::new(),
            blocked: Vec::new(),
        }
    }
}

impl Default for NetworkSettings {
    fn default() -> Self {
        NetworkSettings::new()
    }
}

/// An IPv4 range `a.b.c.d/p` cut into /30 slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Range {
    pub base: Ipv4Addr,
    pub prefix: u8,
}

impl Ipv4Range {
    /// `10.213.0.0/16`: a prefix from 8 to 29 and no host bits set.
    pub fn parse(s: &str) -> Result<Ipv4Range, String> {
        let bad = || format!("`{s}` is not an IPv4 range such as {DEFAULT_RANGE}");
        let (addr, prefix) = s.trim().split_once('/').ok_or_else(bad)?;
        let base: Ipv4Addr = addr.parse().map_err(|_| bad())?;
        let prefix: u8 = prefix.parse().map_err(|_| bad())?;
        if !(8..=29).contains(&prefix) {
            return Err(format!("{s}: the prefix must be from /8 to /29"));
        }
        if u32::from(base) & (u32::MAX >> prefix) != 0 {
            return Err(format!("{s}: the address has bits beyond the prefix"));
        }
        Ok(Ipv4Range { base, prefix })
    }

    /// How many workloads it holds (a /30 each).
    pub fn slots(self) -> u32 {
        1 << (30 - u32::from(self.prefix))
    }

    /// Slot `n`: the node's end and the workload's address.
    pub fn slot(self, n: u32) -> Slot {
        let net = u32::from(self.base) + 4 * n;
        Slot {
            n,
            gateway: Ipv4Addr::from(net + 1),
            addr: Ipv4Addr::from(net + 2),
            routes: Vec::new(),
        }
    }

    /// Whether `a` lies inside the range.
    pub fn contains(self, a: Ipv4Addr) -> bool {
        let mask = u32::MAX << (32 - u32::from(self.prefix));
        u32::from(a) & mask == u32::from(self.base)
    }
}

impl std::fmt::Display for Ipv4Range {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.base, self.prefix)
    }
}

/// One workload's network, kept in its run's state so a restarted agent removes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slot {
    pub n: u32,
    /// The node's end of the veth pair.
    pub gateway: Ipv4Addr,
    /// The workload's address (its `eth0`).
    pub addr: Ipv4Addr,
    /// Gang members: the node's routes to peers on other nodes, removed with the slot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<PeerRoute>,
}

/// A host route on the node to a gang peer on another node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerRoute {
    /// The peer's own address.
    pub addr: Ipv4Addr,
    /// Its node's address.
    pub via: Ipv4Addr,
}

/// A gang member's peer as its network sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub addr: Ipv4Addr,
    /// Its node's address when it is on another node (a route goes there); `None` for
    /// a peer on this node (the node routes to it already).
    pub via: Option<Ipv4Addr>,
}

impl Slot {
    /// The namespace's name (`ip netns`) and the nftables table's.
    pub fn name(&self) -> String {
        format!("tsr-{}", self.n)
    }

    /// The namespace's file, for the runtime to join.
    pub fn netns_path(&self) -> PathBuf {
        Path::new(NETNS_DIR).join(self.name())
    }

    /// The node's end of the veth pair.
    pub fn ifname(&self) -> String {
        format!("tsr{}", self.n)
    }
}

/// Checks that `ip` and `nft` work here, and turns on IPv4 forwarding (workloads reach
/// the internet and are reached by the proxy through the node), as container engines do.
pub fn prepare(settings: &NetworkSettings) -> Result<(), String> {
    for (tool, arg, package) in [("ip", "-V", "iproute2"), ("nft", "--version", "nftables")] {
        let ok = Command::new(tool)
            .arg(arg)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return Err(format!(
                "the workload network needs `{tool}` (`apt-get install {package}`), or \
                 --sandbox-network off to run workloads on the node's network"
            ));
        }
    }
    run("nft", &["list", "tables"], None)
        .map_err(|e| format!("nftables does not work here ({e}); the workload network needs it"))?;
    if settings.internet || !remote_proxies(settings).is_empty() {
        let path = "/proc/sys/net/ipv4/ip_forward";
        if std::fs::read_to_string(path).map_or(true, |v| v.trim() != "1") {
            std::fs::write(path, "1").map_err(|e| {
                format!(
                    "cannot turn on IPv4 forwarding ({path}: {e}), which workloads need to \
                         reach the internet and a portal elsewhere to reach notebooks: set \
                         `net.ipv4.ip_forward = 1` in /etc/sysctl.d/ (a systemd unit with \
                         ProtectKernelTunables= cannot), or --sandbox-internet off with the \
                         portal on this node"
                )
            })?;
            tracing::info!("turned on IPv4 forwarding for the workloads' networks");
        }
    }
    Ok(())
}

/// Claims a free slot and makes its namespace, veth pair, addresses, routes and rules,
/// with `port` (a notebook's) open to the node and the proxies. Undoes it all on failure.
pub fn create(settings: &NetworkSettings, port: Option<u16>) -> Result<Slot, String> {
    let slot = claim(settings.range)?;
    let made = (|| {
        let (ifname, ns) = (slot.ifname(), slot.name());
        run(
            "ip",
            &["-batch", "-"],
            Some(&format!(
                "link add {ifname} type veth peer name eth0 netns {ns}\n\
                 addr add {gw}/30 dev {ifname}\n\
                 link set {ifname} up\n",
                gw = slot.gateway
            )),
        )?;
        run(
            "ip",
            &["-n", &ns, "-batch", "-"],
            Some(&format!(
                "link set lo up\n\
                 addr add {addr}/30 dev eth0\n\
                 link set eth0 up\n\
                 route add default via {gw}\n",
                addr = slot.addr,
                gw = slot.gateway
            )),
        )?;
        run("nft", &["-f", "-"], Some(&ruleset(settings, &slot, port)))
    })();
    match made {
        Ok(()) => Ok(slot),
        Err(e) => {
            remove(&slot);
            Err(format!("cannot make the workload's network: {e}"))
        }
    }
}

/// Opens a gang member's network to its `peers` (the others of its gang; see the module
/// docs): replaces its table in one `nft -f` and adds the routes to peers on other
/// nodes (recorded in `slot.routes`, so [`remove`] takes them away). Refuses a peer
/// address inside this node's range, or one no workload can have (loopback,
/// link-local, multicast, …). On failure, the caller removes the slot.
pub fn open_to_peers(
    settings: &NetworkSettings,
    slot: &mut Slot,
    port: Option<u16>,
    peers: &[Peer],
) -> Result<(), String> {
    check_peers(settings, slot, peers)?;
    let addrs: Vec<Ipv4Addr> = peers.iter().map(|p| p.addr).collect();
    let name = slot.name();
    let script = format!(
        "table inet {name} {{}}\ndelete table inet {name}\n{}",
        gang_ruleset(settings, slot, port, &addrs)
    );
    run("nft", &["-f", "-"], Some(&script))
        .map_err(|e| format!("cannot open the gang member's network to its peers: {e}"))?;
    let path = "/proc/sys/net/ipv4/ip_forward";
    if peers.iter().any(|p| p.addr != slot.addr)
        && std::fs::read_to_string(path).map_or(true, |v| v.trim() != "1")
    {
        std::fs::write(path, "1").map_err(|e| {
            format!(
                "cannot turn on IPv4 forwarding ({path}: {e}), which gang members need \
                 to reach each other: set `net.ipv4.ip_forward = 1` \
                 in /etc/sysctl.d/"
            )
        })?;
    }
    for p in peers {
        let Some(via) = p.via else { continue };
        run(
            "ip",
            &[
                "route",
                "replace",
                &format!("{}/32", p.addr),
                "via",
                &via.to_string(),
            ],
            None,
        )
        .map_err(|e| format!("cannot route to gang peer {} through {via}: {e}", p.addr))?;
        slot.routes.push(PeerRoute { addr: p.addr, via });
    }
    Ok(())
}

/// The message when a peer's address lies in this node's own range.
pub fn overlapping_range(addr: Ipv4Addr, range: Ipv4Range) -> String {
    format!(
        "gang peer address {addr} lies inside this node's workload range {range}: the nodes \
         of a gang need distinct --sandbox-net ranges (set a different one on each node)"
    )
}

/// Peers must be routable addresses outside this node's range (its own address aside).
pub fn check_peers(settings: &NetworkSettings, slot: &Slot, peers: &[Peer]) -> Result<(), String> {
    for p in peers.iter().filter(|p| p.addr != slot.addr) {
        let a = p.addr;
        if a.is_loopback()
            || a.is_link_local()
            || a.is_multicast()
            || a.is_broadcast()
            || a.is_unspecified()
            || a.octets()[0] == 0
        {
            return Err(format!("gang peer address {a} is not a workload address"));
        }
        if settings.range.contains(a) {
            return Err(overlapping_range(a, settings.range));
        }
    }
    Ok(())
}

/// Removes a gang member's routes to its peers (gone already: skipped).
pub fn remove_routes(slot: &Slot) {
    for r in &slot.routes {
        let _ = run(
            "ip",
            &[
                "route",
                "del",
                &format!("{}/32", r.addr),
                "via",
                &r.via.to_string(),
            ],
            None,
        );
    }
}

/// Removes a workload's rules, veth pair and namespace (and a gang member's routes);
/// what is already gone is skipped.
pub fn remove(slot: &Slot) {
    remove_routes(slot);
    let _ = run("nft", &["delete", "table", "inet", &slot.name()], None);
    // `-force`: on past a link already gone.
    let batch = format!("link del {}\nnetns del {}\n", slot.ifname(), slot.name());
    if let Err(e) = run("ip", &["-force", "-batch", "-"], Some(&batch))
        && slot.netns_path().exists()
    {
        tracing::warn!(
            netns = slot.name(),
            error = e,
            "cannot remove a workload's network"
        );
    }
}

/// The first slot whose namespace this call could create.
fn claim(range: Ipv4Range) -> Result<Slot, String> {
    for n in 0..range.slots() {
        let slot = range.slot(n);
        if slot.netns_path().exists() {
            continue;
        }
        match run("ip", &["netns", "add", &slot.name()], None) {
            Ok(()) => return Ok(slot),
            // Taken meanwhile (another agent on this host).
            Err(_) if slot.netns_path().exists() => continue,
            Err(e) => return Err(format!("cannot make a network namespace: {e}")),
        }
    }
    Err(format!(
        "the workload network {range} is full ({} workloads); widen --sandbox-net",
        range.slots()
    ))
}

/// Runs `tool args`, with `stdin` fed in when given; the error is what it said.
fn run(tool: &str, args: &[&str], stdin: Option<&str>) -> Result<(), String> {
    let mut child = Command::new(tool)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run `{tool}`: {e}"))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())
            .map_err(|e| format!("`{tool}`: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("`{tool}`: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&out.stderr);
    Err(format!(
        "`{tool} {}` failed: {}",
        args.join(" "),
        said.trim()
    ))
}

/// The proxies that reach notebooks from outside the node: IPv4 (workloads have no
/// IPv6) and not loopback (the node itself reaches them anyway).
fn remote_proxies(settings: &NetworkSettings) -> Vec<String> {
    settings
        .proxies
        .iter()
        .filter_map(|p| match p {
            IpAddr::V4(v4) if !v4.is_loopback() => Some(v4.to_string()),
            _ => None,
        })
        .collect()
}

/// The nftables table of one workload (see the module docs).
pub fn ruleset(settings: &NetworkSettings, slot: &Slot, port: Option<u16>) -> String {
    table(settings, slot, port, None)
}

/// The nftables table of a gang member whose gang's other members are at `peers`.
pub fn gang_ruleset(
    settings: &NetworkSettings,
    slot: &Slot,
    port: Option<u16>,
    peers: &[Ipv4Addr],
) -> String {
    table(settings, slot, port, Some(peers))
}

/// [`ruleset`], and with `gang`, a gang member's: anti-spoofing, and its peers' addresses
/// open both ways, unmasqueraded.
fn table(
    settings: &NetworkSettings,
    slot: &Slot,
    port: Option<u16>,
    gang: Option<&[Ipv4Addr]>,
) -> String {
    let i = slot.ifname();
    let refuse = "reject with icmpx type admin-prohibited";
    let peers: Vec<String> = gang
        .unwrap_or_default()
        .iter()
        .filter(|a| **a != slot.addr)
        .map(Ipv4Addr::to_string)
        .collect();
    let peers = (!peers.is_empty()).then(|| peers.join(", "));
    let mut t = String::new();
    let _ = writeln!(t, "table inet {} {{", slot.name());
    let _ = writeln!(
        t,
        "  chain input {{\n    type filter hook input priority filter - 10; policy accept;\n    \
         iifname \"{i}\" ct state established,related accept\n    iifname \"{i}\" {refuse}\n  }}"
    );
    let _ = writeln!(
        t,
        "  chain forward {{\n    type filter hook forward priority filter - 10; policy accept;"
    );
    if gang.is_some() {
        // Nothing leaves it with another address than its own.
        let _ = writeln!(t, "    iifname \"{i}\" ip saddr != {} drop", slot.addr);
    }
    let _ = writeln!(
        t,
        "    iifname \"{i}\" ct state established,related accept\n    \
         iifname \"{i}\" meta nfproto ipv6 {refuse}\n    \
         iifname \"{i}\" ip daddr {{ 0.0.0.0/8, 127.0.0.0/8, 169.254.0.0/16, 224.0.0.0/3, {range} }} {refuse}",
        range = settings.range
    );
    for b in &settings.blocked {
        if let SocketAddr::V4(b) = b {
            let _ = writeln!(
                t,
                "    iifname \"{i}\" ip daddr {} tcp dport {} {refuse}",
                b.ip(),
                b.port()
            );
        }
    }
    if let Some(p) = &peers {
        let _ = writeln!(t, "    iifname \"{i}\" ip daddr {{ {p} }} accept");
    }
    let _ = writeln!(
        t,
        "    iifname \"{i}\" {}",
        if settings.internet { "accept" } else { refuse }
    );
    let _ = writeln!(t, "    oifname \"{i}\" ct state established,related accept");
    if let Some(p) = &peers {
        let _ = writeln!(t, "    oifname \"{i}\" ip saddr {{ {p} }} accept");
    }
    let proxies = remote_proxies(settings);
    if let (Some(p), false) = (port, proxies.is_empty()) {
        let _ = writeln!(
            t,
            "    oifname \"{i}\" ip saddr {{ {} }} tcp dport {p} ct status dnat accept",
            proxies.join(", ")
        );
    }
    let _ = writeln!(t, "    oifname \"{i}\" drop\n  }}");
    let _ = writeln!(
        t,
        "  chain output {{\n    type filter hook output priority filter - 10; policy accept;\n    \
         oifname \"{i}\" ct state established,related accept"
    );
    if let Some(p) = port {
        let _ = writeln!(t, "    oifname \"{i}\" tcp dport {p} accept");
    }
    let _ = writeln!(t, "    oifname \"{i}\" drop\n  }}");
    if let (Some(p), false) = (port, proxies.is_empty()) {
        let _ = writeln!(
            t,
            "  chain prerouting {{\n    type nat hook prerouting priority dstnat; policy accept;\n    \
             fib daddr type local ip saddr {{ {} }} tcp dport {p} dnat ip to {}:{p}\n  }}",
            proxies.join(", "),
            slot.addr
        );
    }
    let _ = writeln!(
        t,
        "  chain postrouting {{\n    type nat hook postrouting priority srcnat; policy accept;"
    );
    if let Some(p) = &peers {
        // Peers see its own address.
        let _ = writeln!(t, "    ip saddr {} ip daddr {{ {p} }} accept", slot.addr);
    }
    let _ = writeln!(
        t,
        "    ip saddr {} oifname != \"{i}\" masquerade\n  }}",
        slot.addr
    );
    t.push_str("}\n");
    t
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_cut_into_slots() {
        let r = Ipv4Range::parse("10.213.0.0/16").unwrap();
        assert_eq!(r.slots(), 16_384);
        let s = r.slot(0);
        assert_eq!(
            (s.gateway, s.addr),
            ("10.213.0.1".parse().unwrap(), "10.213.0.2".parse().unwrap())
        );
        let s = r.slot(16_383);
        assert_eq!(s.addr, "10.213.255.254".parse::<Ipv4Addr>().unwrap());
        assert_eq!(
            (s.name(), s.ifname()),
            ("tsr-16383".to_owned(), "tsr16383".to_owned())
        );
        assert!(s.ifname().len() <= 15, "Linux interface names");
        assert_eq!(s.netns_path(), Path::new("/run/netns/tsr-16383"));
        assert_eq!(Ipv4Range::parse("192.168.7.0/29").unwrap().slots(), 2);
        for bad in [
            "10.213.0.1/16",
            "10.213.0.0",
            "10.213.0.0/30",
            "10.0.0.0/7",
            "x/16",
            "::1/64",
        ] {
            assert!(Ipv4Range::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_rules_refuse_the_node_its_neighbours_and_metadata_and_open_one_port() {
        let mut s = NetworkSettings::new();
        s.proxies = vec!["192.0.2.7".parse().unwrap(), "127.0.0.1".parse().unwrap()];
        s.blocked = vec!["192.0.2.7:8443".parse().unwrap()];
        let slot = s.range.slot(3);
        let t = ruleset(&s, &slot, Some(40_001));
        assert!(t.starts_with("table inet tsr-3 {"));
        // Everything the workload sends to the node itself.
        assert!(t.contains("hook input priority filter - 10; policy accept;\n    iifname \"tsr3\" ct state established,related accept\n    iifname \"tsr3\" reject"));
        assert!(t.contains(
            "ip daddr { 0.0.0.0/8, 127.0.0.0/8, 169.254.0.0/16, 224.0.0.0/3, 10.213.0.0/16 } reject"
        ));
        assert!(t.contains("iifname \"tsr3\" meta nfproto ipv6 reject"));
        assert!(t.contains("ip daddr 192.0.2.7 tcp dport 8443 reject"));
        assert!(t.contains("    iifname \"tsr3\" accept\n"));
        // In: the port, from the node and (DNAT) from the proxy; loopback is the node's.
        assert!(t.contains("oifname \"tsr3\" tcp dport 40001 accept"));
        assert!(t.contains("ip saddr { 192.0.2.7 } tcp dport 40001 ct status dnat accept"));
        assert!(t.contains("fib daddr type local ip saddr { 192.0.2.7 } tcp dport 40001 dnat ip to 10.213.0.14:40001"));
        assert!(t.contains("ip saddr 10.213.0.14 oifname != \"tsr3\" masquerade"));
        // The refusals come before the acceptance.
        assert!(
            t.find("10.213.0.0/16 } reject").unwrap() < t.find("iifname \"tsr3\" accept").unwrap()
        );

        // No internet, no port, no proxy: out only to nothing, in only replies.
        s.internet = false;
        s.proxies.clear();
        let t = ruleset(&s, &slot, None);
        assert!(
            t.contains("    iifname \"tsr3\" reject with icmpx type admin-prohibited\n    oifname")
        );
        assert!(!t.contains("dport 40001") && !t.contains("prerouting"));
    }

    #[test]
    fn a_gang_member_exchanges_with_its_peers_only_unmasqueraded_and_unspoofed() {
        let mut s = NetworkSettings::new();
        s.internet = false;
        let slot = s.range.slot(3);
        let peers: Vec<Ipv4Addr> = vec![
            slot.addr,
            "10.214.0.6".parse().unwrap(),
            "10.215.0.2".parse().unwrap(),
        ];
        let t = gang_ruleset(&s, &slot, None, &peers);
        // Anti-spoofing first, before anything accepts.
        let spoof = t
            .find("iifname \"tsr3\" ip saddr != 10.213.0.14 drop")
            .unwrap();
        let forward = t.find("chain forward").unwrap();
        assert!(forward < spoof);
        assert!(spoof < forward + t[forward..].find("ct state established").unwrap());
        // Out to the peers (not itself), even with the internet off, after the refusals.
        let out = t
            .find("iifname \"tsr3\" ip daddr { 10.214.0.6, 10.215.0.2 } accept")
            .unwrap();
        assert!(t.find("10.213.0.0/16 } reject").unwrap() < out);
        let no_internet =
            "    iifname \"tsr3\" reject with icmpx type admin-prohibited\n    oifname";
        assert!(out < t.find(no_internet).unwrap());
        // In: new connections from the peers only, before the final drop.
        let inbound = t
            .find("oifname \"tsr3\" ip saddr { 10.214.0.6, 10.215.0.2 } accept")
            .unwrap();
        assert!(
            inbound
                < t.find("    oifname \"tsr3\" drop\n  }\n  chain output")
                    .unwrap()
        );
        // Not masqueraded towards them; masqueraded elsewhere.
        let keep = t
            .find("ip saddr 10.213.0.14 ip daddr { 10.214.0.6, 10.215.0.2 } accept")
            .unwrap();
        assert!(
            keep < t
                .find("ip saddr 10.213.0.14 oifname != \"tsr3\" masquerade")
                .unwrap()
        );
        assert_eq!(t.matches("10.213.0.14,").count(), 0, "not a peer of itself");

        // A gang of one: anti-spoofing, no peer rules. A plain workload: neither.
        let alone = gang_ruleset(&s, &slot, None, &[slot.addr]);
        assert!(alone.contains("ip saddr != 10.213.0.14 drop"));
        assert!(!alone.contains("ip daddr {  }") && !alone.contains("ip saddr { "));
        let plain = ruleset(&s, &slot, None);
        assert!(!plain.contains("saddr !=") && !plain.contains("10.214.0.6"));
        // The plain table is the gang table without the gang's lines.
        let gang_lines: Vec<&str> = t
            .lines()
            .filter(|l| l.contains("10.214.0.6") || l.contains("saddr !="))
            .collect();
        let stripped: String = t
            .lines()
            .filter(|l| !gang_lines.contains(l))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(stripped, plain);
    }

    #[test]
    fn peers_in_the_nodes_own_range_or_unroutable_are_refused() {
        let s = NetworkSettings::new();
        let slot = s.range.slot(0);
        let peer = |a: &str| Peer {
            addr: a.parse().unwrap(),
            via: Some("192.0.2.20".parse().unwrap()),
        };
        assert!(check_peers(&s, &slot, &[peer("10.213.0.2"), peer("10.214.0.2")]).is_ok());
        let e = check_peers(&s, &slot, &[peer("10.213.0.6")]).unwrap_err();
        assert!(
            e.contains("10.213.0.6") && e.contains("10.213.0.0/16"),
            "{e}"
        );
        assert!(e.contains("distinct --sandbox-net ranges"), "{e}");
        for bad in [
            "127.0.0.1",
            "169.254.169.254",
            "224.0.0.1",
            "0.0.0.0",
            "255.255.255.255",
        ] {
            assert!(check_peers(&s, &slot, &[peer(bad)]).is_err(), "{bad}");
        }
        let r = Ipv4Range::parse("10.214.0.0/16").unwrap();
        assert!(r.contains("10.214.255.254".parse().unwrap()));
        assert!(!r.contains("10.215.0.1".parse().unwrap()));
        assert!(!r.contains("10.213.0.1".parse().unwrap()));
    }

    #[test]
    fn a_slot_without_routes_reads_as_before() {
        let slot: Slot =
            serde_json::from_str(r#"{"n":2,"gateway":"10.213.0.9","addr":"10.213.0.10"}"#).unwrap();
        assert!(slot.routes.is_empty());
        assert!(!serde_json::to_string(&slot).unwrap().contains("routes"));
    }
}
