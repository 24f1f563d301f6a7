//! Gang placement: every member on its own node, all or nothing, inside one node group
//! when one can hold the gang (docs/planner.md, "Gangs"). A child of `engine` so that it
//! can close nodes while it tries.

use std::collections::BTreeMap;

use super::{Decision, Engine, Resolved};
use crate::planner::input::{Ask, Gang, InputError, Request};

/// A placed gang: per member (in rank order), its decisions (one for whole GPUs, one per
/// MIG instance). Hand it back to [`Engine::release_gang`] to undo it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GangPlacement {
    pub members: Vec<Vec<Decision>>,
}

/// Checks a request's gang against its ask.
pub(super) fn check(g: &Gang, ask: &Ask, position: usize) -> Result<(), InputError> {
    let at = |f: &str| format!("[{position}].gang{f}");
    if g.nodes == 0 {
        return Err(InputError::new(at(".nodes"), "must be at least 1"));
    }
    if g.per_node == 0 {
        return Err(InputError::new(at(".per_node"), "must be at least 1"));
    }
    match ask {
        Ask::Whole(_) if g.per_node != 1 => Err(InputError::new(
            at(".per_node"),
            "must be 1 for a gpus ask: each member takes `gpus` GPUs",
        )),
        Ask::Whole(_) | Ask::Mig(_) => Ok(()),
        Ask::Cpu | Ask::Share(_) => Err(InputError::new(
            at(""),
            "a gang asks for whole GPUs (gpus) or MIG instances (mig)",
        )),
    }
}

impl Engine {
    /// Places a gang request all-or-nothing, or says why it waits; on `Err` the engine
    /// is unchanged.
    pub fn place_gang(
        &mut self,
        request: &Request,
    ) -> Result<Result<GangPlacement, String>, InputError> {
        let r = self.resolve(request, 0)?;
        if r.gang.is_none() {
            return Err(InputError::new("[0].gang", "is required for place_gang"));
        }
        Ok(self
            .place_gang_resolved(&r)
            .ok_or_else(|| self.gang_reason(&r)))
    }

    /// Undoes a placed gang (gangs and other decisions in reverse order of placement).
    pub fn release_gang(&mut self, g: GangPlacement) {
        for member in g.members.into_iter().rev() {
            for d in member.into_iter().rev() {
                self.release(d);
            }
        }
    }

    /// Tries each node group that has enough nodes, on a copy of the engine, and keeps
    /// the one that leaves the fewest idle GPUs of the allowed models in the group
    /// (ties: the group name); if no group holds the gang, tries all nodes. Commits the
    /// copy that worked; with none, leaves `self` as it was.
    pub(crate) fn place_gang_resolved(&mut self, r: &Resolved) -> Option<GangPlacement> {
        let gang = r.gang?;
        let mut groups: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if let Some(g) = &n.group {
                groups.entry(g.as_str()).or_default().push(i);
            }
        }
        let mut best: Option<(usize, Engine, GangPlacement)> = None;
        for nodes in groups.values() {
            if nodes.len() < gang.nodes as usize {
                continue;
            }
            let mut trial = self.clone();
            trial.closed.fill(true);
            for &n in nodes {
                trial.closed[n] = false;
            }
            if let Some(p) = trial.place_members(r, gang) {
                let left = nodes
                    .iter()
                    .flat_map(|&n| &trial.gpus[trial.nodes[n].gpus.clone()])
                    .filter(|g| r.allowed[usize::from(g.model)] && g.idle())
                    .count();
                if best.as_ref().is_none_or(|(b, _, _)| left < *b) {
                    best = Some((left, trial, p));
                }
            }
        }
        let (mut engine, placed) = match best {
            Some((_, e, p)) => (e, p),
            None => {
                let mut trial = self.clone();
                let p = trial.place_members(r, gang)?;
                (trial, p)
            }
        };
        engine.closed.fill(false);
        *self = engine;
        Some(placed)
    }

    /// Places `gang.nodes` members on distinct open nodes; `None` (with the engine
    /// partly changed: callers work on a copy) when one does not fit.
    fn place_members(&mut self, r: &Resolved, gang: Gang) -> Option<GangPlacement> {
        let mut members = Vec::with_capacity(gang.nodes as usize);
        for _ in 0..gang.nodes {
            let m = self.place_member(r, gang.per_node)?;
            self.closed[m[0].node] = true;
            members.push(m);
        }
        Some(GangPlacement { members })
    }

    /// One member: the request's ask, or `per_node` MIG instances on one node (the
    /// node of the best first instance; if the rest do not fit there, the next best
    /// node). The member's CPU and memory are taken once. On `None` the engine (closed
    /// nodes included) is as before.
    fn place_member(&mut self, r: &Resolved, per_node: u32) -> Option<Vec<Decision>> {
        let first = self.place_resolved(r).ok()?;
        if per_node <= 1 {
            return Some(vec![first]);
        }
        let rest = Resolved {
            cpu: 0,
            mem: 0,
            ..r.clone()
        };
        let saved = self.closed.clone();
        let mut first = Some(first);
        let result = loop {
            let Some(d) = first.take().or_else(|| self.place_resolved(r).ok()) else {
                break None;
            };
            let node = d.node;
            let open = self.closed.clone();
            self.closed.fill(true);
            self.closed[node] = false;
            let mut ds = vec![d];
            while ds.len() < per_node as usize {
                match self.place_resolved(&rest) {
                    Ok(d) => ds.push(d),
                    Err(_) => break,
                }
            }
            self.closed = open;
            if ds.len() == per_node as usize {
                break Some(ds);
            }
            for d in ds.into_iter().rev() {
                self.release(d);
            }
            self.closed[node] = true;
        };
        self.closed = saved;
        result
    }

    /// Why a gang waits: `needs 2 nodes with 8 free H100-80GB; 1 has them now`, counting
    /// the nodes where one member would fit in the state left by the plan.
    pub(crate) fn gang_reason(&self, r: &Resolved) -> String {
        let Some(gang) = r.gang else {
            return String::new();
        };
        let models = self.allowed_models(r);
        if models.is_empty() {
            return "no GPU of the allowed models is in the cluster".to_owned();
        }
        let mut probe = self.clone();
        let mut ready = 0;
        for n in 0..probe.nodes.len() {
            probe.closed.fill(true);
            probe.closed[n] = false;
            if let Some(ds) = probe.place_member(r, gang.per_node) {
                ready += 1;
                for d in ds.into_iter().rev() {
                    probe.release(d);
                }
            }
        }
        let nodes = crate::text::count(u64::from(gang.nodes), "node", "nodes");
        let what = match &r.ask {
            Ask::Whole(g) => format!("{g} free {}", models.join(" or ")),
            Ask::Mig(p) => format!("{} × {p} free ({})", gang.per_node, models.join(" or ")),
            _ => String::new(),
        };
        let extra = if r.cpu > 0 || r.mem > 0 {
            format!(", {} CPU milli and {} MiB", r.cpu, r.mem)
        } else {
            String::new()
        };
        let has = if ready == 1 { "has" } else { "have" };
        format!("needs {nodes} with {what}{extra}; {ready} {has} them now")
    }
}
