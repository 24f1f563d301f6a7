//! The planner's working state and the greedy, one-request-at-a-time
//! placement (docs/planner.md explains the choices and their cost).

use std::collections::BTreeMap;
use std::ops::Range;

use super::fractional::{NodeView, Policy, ShareAsk, Workload};
use super::input::{
    Ask, Cluster, DriverInfo, Gang, Gpu, GpuMode, InputError, MigInstance, Node, Request,
};
use crate::image::CudaVersion;
use crate::mig::{Catalog, GpuModel, MAX_PROFILES, Occupancy, ProfileIdx, Slot};

/// Cost key of "cannot place here".
const NONE: u32 = u32::MAX;
/// Cost levels, most preferred first (bits 24.. of a cost key).
const USE_IDLE: u32 = 0;
const CREATE: u32 = 1;
const REPARTITION: u32 = 2;
const MODE_CHANGE: u32 = 3;

// Gang placement (all-or-nothing, group-local first) needs the engine's internals.
#[path = "gang.rs"]
mod gang;
pub use gang::GangPlacement;

#[derive(Debug, Clone, PartialEq, Eq)]
struct ModelEntry {
    name: String,
    mig: Option<GpuModel>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct NodeState {
    name: String,
    cpu_cap: u64,
    mem_cap: u64,
    cpu_free: u64,
    mem_free: u64,
    gpus: Range<usize>,
    driver: Option<DriverInfo>,
    group: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct GpuState {
    node: usize,
    index: u32,
    model: u16,
    reconfigurable: bool,
    mode: GpuMode,
    busy: bool,
    used_milli: u32,
    /// Instances sorted by slot, with their busy flag.
    slots: Vec<(Slot, bool)>,
    occ: Occupancy,
}

impl GpuState {
    fn idle(&self) -> bool {
        match self.mode {
            GpuMode::Whole => !self.busy,
            GpuMode::Shared => self.used_milli == 0,
            GpuMode::Mig => self.slots.iter().all(|(_, busy)| !busy),
        }
    }
}

/// How a GPU was converted for a decision, so it can be undone.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Conversion {
    from_mode: GpuMode,
    destroyed: Vec<Slot>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Placed {
    Cpu,
    Mig {
        gpu: usize,
        slot: Slot,
        created: bool,
        destroyed: Vec<Slot>,
        conversion: Option<Conversion>,
    },
    Whole {
        gpus: Vec<(usize, Option<Conversion>)>,
    },
    Share {
        gpu: usize,
        milli: u32,
        conversion: Option<Conversion>,
    },
}

/// One placed request; hand it back to [`Engine::release`] to undo it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    node: usize,
    cpu: u64,
    mem: u64,
    placed: Placed,
}

/// Why a request was not placed; [`Engine::reason`] turns it into words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unplaced {
    /// Some GPU had room, but its node lacked CPU or memory.
    node_limited: bool,
    /// Some GPU had room, but its node's driver is older than the request needs (or
    /// unknown).
    driver_limited: bool,
}

impl Unplaced {
    fn none() -> Self {
        Unplaced {
            node_limited: false,
            driver_limited: false,
        }
    }
}

/// The cluster as the planner sees it while placing requests.
#[derive(Debug, Clone)]
pub struct Engine {
    catalog: Catalog,
    models: Vec<ModelEntry>,
    nodes: Vec<NodeState>,
    gpus: Vec<GpuState>,
    gpu_model: Vec<u16>,
    /// Per GPU and profile of its model: the cost key of the best way to
    /// place one instance (lower is better), refreshed on every change.
    costs: Vec<[u32; MAX_PROFILES]>,
    policy: Policy,
    /// [`Cluster::fixed_sharing`]: no GPU is converted to shared mode.
    fixed_sharing: bool,
    /// Per node: closed to placements while a gang is tried (all false otherwise).
    closed: Vec<bool>,
}

/// A request, checked and resolved against the engine's models.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    ask: Ask,
    cpu: u64,
    mem: u64,
    allowed: Vec<bool>,
    /// For MIG asks: the profile in each model (None: not offered/allowed).
    profile: Vec<Option<ProfileIdx>>,
    /// For MIG asks: the largest share of a GPU the profile is worth.
    mig_milli: u32,
    /// The CUDA version the node's driver must support.
    needs_cuda: Option<CudaVersion>,
    /// Members of a gang request (its ask is per member).
    gang: Option<Gang>,
}

impl Resolved {
    pub(crate) fn ask(&self) -> &Ask {
        &self.ask
    }
    pub(crate) fn cpu(&self) -> u64 {
        self.cpu
    }
    pub(crate) fn mem(&self) -> u64 {
        self.mem
    }
    /// Bit `i` set when model `i` is allowed (models beyond 63: any).
    pub(crate) fn model_mask(&self) -> u64 {
        if self.allowed.len() > 64 {
            return u64::MAX;
        }
        self.allowed
            .iter()
            .enumerate()
            .filter(|(_, ok)| **ok)
            .fold(0, |m, (i, _)| m | 1 << i)
    }
    pub(crate) fn mig_milli(&self) -> u32 {
        self.mig_milli
    }
    pub(crate) fn gang(&self) -> Option<Gang> {
        self.gang
    }
    pub(crate) fn is_gang(&self) -> bool {
        self.gang.is_some()
    }
}

impl Engine {
    /// Checks the cluster against the catalog (plus the cluster's own
    /// tables) and builds the working state.
    pub fn new(cluster: &Cluster, catalog: &Catalog) -> Result<Self, InputError> {
        let mut catalog = catalog.clone();
        for m in &cluster.models {
            catalog.insert(m.clone());
        }
        let mut engine = Engine {
            catalog: Catalog::empty(),
            models: Vec::new(),
            nodes: Vec::new(),
            gpus: Vec::new(),
            gpu_model: Vec::new(),
            costs: Vec::new(),
            policy: Policy::Fragmentation(Workload::default()),
            fixed_sharing: cluster.fixed_sharing,
            closed: Vec::new(),
        };
        let mut names = BTreeMap::new();
        for (i, node) in cluster.nodes.iter().enumerate() {
            engine.add_node(i, node, &catalog, &mut names)?;
        }
        for g in 0..engine.gpus.len() {
            engine.refresh(g);
        }
        engine.closed = vec![false; engine.nodes.len()];
        engine.catalog = catalog;
        Ok(engine)
    }

    fn add_node(
        &mut self,
        i: usize,
        node: &Node,
        catalog: &Catalog,
        names: &mut BTreeMap<String, usize>,
    ) -> Result<(), InputError> {
        let at = format!("nodes[{i}]");
        if node.name.is_empty() {
            return Err(InputError::new(format!("{at}.name"), "must not be empty"));
        }
        if let Some(first) = names.insert(node.name.clone(), i) {
            return Err(InputError::new(
                format!("{at}.name"),
                format!("node {} already defined at nodes[{first}]", node.name),
            ));
        }
        if node.cpu_used_milli > node.cpu_milli {
            return Err(InputError::new(
                format!("{at}.cpu_used_milli"),
                "exceeds cpu_milli",
            ));
        }
        if node.memory_used_mib > node.memory_mib {
            return Err(InputError::new(
                format!("{at}.memory_used_mib"),
                "exceeds memory_mib",
            ));
        }
        let first = self.gpus.len();
        for (j, gpu) in node.gpus.iter().enumerate() {
            let at = format!("{at}.gpus[{j}]");
            if node.gpus[..j].iter().any(|o| o.index == gpu.index) {
                return Err(InputError::new(
                    format!("{at}.index"),
                    format!(
                        "GPU index {} appears twice on node {}",
                        gpu.index, node.name
                    ),
                ));
            }
            let state = self.gpu_state(self.nodes.len(), gpu, catalog, &at)?;
            self.gpu_model.push(state.model);
            self.gpus.push(state);
            self.costs.push([NONE; MAX_PROFILES]);
        }
        self.nodes.push(NodeState {
            name: node.name.clone(),
            cpu_cap: node.cpu_milli,
            mem_cap: node.memory_mib,
            cpu_free: node.cpu_milli - node.cpu_used_milli,
            mem_free: node.memory_mib - node.memory_used_mib,
            gpus: first..self.gpus.len(),
            driver: node.driver.clone(),
            group: node.group.clone(),
        });
        Ok(())
    }

    fn model_id(&mut self, name: &str, catalog: &Catalog) -> u16 {
        let (canonical, mig) = match catalog.get(name) {
            Some(m) => (m.name().to_owned(), Some(m.clone())),
            None => (name.to_owned(), None),
        };
        if let Some(i) = self.models.iter().position(|m| m.name == canonical) {
            return i as u16;
        }
        self.models.push(ModelEntry {
            name: canonical,
            mig,
        });
        (self.models.len() - 1) as u16
    }

    fn gpu_state(
        &mut self,
        node: usize,
        gpu: &Gpu,
        catalog: &Catalog,
        at: &str,
    ) -> Result<GpuState, InputError> {
        let model = self.model_id(&gpu.model, catalog);
        let mut state = GpuState {
            node,
            index: gpu.index,
            model,
            reconfigurable: gpu.reconfigurable,
            mode: gpu.mode,
            busy: gpu.busy,
            used_milli: gpu.used_milli,
            slots: Vec::new(),
            occ: Occupancy::default(),
        };
        if gpu.mode != GpuMode::Mig && !gpu.instances.is_empty() {
            return Err(InputError::new(
                format!("{at}.instances"),
                "only mig GPUs have instances",
            ));
        }
        if gpu.mode != GpuMode::Whole && gpu.busy {
            return Err(InputError::new(
                format!("{at}.busy"),
                "only whole GPUs take busy; mig instances carry their own",
            ));
        }
        if gpu.mode != GpuMode::Shared && gpu.used_milli != 0 {
            return Err(InputError::new(
                format!("{at}.used_milli"),
                "only shared GPUs take used_milli",
            ));
        }
        if gpu.used_milli > 1000 {
            return Err(InputError::new(
                format!("{at}.used_milli"),
                "must be 0..=1000",
            ));
        }
        if gpu.mode == GpuMode::Mig {
            let Some(table) = &self.models[usize::from(model)].mig else {
                return Err(InputError::new(
                    format!("{at}.model"),
                    format!("no MIG profile table for model {}", gpu.model),
                ));
            };
            let named: Vec<_> = gpu
                .instances
                .iter()
                .map(|i| crate::mig::Instance {
                    profile: i.profile.clone(),
                    start: i.start,
                })
                .collect();
            let slots = table.validate(&named).map_err(|e| {
                let k = match &e {
                    crate::mig::LayoutError::UnknownProfile { instance, .. }
                    | crate::mig::LayoutError::BadPlacement { instance, .. }
                    | crate::mig::LayoutError::Overlap { instance, .. }
                    | crate::mig::LayoutError::TooMany { instance, .. }
                    | crate::mig::LayoutError::ComputeExceeded { instance, .. } => *instance,
                };
                InputError::new(format!("{at}.instances[{k}]"), e.to_string())
            })?;
            for (slot, inst) in slots.iter().zip(&gpu.instances) {
                state.occ.add(table, *slot);
                state.slots.push((*slot, inst.busy));
            }
            state.slots.sort();
        }
        Ok(state)
    }

    /// Uses `policy` for time-sliced shares from now on.
    pub fn set_policy(&mut self, policy: Policy) {
        self.policy = policy;
    }

    pub(crate) fn resolve(
        &self,
        request: &Request,
        position: usize,
    ) -> Result<Resolved, InputError> {
        let ask = request.ask(position)?;
        if let Some(g) = &request.gang {
            gang::check(g, &ask, position)?;
        }
        let allowed: Vec<bool> = self
            .models
            .iter()
            .map(|m| {
                request.models.is_empty()
                    || request.models.iter().any(|r| {
                        r == &m.name
                            || m.mig.as_ref().is_some_and(|t| t.name() == r)
                            || self.catalog.get(r).is_some_and(|t| t.name() == m.name)
                    })
            })
            .collect();
        let profile = match &ask {
            Ask::Mig(name) => self
                .models
                .iter()
                .zip(&allowed)
                .map(|(m, ok)| {
                    if *ok {
                        m.mig
                            .as_ref()
                            .and_then(|t| t.profile_by_name(name))
                            .map(|(p, _)| p)
                    } else {
                        None
                    }
                })
                .collect(),
            _ => Vec::new(),
        };
        let mig_milli = profile
            .iter()
            .zip(&self.models)
            .filter_map(|(p, m)| Some(m.mig.as_ref()?.share((*p)?).milli()))
            .max()
            .unwrap_or(0);
        Ok(Resolved {
            mig_milli,
            ask,
            cpu: request.cpu_milli,
            mem: request.memory_mib,
            allowed,
            profile,
            needs_cuda: request.needs_cuda,
            gang: request.gang,
        })
    }

    /// Places one request, or says why it cannot be placed now. Gangs go through
    /// [`Engine::place_gang`].
    pub fn place(&mut self, request: &Request) -> Result<Result<Decision, Unplaced>, InputError> {
        let r = self.resolve(request, 0)?;
        if r.gang.is_some() {
            return Err(InputError::new(
                "[0].gang",
                "a gang is placed with place_gang",
            ));
        }
        Ok(self.place_resolved(&r))
    }

    pub(crate) fn place_resolved(&mut self, r: &Resolved) -> Result<Decision, Unplaced> {
        match &r.ask {
            Ask::Cpu => self.place_cpu(r),
            Ask::Mig(_) => self.place_mig(r),
            Ask::Whole(n) => self.place_whole(r, *n),
            Ask::Share(m) => self.place_share(r, *m),
        }
    }

    fn node_fits(&self, node: usize, r: &Resolved) -> bool {
        let n = &self.nodes[node];
        n.cpu_free >= r.cpu && n.mem_free >= r.mem
    }

    /// Whether `node`'s driver runs what `r` needs: any node when it needs nothing; else
    /// only one that reports a driver supporting at least the CUDA version asked for.
    /// A node closed while a gang is tried fits nothing.
    fn driver_fits(&self, node: usize, r: &Resolved) -> bool {
        if self.closed[node] {
            return false;
        }
        r.needs_cuda.is_none_or(|need| {
            self.nodes[node]
                .driver
                .as_ref()
                .is_some_and(|d| d.cuda >= need)
        })
    }

    fn take_node(&mut self, node: usize, r: &Resolved) {
        let n = &mut self.nodes[node];
        n.cpu_free -= r.cpu;
        n.mem_free -= r.mem;
    }

    fn place_cpu(&mut self, r: &Resolved) -> Result<Decision, Unplaced> {
        // Best fit on CPU: the node with the least CPU left that fits.
        let mut driver_limited = false;
        let node = (0..self.nodes.len())
            .filter(|&n| self.node_fits(n, r))
            .filter(|&n| {
                let ok = self.driver_fits(n, r);
                driver_limited |= !ok;
                ok
            })
            .min_by_key(|&n| (self.nodes[n].cpu_free, n))
            .ok_or(Unplaced {
                driver_limited,
                ..Unplaced::none()
            })?;
        self.take_node(node, r);
        Ok(Decision {
            node,
            cpu: r.cpu,
            mem: r.mem,
            placed: Placed::Cpu,
        })
    }

    fn place_mig(&mut self, r: &Resolved) -> Result<Decision, Unplaced> {
        let mut best: Option<(u32, usize)> = None;
        let mut unplaced = Unplaced::none();
        for (g, &model) in self.gpu_model.iter().enumerate() {
            let Some(p) = r.profile[usize::from(model)] else {
                continue;
            };
            let cost = self.costs[g][usize::from(p.0)];
            if cost != NONE && best.is_none_or(|(b, _)| cost < b) {
                let node = self.gpus[g].node;
                if !self.driver_fits(node, r) {
                    unplaced.driver_limited = true;
                } else if self.node_fits(node, r) {
                    best = Some((cost, g));
                } else {
                    unplaced.node_limited = true;
                }
            }
        }
        let (cost, g) = best.ok_or(unplaced)?;
        let model = usize::from(self.gpu_model[g]);
        let profile = r.profile[model].ok_or(unplaced)?;
        let table = self.models[model].mig.clone().ok_or(unplaced)?;
        let slot = Slot {
            profile,
            start: (cost & 0xFF) as u8,
        };
        let node = self.gpus[g].node;
        let gpu = &mut self.gpus[g];
        let mut conversion = None;
        let mut destroyed = Vec::new();
        let created = match cost >> 24 {
            USE_IDLE => {
                if let Some(s) = gpu.slots.iter_mut().find(|(s, busy)| *s == slot && !busy) {
                    s.1 = true;
                }
                false
            }
            level => {
                if level == MODE_CHANGE {
                    conversion = Some(convert(gpu, &table, GpuMode::Mig));
                }
                if level == REPARTITION {
                    let size = table.profile(profile).memory_slices;
                    let mine = crate::mig::range_mask_of(slot.start, size);
                    let (gone, kept): (Vec<_>, Vec<_>) = gpu.slots.iter().partition(|(s, busy)| {
                        !busy
                            && crate::mig::range_mask_of(
                                s.start,
                                table.profile(s.profile).memory_slices,
                            ) & mine
                                != 0
                    });
                    for (s, _) in &gone {
                        gpu.occ.remove(&table, *s);
                        destroyed.push(*s);
                    }
                    gpu.slots = kept;
                }
                gpu.occ.add(&table, slot);
                gpu.slots.push((slot, true));
                gpu.slots.sort();
                true
            }
        };
        self.take_node(node, r);
        self.refresh(g);
        Ok(Decision {
            node,
            cpu: r.cpu,
            mem: r.mem,
            placed: Placed::Mig {
                gpu: g,
                slot,
                created,
                destroyed,
                conversion,
            },
        })
    }

    fn place_whole(&mut self, r: &Resolved, n: u32) -> Result<Decision, Unplaced> {
        // Per node and model: free whole GPUs, idle GPUs convertible without
        // destroying anything, and idle MIG GPUs with idle instances.
        let mut best: Option<((u32, u32, u32), usize, u16)> = None;
        let mut unplaced = Unplaced::none();
        let mut counts: Vec<(u16, u32, u32, u32)> = Vec::new();
        for (ni, node) in self.nodes.iter().enumerate() {
            counts.clear();
            for g in node.gpus.clone() {
                let gpu = &self.gpus[g];
                if !r.allowed[usize::from(gpu.model)] || !gpu.idle() {
                    continue;
                }
                let entry = match counts.iter_mut().find(|c| c.0 == gpu.model) {
                    Some(e) => e,
                    None => {
                        counts.push((gpu.model, 0, 0, 0));
                        let last = counts.len() - 1;
                        &mut counts[last]
                    }
                };
                match gpu.mode {
                    GpuMode::Whole => entry.1 += 1,
                    _ if !gpu.reconfigurable => {}
                    GpuMode::Mig if !gpu.slots.is_empty() => entry.3 += 1,
                    _ => entry.2 += 1,
                }
            }
            for &(model, free, conv, destroy) in &counts {
                if free + conv + destroy < n {
                    continue;
                }
                let converted = n.saturating_sub(free);
                let destroying = converted.saturating_sub(conv);
                let key = (destroying, converted, free + conv + destroy - n);
                if best.is_none_or(|(b, _, _)| key < b) {
                    if !self.driver_fits(ni, r) {
                        unplaced.driver_limited = true;
                    } else if node.cpu_free >= r.cpu && node.mem_free >= r.mem {
                        best = Some((key, ni, model));
                    } else {
                        unplaced.node_limited = true;
                    }
                }
            }
        }
        let (_, node, model) = best.ok_or(unplaced)?;
        let mut pick: Vec<(u8, usize)> = self.nodes[node]
            .gpus
            .clone()
            .filter_map(|g| {
                let gpu = &self.gpus[g];
                if gpu.model != model || !gpu.idle() {
                    return None;
                }
                match gpu.mode {
                    GpuMode::Whole => Some((0, g)),
                    _ if !gpu.reconfigurable => None,
                    GpuMode::Mig if !gpu.slots.is_empty() => Some((2, g)),
                    _ => Some((1, g)),
                }
            })
            .collect();
        pick.sort();
        let mut gpus = Vec::new();
        for &(_, g) in pick.iter().take(n as usize) {
            let conversion = if self.gpus[g].mode == GpuMode::Whole {
                None
            } else {
                let table = self.models[usize::from(model)].mig.clone();
                Some(convert_any(
                    &mut self.gpus[g],
                    table.as_ref(),
                    GpuMode::Whole,
                ))
            };
            self.gpus[g].busy = true;
            self.refresh(g);
            gpus.push((g, conversion));
        }
        self.take_node(node, r);
        Ok(Decision {
            node,
            cpu: r.cpu,
            mem: r.mem,
            placed: Placed::Whole { gpus },
        })
    }

    fn place_share(&mut self, r: &Resolved, milli: u32) -> Result<Decision, Unplaced> {
        let ask = ShareAsk {
            cpu: r.cpu,
            mem: r.mem,
            count: 1,
            milli,
        };
        let mut best: Option<(i64, usize)> = None;
        let mut node_limited = false;
        let mut driver_limited = false;
        let mut free: Vec<u32> = Vec::new();
        let mut ids: Vec<usize> = Vec::new();
        for (ni, node) in self.nodes.iter().enumerate() {
            let driver_ok = self.driver_fits(ni, r);
            for model in 0..self.models.len() {
                if !r.allowed[model] {
                    continue;
                }
                free.clear();
                ids.clear();
                for g in node.gpus.clone() {
                    let gpu = &self.gpus[g];
                    if gpu.mode == GpuMode::Shared && usize::from(gpu.model) == model {
                        free.push(1000 - gpu.used_milli);
                        ids.push(g);
                    }
                }
                if free.is_empty() {
                    continue;
                }
                let view = NodeView {
                    cpu_free: node.cpu_free,
                    mem_free: node.mem_free,
                    gpu_free: &free,
                    model: model as u16,
                };
                match self.policy.choose(&view, &ask) {
                    Some(_) if !driver_ok => driver_limited = true,
                    Some(c) => {
                        if let Some(&pos) = c.gpus.first()
                            && best.is_none_or(|(s, _)| c.score > s)
                        {
                            best = Some((c.score, ids[pos]));
                        }
                    }
                    None => {
                        let room = free.iter().any(|&f| f >= milli);
                        node_limited |= room;
                    }
                }
            }
        }
        let (g, conversion) = match best {
            Some((_, g)) => (g, None),
            None => {
                // Convert an idle reconfigurable GPU: the least disruptive
                // one (nothing to destroy) first, in cluster order.
                let g = (0..self.gpus.len())
                    .filter(|&g| {
                        let gpu = &self.gpus[g];
                        !self.fixed_sharing
                            && gpu.mode != GpuMode::Shared
                            && gpu.reconfigurable
                            && gpu.idle()
                            && r.allowed[usize::from(gpu.model)]
                    })
                    .filter(|&g| {
                        let fits = self.node_fits(self.gpus[g].node, r);
                        node_limited |= !fits;
                        fits
                    })
                    .filter(|&g| {
                        let ok = self.driver_fits(self.gpus[g].node, r);
                        driver_limited |= !ok;
                        ok
                    })
                    .min_by_key(|&g| (!self.gpus[g].slots.is_empty(), g))
                    .ok_or(Unplaced {
                        node_limited,
                        driver_limited,
                    })?;
                let table = self.models[usize::from(self.gpus[g].model)].mig.clone();
                let c = convert_any(&mut self.gpus[g], table.as_ref(), GpuMode::Shared);
                (g, Some(c))
            }
        };
        self.gpus[g].used_milli += milli;
        self.refresh(g);
        let node = self.gpus[g].node;
        self.take_node(node, r);
        Ok(Decision {
            node,
            cpu: r.cpu,
            mem: r.mem,
            placed: Placed::Share {
                gpu: g,
                milli,
                conversion,
            },
        })
    }

    /// Undoes a decision. Decisions must be released in reverse order of
    /// placement; then the engine is exactly as before.
    pub fn release(&mut self, d: Decision) {
        let node = &mut self.nodes[d.node];
        node.cpu_free += d.cpu;
        node.mem_free += d.mem;
        match d.placed {
            Placed::Cpu => {}
            Placed::Mig {
                gpu: g,
                slot,
                created,
                destroyed,
                conversion,
            } => {
                let model = usize::from(self.gpu_model[g]);
                if let Some(table) = self.models[model].mig.clone() {
                    let gpu = &mut self.gpus[g];
                    if created {
                        gpu.slots.retain(|(s, _)| *s != slot);
                        gpu.occ.remove(&table, slot);
                    } else if let Some(s) = gpu.slots.iter_mut().find(|(s, _)| *s == slot) {
                        s.1 = false;
                    }
                    for s in destroyed {
                        gpu.occ.add(&table, s);
                        gpu.slots.push((s, false));
                    }
                    gpu.slots.sort();
                    if let Some(c) = conversion {
                        restore(gpu, &table, c);
                    }
                }
                self.refresh(g);
            }
            Placed::Whole { gpus } => {
                for (g, conversion) in gpus.into_iter().rev() {
                    self.gpus[g].busy = false;
                    if let Some(c) = conversion {
                        let table = self.models[usize::from(self.gpu_model[g])].mig.clone();
                        restore_any(&mut self.gpus[g], table.as_ref(), c);
                    }
                    self.refresh(g);
                }
            }
            Placed::Share {
                gpu: g,
                milli,
                conversion,
            } => {
                self.gpus[g].used_milli -= milli;
                if let Some(c) = conversion {
                    let table = self.models[usize::from(self.gpu_model[g])].mig.clone();
                    restore_any(&mut self.gpus[g], table.as_ref(), c);
                }
                self.refresh(g);
            }
        }
    }

    /// Recomputes the cost keys of GPU `g` for every profile of its model.
    fn refresh(&mut self, g: usize) {
        let gpu = &self.gpus[g];
        let mut out = [NONE; MAX_PROFILES];
        if let Some(table) = &self.models[usize::from(gpu.model)].mig {
            for (p, profile) in table.indexed() {
                out[usize::from(p.0)] =
                    mig_cost(gpu, table, p, profile.placements.iter().map(|pl| pl.start));
            }
        }
        self.costs[g] = out;
    }

    /// The cluster in wire form, as it would be after the decisions so far
    /// (instances carry their busy flags).
    pub fn snapshot(&self) -> Cluster {
        let nodes = self
            .nodes
            .iter()
            .map(|n| Node {
                name: n.name.clone(),
                cpu_milli: n.cpu_cap,
                memory_mib: n.mem_cap,
                cpu_used_milli: n.cpu_cap - n.cpu_free,
                memory_used_mib: n.mem_cap - n.mem_free,
                gpus: self.gpus[n.gpus.clone()]
                    .iter()
                    .map(|g| self.wire_gpu(g))
                    .collect(),
                driver: n.driver.clone(),
                group: n.group.clone(),
            })
            .collect();
        Cluster {
            nodes,
            models: Vec::new(),
            fixed_sharing: self.fixed_sharing,
            demand: Vec::new(),
        }
    }

    fn wire_gpu(&self, g: &GpuState) -> Gpu {
        let entry = &self.models[usize::from(g.model)];
        Gpu {
            index: g.index,
            model: entry.name.clone(),
            mode: g.mode,
            reconfigurable: g.reconfigurable,
            instances: g
                .slots
                .iter()
                .filter_map(|(s, busy)| {
                    let t = entry.mig.as_ref()?;
                    Some(MigInstance {
                        profile: t.profile(s.profile).name.clone(),
                        start: s.start,
                        busy: *busy,
                    })
                })
                .collect(),
            busy: g.busy,
            used_milli: g.used_milli,
        }
    }

    pub(crate) fn node_name(&self, node: usize) -> &str {
        &self.nodes[node].name
    }

    pub(crate) fn gpu_ref(&self, g: usize) -> (usize, u32) {
        (self.gpus[g].node, self.gpus[g].index)
    }

    pub(crate) fn decision_parts(&self, d: &Decision) -> DecisionParts {
        let (gpus, profile, start, milli) = match &d.placed {
            Placed::Cpu => (Vec::new(), None, None, None),
            Placed::Mig { gpu, slot, .. } => {
                let t = self.models[usize::from(self.gpu_model[*gpu])].mig.as_ref();
                let name = t.map(|t| t.profile(slot.profile).name.clone());
                (vec![self.gpus[*gpu].index], name, Some(slot.start), None)
            }
            Placed::Whole { gpus } => (
                gpus.iter().map(|(g, _)| self.gpus[*g].index).collect(),
                None,
                None,
                None,
            ),
            Placed::Share { gpu, milli, .. } => {
                (vec![self.gpus[*gpu].index], None, None, Some(*milli))
            }
        };
        DecisionParts {
            node: d.node,
            gpus,
            profile,
            start,
            milli,
        }
    }

    pub(crate) fn gpu_count(&self) -> usize {
        self.gpus.len()
    }

    /// Wire-form instances and mode of GPU `g`, for diffing plans.
    pub(crate) fn gpu_layout(&self, g: usize) -> (GpuMode, Vec<crate::mig::Instance>) {
        let gpu = &self.gpus[g];
        let t = self.models[usize::from(gpu.model)].mig.as_ref();
        let inst = gpu
            .slots
            .iter()
            .filter_map(|(s, _)| t.map(|t| t.instance(*s)))
            .collect();
        (gpu.mode, inst)
    }

    /// The names of the cluster's models that `r` may run on.
    pub(crate) fn allowed_models(&self, r: &Resolved) -> Vec<&str> {
        self.models
            .iter()
            .zip(&r.allowed)
            .filter(|(_, ok)| **ok)
            .map(|(m, _)| m.name.as_str())
            .collect()
    }

    /// Says, in words a user can act on, why `r` waits.
    pub(crate) fn reason(&self, r: &Resolved, u: Unplaced, summary: &Summary) -> String {
        let allowed = self.allowed_models(r);
        if allowed.is_empty() && !matches!(r.ask, Ask::Cpu) {
            return "no GPU of the allowed models is in the cluster".to_owned();
        }
        if let (true, Some(need)) = (u.driver_limited, r.needs_cuda) {
            return self.driver_reason(r, need);
        }
        if u.node_limited {
            return format!(
                "GPUs have room, but none of their nodes has {} CPU milli and {} MiB memory free; most free on one node: {} CPU milli, {} MiB",
                r.cpu, r.mem, summary.max_cpu, summary.max_mem
            );
        }
        match &r.ask {
            Ask::Cpu => format!(
                "no node has {} CPU milli and {} MiB memory free; most free on one node: {} CPU milli, {} MiB",
                r.cpu, r.mem, summary.max_cpu, summary.max_mem
            ),
            Ask::Mig(name) => {
                if r.profile.iter().all(Option::is_none) {
                    let offered: Vec<&str> = self
                        .catalog
                        .models()
                        .filter(|m| m.profile_by_name(name).is_some())
                        .map(GpuModel::name)
                        .collect();
                    return format!(
                        "no allowed GPU model in the cluster offers {name} (offered by: {})",
                        if offered.is_empty() {
                            "none".to_owned()
                        } else {
                            offered.join(", ")
                        }
                    );
                }
                let mut free = Vec::new();
                for (m, ok) in summary.mig_free.iter().zip(&r.allowed) {
                    if *ok {
                        free.extend(m.iter().cloned());
                    }
                }
                if free.is_empty() {
                    format!(
                        "no free {name}, and no MIG capacity free or reconfigurable on the allowed models"
                    )
                } else {
                    free.truncate(4);
                    let list: Vec<String> = free
                        .iter()
                        .map(|(model, p, c)| format!("{c} × {p} on {model}"))
                        .collect();
                    format!("no free {name}; free after this plan: {}", list.join(", "))
                }
            }
            Ask::Whole(n) => {
                let block = best_allowed(&summary.largest_block, &r.allowed);
                format!(
                    "needs {} of one model on one node; the largest free block left by this plan is {block}",
                    crate::text::count(u64::from(*n), "GPU", "GPUs")
                )
            }
            Ask::Share(m) => {
                let most = best_allowed(&summary.share_free, &r.allowed);
                if self.fixed_sharing {
                    format!(
                        "needs {m} milli-GPU free on one shared GPU; the most free on a shared GPU of this model is {most} (admins choose which GPUs are shared, on the Nodes page)"
                    )
                } else {
                    format!(
                        "needs {m} milli-GPU on one GPU; the most left free on a shared GPU is {most}, and no idle reconfigurable GPU can switch to shared"
                    )
                }
            }
        }
    }

    /// Why `r` waits when the nodes with room run a driver too old for it: `needs CUDA ≥
    /// 12.4; nodes with free H100-80GB run driver 535.104.05 (CUDA 12.2)`. Names the
    /// drivers (at most three, newest first) of the nodes that cannot take it and hold
    /// GPUs of the allowed models, and says when some report no driver at all.
    fn driver_reason(&self, r: &Resolved, need: CudaVersion) -> String {
        let mut models: Vec<&str> = Vec::new();
        let mut drivers: Vec<(CudaVersion, &str)> = Vec::new();
        let mut unknown = false;
        for (ni, n) in self.nodes.iter().enumerate() {
            if self.driver_fits(ni, r) {
                continue;
            }
            let mut any = false;
            for g in &self.gpus[n.gpus.clone()] {
                if r.allowed[usize::from(g.model)] {
                    any = true;
                    let name = self.models[usize::from(g.model)].name.as_str();
                    if !models.contains(&name) {
                        models.push(name);
                    }
                }
            }
            if !any && !matches!(r.ask, Ask::Cpu) {
                continue;
            }
            match &n.driver {
                Some(d) if !drivers.contains(&(d.cuda, d.version.as_str())) => {
                    drivers.push((d.cuda, d.version.as_str()));
                }
                Some(_) => {}
                None => unknown = true,
            }
        }
        drivers.sort_by(|a, b| b.cmp(a));
        let more = drivers.len().saturating_sub(3);
        drivers.truncate(3);
        let mut said: Vec<String> = drivers
            .iter()
            .map(|(cuda, version)| format!("driver {version} (CUDA {cuda})"))
            .collect();
        if more > 0 {
            said.push(format!("{more} older"));
        }
        let run = match (said.is_empty(), unknown) {
            (false, false) => format!("run {}", said.join(", ")),
            (false, true) => format!("run {}, or report no driver", said.join(", ")),
            _ => "report no driver version, so none is known to run it".to_owned(),
        };
        let which = if models.is_empty() {
            "nodes with room".to_owned()
        } else {
            format!("nodes with free {}", models.join(", "))
        };
        format!("{}{need}; {which} {run}", super::DRIVER_REASON)
    }

    /// Free capacity by model, for pending reasons.
    pub(crate) fn summary(&self) -> Summary {
        let mut s = Summary {
            mig_free: vec![Vec::new(); self.models.len()],
            largest_block: vec![0; self.models.len()],
            share_free: vec![0; self.models.len()],
            max_cpu: self.nodes.iter().map(|n| n.cpu_free).max().unwrap_or(0),
            max_mem: self.nodes.iter().map(|n| n.mem_free).max().unwrap_or(0),
        };
        let mut counts: Vec<BTreeMap<(u8, u8), usize>> = vec![BTreeMap::new(); self.models.len()];
        for (g, gpu) in self.gpus.iter().enumerate() {
            let m = usize::from(gpu.model);
            if let Some(t) = &self.models[m].mig {
                for (p, prof) in t.indexed() {
                    if self.costs[g][usize::from(p.0)] >> 24 <= REPARTITION {
                        *counts[m]
                            .entry((u8::MAX - prof.compute_slices, p.0))
                            .or_default() += 1;
                    }
                }
            }
            if gpu.mode == GpuMode::Shared {
                s.share_free[m] = s.share_free[m].max(1000 - gpu.used_milli);
            }
        }
        for node in &self.nodes {
            let mut per: BTreeMap<u16, u32> = BTreeMap::new();
            for gpu in &self.gpus[node.gpus.clone()] {
                if gpu.idle() && (gpu.mode == GpuMode::Whole || gpu.reconfigurable) {
                    *per.entry(gpu.model).or_default() += 1;
                }
            }
            for (m, c) in per {
                let b = &mut s.largest_block[usize::from(m)];
                *b = (*b).max(c);
            }
        }
        for (m, c) in counts.into_iter().enumerate() {
            if let Some(t) = &self.models[m].mig {
                s.mig_free[m] = c
                    .into_iter()
                    .map(|((_, p), n)| {
                        (
                            self.models[m].name.clone(),
                            t.profile(ProfileIdx(p)).name.clone(),
                            n,
                        )
                    })
                    .collect();
            }
        }
        s
    }
}

pub(crate) struct DecisionParts {
    pub node: usize,
    pub gpus: Vec<u32>,
    pub profile: Option<String>,
    pub start: Option<u8>,
    pub milli: Option<u32>,
}

pub(crate) struct Summary {
    /// Per model: (model, profile, GPUs that could take one now).
    mig_free: Vec<Vec<(String, String, usize)>>,
    largest_block: Vec<u32>,
    share_free: Vec<u32>,
    max_cpu: u64,
    max_mem: u64,
}

/// The largest of a per-model figure over the models a request allows.
fn best_allowed(per_model: &[u32], allowed: &[bool]) -> u32 {
    per_model
        .iter()
        .zip(allowed)
        .filter(|(_, ok)| **ok)
        .map(|(v, _)| *v)
        .max()
        .unwrap_or(0)
}

/// The cheapest way to add one instance of `p` to `gpu`, as a cost key:
/// `level << 24 | detail << 8 | start`, lower is better. Within a level the
/// fuller GPU wins (empty GPUs stay free for large asks), then the
/// placement that leaves the most `(profile, start)` options open.
fn mig_cost(
    gpu: &GpuState,
    table: &GpuModel,
    p: ProfileIdx,
    starts: impl Iterator<Item = u8> + Clone,
) -> u32 {
    let key = |level: u32, destroyed: u32, occ: &Occupancy, start: u8| {
        let free_after = u32::from(table.compute_slices() - occ.compute);
        let options = occ.options(table).min(255);
        level << 24 | (destroyed << 4 | free_after) << 16 | (255 - options) << 8 | u32::from(start)
    };
    match gpu.mode {
        GpuMode::Mig => {
            if let Some((s, _)) = gpu.slots.iter().find(|(s, busy)| s.profile == p && !busy) {
                return USE_IDLE << 24 | u32::from(s.start);
            }
            if !gpu.reconfigurable {
                return NONE;
            }
            let mut best = NONE;
            for start in starts.clone() {
                let slot = Slot { profile: p, start };
                if gpu.occ.fits(table, slot) {
                    let mut occ = gpu.occ;
                    occ.add(table, slot);
                    best = best.min(key(CREATE, 0, &occ, start));
                }
            }
            if best != NONE {
                return best;
            }
            let size = table.profile(p).memory_slices;
            for start in starts {
                let mine = crate::mig::range_mask_of(start, size);
                let mut occ = gpu.occ;
                let mut destroyed = 0;
                let mut blocked = false;
                for (s, busy) in &gpu.slots {
                    if crate::mig::range_mask_of(s.start, table.profile(s.profile).memory_slices)
                        & mine
                        != 0
                    {
                        blocked |= *busy;
                        occ.remove(table, *s);
                        destroyed += 1;
                    }
                }
                let slot = Slot { profile: p, start };
                if !blocked && occ.fits(table, slot) {
                    occ.add(table, slot);
                    best = best.min(key(REPARTITION, destroyed, &occ, start));
                }
            }
            best
        }
        _ if gpu.reconfigurable && gpu.idle() => {
            let mut best = NONE;
            for start in starts {
                let slot = Slot { profile: p, start };
                let mut occ = Occupancy::default();
                if occ.fits(table, slot) {
                    occ.add(table, slot);
                    best = best.min(key(MODE_CHANGE, 0, &occ, start));
                }
            }
            best
        }
        _ => NONE,
    }
}

/// Switches an idle GPU to `mode`, destroying its (idle) instances.
fn convert(gpu: &mut GpuState, table: &GpuModel, mode: GpuMode) -> Conversion {
    convert_any(gpu, Some(table), mode)
}

fn convert_any(gpu: &mut GpuState, table: Option<&GpuModel>, mode: GpuMode) -> Conversion {
    let destroyed: Vec<Slot> = gpu.slots.drain(..).map(|(s, _)| s).collect();
    if let Some(t) = table {
        for s in &destroyed {
            gpu.occ.remove(t, *s);
        }
    }
    let c = Conversion {
        from_mode: gpu.mode,
        destroyed,
    };
    gpu.mode = mode;
    gpu.busy = false;
    gpu.used_milli = 0;
    c
}

fn restore(gpu: &mut GpuState, table: &GpuModel, c: Conversion) {
    restore_any(gpu, Some(table), c);
}

fn restore_any(gpu: &mut GpuState, table: Option<&GpuModel>, c: Conversion) {
    for (s, _) in gpu.slots.drain(..) {
        if let Some(t) = table {
            gpu.occ.remove(t, s);
        }
    }
    for s in c.destroyed {
        if let Some(t) = table {
            gpu.occ.add(t, s);
        }
        gpu.slots.push((s, false));
    }
    gpu.slots.sort();
    gpu.mode = c.from_mode;
    gpu.busy = false;
    gpu.used_milli = 0;
}

impl PartialEq for Engine {
    fn eq(&self, other: &Self) -> bool {
        self.nodes == other.nodes && self.gpus == other.gpus && self.costs == other.costs
    }
}
