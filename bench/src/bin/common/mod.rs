//! What the planner bins share: the simulated cluster of the openb trace's GPUs.

use tessera_domain::planner::{Gpu, GpuMode, Node};

/// `total` idle H100-80GB GPUs packed 8 to a node (`node-0000`, … with 128 cores and
/// 1 TiB each, in no group), a node's GPU `i` offered as `mode(i)`.
pub fn h100_nodes(total: usize, mode: impl Fn(u32) -> GpuMode) -> Vec<Node> {
    let mut nodes = Vec::new();
    let mut left = total;
    while left > 0 {
        let n = left.min(8);
        left -= n;
        nodes.push(Node {
            name: format!("node-{:04}", nodes.len()),
            cpu_milli: 128_000,
            memory_mib: 1 << 20,
            cpu_used_milli: 0,
            memory_used_mib: 0,
            gpus: (0..n as u32)
                .map(|i| Gpu {
                    index: i,
                    model: "H100-80GB".into(),
                    mode: mode(i),
                    reconfigurable: true,
                    instances: Vec::new(),
                    busy: false,
                    used_milli: 0,
                })
                .collect(),
            driver: None,
            group: None,
        });
    }
    nodes
}
