//! Tables read from real GPUs by `tessera-agent inventory --json --samples`
//! (read-only; `tests/hardware/`): the built-in catalog, which the planner
//! falls back on and the simulator follows, must agree with them field by
//! field, memory included, and the driver's model names must resolve.

use serde::Deserialize;
use tessera_domain::mig::Catalog;
use tessera_domain::wire::{GpuSample, Inventory, model_from_profiles};

#[derive(Deserialize)]
struct Capture {
    inventory: Inventory,
    samples: Vec<GpuSample>,
}

const CAPTURES: &[(&str, &str, &str)] = &[
    (
        "H100-80GB",
        "h100-80gb-hbm3-driver-580.159.04.json",
        include_str!("../hardware/h100-80gb-hbm3-driver-580.159.04.json"),
    ),
    (
        "H200-141GB",
        "h200-driver-580.159.04.json",
        include_str!("../hardware/h200-driver-580.159.04.json"),
    ),
];

#[test]
fn the_built_in_tables_match_what_real_gpus_report() {
    let catalog = Catalog::builtin();
    for (model, file, text) in CAPTURES {
        let capture: Capture = serde_json::from_str(text).unwrap();
        let gpu = &capture.inventory.gpus[0];
        let builtin = catalog
            .get(&gpu.name)
            .unwrap_or_else(|| panic!("{file}: {:?} does not resolve", gpu.name));
        assert_eq!(builtin.name(), *model, "{file}");
        // Read with MIG disabled: the table and placements are there all the same.
        assert_eq!(gpu.profiles.len(), builtin.profiles().len(), "{file}");
        let read = model_from_profiles(&gpu.name, &gpu.profiles).unwrap();
        assert_eq!(
            builtin.differences_from(&read),
            Vec::<String>::new(),
            "{file}"
        );
        // The whole GPU's memory exceeds its largest instance's (driver reserve).
        assert!(gpu.memory_mib > builtin.memory_mib(), "{file}");
        let sample = &capture.samples[0];
        assert_eq!(sample.gpu_uuid, gpu.uuid, "{file}");
        assert_eq!(sample.memory_total_mib, Some(gpu.memory_mib), "{file}");
    }
}
