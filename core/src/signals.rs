//! "Something changed for node N": the wake-ups behind the agent's long poll
//! (`GET /agent/v1/wait`).
//!
//! Every write that changes what a node should do (its desired MIG layouts or sharing, a
//! workload placed on it, started there or told to stop) bumps that node's generation
//! after the write is committed. An agent holds a long poll with the mark it last saw; the
//! poll answers at once when the generation moved since, and otherwise when it moves or
//! the wait runs out. The agent then fetches its desired state and syncs its workloads, so
//! a change reaches the node in one round trip instead of at its next timer.
//!
//! Generations live in this process only. A mark carries the process's `epoch`: a mark
//! from another replica (or from before a restart) says nothing about this process's
//! generations, so the poll waits for the next change here instead of answering at once
//! (answering would make an agent behind a load balancer spin between replicas). Other
//! replicas' writes reach this one through [`NodeSignals::forwarded`] and the server's
//! PostgreSQL `LISTEN` (server/src/leader.rs); the agents' timers stay as the safety net.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tessera_domain::ids::NodeId;
use tokio::sync::{mpsc, watch};
use uuid::Uuid;

/// What an agent saw last: this process's epoch and the node's generation then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    pub epoch: Uuid,
    pub generation: u64,
}

/// Per-node generations, bumped after each committed change for the node.
pub struct NodeSignals {
    epoch: Uuid,
    nodes: Mutex<HashMap<NodeId, watch::Sender<u64>>>,
    /// Bumps made here, for other replicas (set by the server on PostgreSQL).
    forward: Mutex<Option<mpsc::UnboundedSender<NodeId>>>,
    /// Set when the process shuts down: every wait answers at once.
    closed: watch::Sender<bool>,
}

impl Default for NodeSignals {
    fn default() -> Self {
        Self::new()
    }
}

impl NodeSignals {
    pub fn new() -> Self {
        NodeSignals {
            epoch: Uuid::new_v4(),
            nodes: Mutex::new(HashMap::new()),
            forward: Mutex::new(None),
            closed: watch::Sender::new(false),
        }
    }

    /// Ends every wait now and from now on (the server is shutting down; held polls must
    /// not keep it up).
    pub fn close(&self) {
        self.closed.send_replace(true);
    }

    /// This process's epoch (changes with every start).
    pub fn epoch(&self) -> Uuid {
        self.epoch
    }

    fn sender(&self, node: NodeId) -> watch::Sender<u64> {
        let mut nodes = self
            .nodes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        nodes
            .entry(node)
            .or_insert_with(|| watch::Sender::new(0))
            .clone()
    }

    /// Something changed for `node` (already committed): wakes its agent's poll, here and,
    /// when forwarding is on, on the other replicas.
    pub fn bump(&self, node: NodeId) {
        self.bump_local(node);
        let forward = self
            .forward
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(tx) = forward.as_ref() {
            let _ = tx.send(node);
        }
    }

    /// A bump another replica made (not forwarded again).
    pub fn bump_local(&self, node: NodeId) {
        self.sender(node).send_modify(|g| *g = g.wrapping_add(1));
    }

    /// Bumps made from now on are also sent to the returned receiver (for other replicas).
    pub fn forwarded(&self) -> mpsc::UnboundedReceiver<NodeId> {
        let (tx, rx) = mpsc::unbounded_channel();
        *self
            .forward
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(tx);
        rx
    }

    /// The node's mark now.
    pub fn mark(&self, node: NodeId) -> Mark {
        Mark {
            epoch: self.epoch,
            generation: *self.sender(node).borrow(),
        }
    }

    /// Waits until the node's generation differs from `since`'s (at once if it already
    /// does and `since` is from this process) or `timeout` passes. Returns the mark then
    /// and whether it changed.
    pub async fn wait(&self, node: NodeId, since: Option<Mark>, timeout: Duration) -> (Mark, bool) {
        let tx = self.sender(node);
        let mut rx = tx.subscribe();
        let seen = *rx.borrow_and_update();
        let base = match since {
            Some(m) if m.epoch == self.epoch => m.generation,
            _ => seen,
        };
        if seen != base {
            return (self.mark(node), true);
        }
        let mut closed = self.closed.subscribe();
        if *closed.borrow_and_update() {
            return (self.mark(node), false);
        }
        let changed = tokio::select! {
            r = tokio::time::timeout(timeout, rx.changed()) => r.is_ok_and(|r| r.is_ok()),
            _ = closed.changed() => false,
        };
        (self.mark(node), changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_bump_after_the_mark_answers_at_once() {
        let s = NodeSignals::new();
        let node = NodeId(Uuid::new_v4());
        let before = s.mark(node);
        s.bump(node);
        let (after, changed) = s.wait(node, Some(before), Duration::from_secs(30)).await;
        assert!(changed);
        assert_eq!(after.generation, before.generation + 1);
        // Nothing new since: the wait runs out.
        let (again, changed) = s.wait(node, Some(after), Duration::from_millis(20)).await;
        assert!(!changed);
        assert_eq!(again, after);
    }

    #[tokio::test]
    async fn a_waiting_poll_wakes_on_its_node_only() {
        let s = std::sync::Arc::new(NodeSignals::new());
        let (a, b) = (NodeId(Uuid::new_v4()), NodeId(Uuid::new_v4()));
        let mark = s.mark(a);
        let waiter = {
            let s = s.clone();
            tokio::spawn(async move { s.wait(a, Some(mark), Duration::from_secs(30)).await })
        };
        tokio::task::yield_now().await;
        s.bump(b);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "another node's change woke the poll");
        s.bump(a);
        let (m, changed) = waiter.await.expect("the waiter runs");
        assert!(changed);
        assert_eq!(m.generation, mark.generation + 1);
    }

    #[tokio::test]
    async fn a_mark_from_another_process_waits_for_a_change_here() {
        let s = NodeSignals::new();
        let node = NodeId(Uuid::new_v4());
        s.bump(node);
        let foreign = Mark {
            epoch: Uuid::new_v4(),
            generation: 0,
        };
        let (m, changed) = s.wait(node, Some(foreign), Duration::from_millis(20)).await;
        assert!(!changed, "a foreign mark must not answer at once");
        assert_eq!(m.epoch, s.epoch());
    }

    #[tokio::test]
    async fn closing_ends_held_waits() {
        let s = std::sync::Arc::new(NodeSignals::new());
        let node = NodeId(Uuid::new_v4());
        let mark = s.mark(node);
        let waiter = {
            let s = s.clone();
            tokio::spawn(async move { s.wait(node, Some(mark), Duration::from_secs(30)).await })
        };
        tokio::task::yield_now().await;
        s.close();
        let (_, changed) = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the wait ended on close")
            .expect("the waiter runs");
        assert!(!changed);
        let (_, changed) = s.wait(node, Some(mark), Duration::from_secs(30)).await;
        assert!(!changed, "a wait after close answers at once");
    }

    #[tokio::test]
    async fn forwarded_bumps_reach_the_other_replica_once() {
        let here = NodeSignals::new();
        let mut out = here.forwarded();
        let node = NodeId(Uuid::new_v4());
        here.bump(node);
        assert_eq!(out.recv().await, Some(node));
        // What arrives from another replica wakes the polls here and goes no further.
        let before = here.mark(node);
        here.bump_local(node);
        assert_eq!(here.mark(node).generation, before.generation + 1);
        assert!(
            out.try_recv().is_err(),
            "a received bump was forwarded again"
        );
    }
}
