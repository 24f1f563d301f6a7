//! Per-model profile tables and the built-in catalog.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Where a GPU instance may start and how many memory slices it covers, as
/// NVML's `nvmlGpuInstancePlacement_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Placement {
    pub start: u8,
    pub size: u8,
}

/// One GPU-instance profile as the driver reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Profile {
    /// NVML profile ID (`info.id`, what nvidia-smi prints), not the
    /// `NVML_GPU_INSTANCE_PROFILE_*` index. IDs differ between GPU families.
    pub id: u32,
    /// e.g. `1g.10gb`, `1g.10gb+me`.
    pub name: String,
    pub compute_slices: u8,
    pub memory_slices: u8,
    /// `instanceCount`: at most this many instances of the profile per GPU.
    pub max_count: u8,
    pub placements: Vec<Placement>,
    /// Memory of one instance as reported by the driver (`memorySizeMB`);
    /// the built-in values are from `-lgip` captures and vary by driver.
    pub memory_mib: u64,
}

/// Most profiles one model may have (RTX PRO Blackwell has 11).
pub const MAX_PROFILES: usize = 16;

/// Index of a profile inside its [`GpuModel`]; cheap to copy and compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ProfileIdx(pub u8);

/// A GPU model and its MIG profile table (empty for a GPU without MIG, such as a T4: one
/// slice, handed out whole or shared). Valid by construction: every placement lies inside
/// the GPU and has its profile's size, names and IDs are unique, and the memory fits a
/// 32-bit slice mask.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "GpuModelSpec", into = "GpuModelSpec")]
pub struct GpuModel {
    name: String,
    memory_slices: u8,
    compute_slices: u8,
    profiles: Vec<Profile>,
    /// The whole GPU's memory when known apart from the profiles (GPUs without MIG);
    /// 0: the largest profile's.
    memory_mib: u64,
}

/// The unchecked wire form of a [`GpuModel`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GpuModelSpec {
    pub name: String,
    pub memory_slices: u8,
    pub compute_slices: u8,
    pub profiles: Vec<Profile>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub memory_mib: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    #[error("model {model}: memory_slices must be 1..=32 and compute_slices at least 1")]
    BadGeometry { model: String },
    #[error("model {model}: profile {profile} appears twice (name or id)")]
    DuplicateProfile { model: String, profile: String },
    #[error("model {model}: too many profiles (at most {MAX_PROFILES})")]
    TooManyProfiles { model: String },
    #[error("model {model}: profile {profile}: {reason}")]
    BadProfile {
        model: String,
        profile: String,
        reason: String,
    },
}

impl TryFrom<GpuModelSpec> for GpuModel {
    type Error = CatalogError;
    fn try_from(spec: GpuModelSpec) -> Result<Self, Self::Error> {
        let mut m = GpuModel::new(
            spec.name,
            spec.memory_slices,
            spec.compute_slices,
            spec.profiles,
        )?;
        m.memory_mib = spec.memory_mib;
        Ok(m)
    }
}

impl From<GpuModel> for GpuModelSpec {
    fn from(m: GpuModel) -> Self {
        GpuModelSpec {
            name: m.name,
            memory_slices: m.memory_slices,
            compute_slices: m.compute_slices,
            profiles: m.profiles,
            memory_mib: m.memory_mib,
        }
    }
}

impl GpuModel {
    /// Builds a model from a profile table, e.g. one read from NVML
    /// (`GetGpuInstanceProfileInfoV` + `GetGpuInstancePossiblePlacements_v2`).
    pub fn new(
        name: impl Into<String>,
        memory_slices: u8,
        compute_slices: u8,
        profiles: Vec<Profile>,
    ) -> Result<Self, CatalogError> {
        let name = name.into();
        if memory_slices == 0 || memory_slices > 32 || compute_slices == 0 {
            return Err(CatalogError::BadGeometry { model: name });
        }
        if profiles.len() > MAX_PROFILES {
            return Err(CatalogError::TooManyProfiles { model: name });
        }
        for (i, p) in profiles.iter().enumerate() {
            let bad = |reason: &str| CatalogError::BadProfile {
                model: name.clone(),
                profile: p.name.clone(),
                reason: reason.to_owned(),
            };
            if p.name.is_empty() {
                return Err(bad("empty name"));
            }
            if p.compute_slices == 0 || p.compute_slices > compute_slices {
                return Err(bad("compute_slices out of range"));
            }
            if p.memory_slices == 0 || p.memory_slices > memory_slices {
                return Err(bad("memory_slices out of range"));
            }
            if p.max_count == 0 {
                return Err(bad("max_count is 0"));
            }
            if p.placements.is_empty() {
                return Err(bad("no placements"));
            }
            for pl in &p.placements {
                if pl.size != p.memory_slices {
                    return Err(bad("placement size differs from memory_slices"));
                }
                if u16::from(pl.start) + u16::from(pl.size) > u16::from(memory_slices) {
                    return Err(bad("placement runs past the last memory slice"));
                }
            }
            if profiles[..i]
                .iter()
                .any(|q| q.name == p.name || q.id == p.id)
            {
                return Err(CatalogError::DuplicateProfile {
                    model: name.clone(),
                    profile: p.name.clone(),
                });
            }
        }
        let mut profiles = profiles;
        for p in &mut profiles {
            p.placements.sort();
            p.placements.dedup();
        }
        Ok(GpuModel {
            name,
            memory_slices,
            compute_slices,
            profiles,
            memory_mib: 0,
        })
    }

    /// A GPU without MIG (T4, L4, A10): one slice, handed out whole or shared.
    pub fn without_mig(name: impl Into<String>, memory_mib: u64) -> Self {
        GpuModel {
            name: name.into(),
            memory_slices: 1,
            compute_slices: 1,
            profiles: Vec::new(),
            memory_mib,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the model can be partitioned with MIG (it has a profile table).
    pub fn has_mig(&self) -> bool {
        !self.profiles.is_empty()
    }

    /// The whole GPU's memory: as given for a GPU without MIG, else its largest
    /// profile's (what workloads can use).
    pub fn memory_mib(&self) -> u64 {
        if self.memory_mib > 0 {
            return self.memory_mib;
        }
        self.profiles
            .iter()
            .map(|p| p.memory_mib)
            .max()
            .unwrap_or(0)
    }
    pub fn memory_slices(&self) -> u8 {
        self.memory_slices
    }
    pub fn compute_slices(&self) -> u8 {
        self.compute_slices
    }
    pub fn profiles(&self) -> &[Profile] {
        &self.profiles
    }

    /// Iterates `(index, profile)` pairs.
    pub fn indexed(&self) -> impl Iterator<Item = (ProfileIdx, &Profile)> {
        // `new` caps the table at MAX_PROFILES, so the index fits in a u8.
        self.profiles
            .iter()
            .enumerate()
            .map(|(i, p)| (ProfileIdx(i as u8), p))
    }

    pub fn profile(&self, idx: ProfileIdx) -> &Profile {
        &self.profiles[usize::from(idx.0)]
    }

    pub fn profile_by_name(&self, name: &str) -> Option<(ProfileIdx, &Profile)> {
        self.indexed().find(|(_, p)| p.name == name)
    }

    pub fn profile_by_id(&self, id: u32) -> Option<(ProfileIdx, &Profile)> {
        self.indexed().find(|(_, p)| p.id == id)
    }

    /// Bit mask of all memory slices.
    pub fn full_mask(&self) -> u32 {
        if self.memory_slices == 32 {
            u32::MAX
        } else {
            (1u32 << self.memory_slices) - 1
        }
    }

    /// How a table read from a device differs from this one (the built-in table of
    /// its model), one line per difference; empty when they agree. Memory sizes
    /// vary by driver, so they are compared too and named like any other field.
    pub fn differences_from(&self, read: &GpuModel) -> Vec<String> {
        let mut out = Vec::new();
        if (self.memory_slices, self.compute_slices) != (read.memory_slices, read.compute_slices) {
            out.push(format!(
                "geometry: built-in {} memory / {} compute slices, device {} / {}",
                self.memory_slices, self.compute_slices, read.memory_slices, read.compute_slices
            ));
        }
        for p in &self.profiles {
            let Some((_, q)) = read.profile_by_id(p.id) else {
                out.push(format!(
                    "profile {} {}: not offered by the device",
                    p.id, p.name
                ));
                continue;
            };
            let mut field = |what: &str, ours: String, theirs: String| {
                if ours != theirs {
                    out.push(format!(
                        "profile {} {}: {what} built-in {ours}, device {theirs}",
                        p.id, p.name
                    ));
                }
            };
            field("name", p.name.clone(), q.name.clone());
            field(
                "slices (compute/memory)",
                format!("{}/{}", p.compute_slices, p.memory_slices),
                format!("{}/{}", q.compute_slices, q.memory_slices),
            );
            field(
                "max count",
                p.max_count.to_string(),
                q.max_count.to_string(),
            );
            field("placements", starts(&p.placements), starts(&q.placements));
            field(
                "memory MiB",
                p.memory_mib.to_string(),
                q.memory_mib.to_string(),
            );
        }
        for q in &read.profiles {
            if self.profile_by_id(q.id).is_none() {
                out.push(format!(
                    "profile {} {}: offered by the device, not built in",
                    q.id, q.name
                ));
            }
        }
        out
    }
}

fn starts(placements: &[Placement]) -> String {
    let s: Vec<String> = placements.iter().map(|p| p.start.to_string()).collect();
    format!("{{{}}}", s.join(","))
}

/// Memory-slice bit mask of `size` slices from `start`.
pub(crate) fn range_mask(start: u8, size: u8) -> u32 {
    let ones = if size >= 32 {
        u32::MAX
    } else {
        (1u32 << size) - 1
    };
    ones.checked_shl(u32::from(start)).unwrap_or(0)
}

/// The models Tessera knows, by canonical name, plus aliases (PCIe/SXM and
/// driver spellings). Tables read at runtime replace built-in ones.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catalog {
    models: BTreeMap<String, GpuModel>,
    /// Each model's normalised name → its name (looked up per GPU, many times a pass).
    #[serde(default)]
    normalised: BTreeMap<String, String>,
    aliases: BTreeMap<String, String>,
}

impl Catalog {
    pub fn empty() -> Self {
        Self::default()
    }

    /// A30-24GB, A100-SXM4-40GB, A100-80GB, H100-80GB, H100-94GB, H200-141GB
    /// and B200-180GB, from `shared/reference/mig.md` §1.2; and, without MIG (whole
    /// or shared only), T4-16GB, L4-24GB and A10-24GB.
    pub fn builtin() -> Self {
        let mut c = Catalog::empty();
        for m in builtin_models() {
            c.insert(m);
        }
        let aliases: &[(&str, &str)] = &[
            ("A30", "A30-24GB"),
            ("A30-PCIE-24GB", "A30-24GB"),
            ("A100-40GB", "A100-SXM4-40GB"),
            ("A100-PCIE-40GB", "A100-SXM4-40GB"),
            ("A100-SXM4-80GB", "A100-80GB"),
            ("A100-PCIE-80GB", "A100-80GB"),
            ("A100-80GB-PCIE", "A100-80GB"),
            ("H100-SXM5-80GB", "H100-80GB"),
            ("H100-PCIE-80GB", "H100-80GB"),
            ("H100-80GB-HBM3", "H100-80GB"),
            ("H100-PCIE", "H100-80GB"),
            ("H100-NVL", "H100-94GB"),
            ("H100-SXM5-94GB", "H100-94GB"),
            ("H200", "H200-141GB"),
            ("H200-SXM5-141GB", "H200-141GB"),
            ("H200-NVL", "H200-141GB"),
            ("B200", "B200-180GB"),
            ("T4", "T4-16GB"),
            ("TESLA-T4", "T4-16GB"),
            ("L4", "L4-24GB"),
            ("A10", "A10-24GB"),
        ];
        for (alias, canonical) in aliases {
            c.aliases.insert(normalise(alias), (*canonical).to_owned());
        }
        c
    }

    /// Adds or replaces a model (a table read from the device wins over the
    /// built-in one of the same name).
    pub fn insert(&mut self, model: GpuModel) {
        self.normalised
            .insert(normalise(&model.name), model.name.clone());
        self.models.insert(model.name.clone(), model);
    }

    /// Looks a model up by canonical name, alias or driver spelling
    /// (`"NVIDIA A100-SXM4-40GB"`, `"NVIDIA H100 80GB HBM3"`).
    pub fn get(&self, name: &str) -> Option<&GpuModel> {
        if let Some(m) = self.models.get(name) {
            return Some(m);
        }
        let key = normalise(name);
        if let Some(m) = self
            .normalised
            .get(&key)
            .or_else(|| self.aliases.get(&key))
            .and_then(|c| self.models.get(c))
        {
            return Some(m);
        }
        // A catalog deserialized without the index still finds its models.
        self.models.values().find(|m| normalise(&m.name) == key)
    }

    pub fn models(&self) -> impl Iterator<Item = &GpuModel> {
        self.models.values()
    }
}

fn normalise(name: &str) -> String {
    let upper = name.trim().to_ascii_uppercase();
    let stripped = upper.strip_prefix("NVIDIA").unwrap_or(&upper).trim();
    stripped
        .chars()
        .map(|c| if c == ' ' || c == '_' { '-' } else { c })
        .collect()
}

fn gib_to_mib(thousandths_gib: u64) -> u64 {
    (thousandths_gib * 1024 + 500) / 1000
}

fn profile(id: u32, name: &str, g: u8, mem: u8, max: u8, starts: &[u8], gib_x1000: u64) -> Profile {
    Profile {
        id,
        name: name.to_owned(),
        compute_slices: g,
        memory_slices: mem,
        max_count: max,
        placements: starts
            .iter()
            .map(|&start| Placement { start, size: mem })
            .collect(),
        memory_mib: gib_to_mib(gib_x1000),
    }
}

/// The A100/H100/H200/B200 family share IDs and slice structure (8 memory,
/// 7 compute slices); only names and memory differ. `gib` holds the GiB of
/// 1 slice, 2 slices, 4 slices and 8 slices (×1000).
/// Boards with seven compute slices, after A100-40GB: the model, the memory in the names of
/// its 1-, 2-, 4- and 8-slice-memory profiles, and their memory (MiB).
#[rustfmt::skip]
const SEVEN_SLICE: [(&str, [&str; 4], [u64; 4]); 5] = [
    // 7g memory is unverified for A100-80GB; 79.25 GiB as on H100-80GB.
    ("A100-80GB", ["10gb", "20gb", "40gb", "80gb"], [9500, 19500, 39250, 79250]),
    // Read from an H100 80GB HBM3 on driver 580.159.04 (tests/hardware/).
    ("H100-80GB", ["10gb", "20gb", "40gb", "80gb"], [9750, 19625, 39500, 79250]),
    ("H100-94GB", ["12gb", "24gb", "47gb", "94gb"], [10750, 21620, 46380, 93120]),
    // Read from an H200 on driver 580.159.04 (tests/hardware/).
    ("H200-141GB", ["18gb", "35gb", "71gb", "141gb"], [16000, 32500, 69750, 140000]),
    // B200 placements and the 3g/4g/7g memory are not published; derived from the shared
    // slice structure (mig.md §1.2, §6).
    ("B200-180GB", ["23gb", "45gb", "90gb", "180gb"], [20500, 44250, 88500, 177000]),
];

fn seven_slice(name: &str, mem_names: [&str; 4], gib: [u64; 4]) -> GpuModel {
    let [m1, m2, m4, m8] = mem_names;
    let profiles = vec![
        profile(
            19,
            &format!("1g.{m1}"),
            1,
            1,
            7,
            &[0, 1, 2, 3, 4, 5, 6],
            gib[0],
        ),
        profile(
            20,
            &format!("1g.{m1}+me"),
            1,
            1,
            1,
            &[0, 1, 2, 3, 4, 5, 6],
            gib[0],
        ),
        profile(15, &format!("1g.{m2}"), 1, 2, 4, &[0, 2, 4, 6], gib[1]),
        profile(14, &format!("2g.{m2}"), 2, 2, 3, &[0, 2, 4], gib[1]),
        profile(9, &format!("3g.{m4}"), 3, 4, 2, &[0, 4], gib[2]),
        profile(5, &format!("4g.{m4}"), 4, 4, 1, &[0], gib[2]),
        profile(0, &format!("7g.{m8}"), 7, 8, 1, &[0], gib[3]),
    ];
    GpuModel {
        name: name.to_owned(),
        memory_slices: 8,
        compute_slices: 7,
        profiles,
        memory_mib: 0,
    }
}

fn builtin_models() -> Vec<GpuModel> {
    let a30 = GpuModel {
        name: "A30-24GB".to_owned(),
        memory_slices: 4,
        compute_slices: 4,
        profiles: vec![
            profile(14, "1g.6gb", 1, 1, 4, &[0, 1, 2, 3], 5810),
            profile(21, "1g.6gb+me", 1, 1, 1, &[0, 1, 2, 3], 5810),
            profile(5, "2g.12gb", 2, 2, 2, &[0, 2], 11690),
            profile(6, "2g.12gb+me", 2, 2, 1, &[0, 2], 11690),
            profile(0, "4g.24gb", 4, 4, 1, &[0], 23440),
        ],
        memory_mib: 0,
    };
    // A100-40GB has "1g.5gb" and "1g.10gb" where the others have 1g.Ngb and
    // 1g.2Ngb; its 1-slice and 2-slice memory names differ from the pattern.
    let mut a100_40 = seven_slice(
        "A100-SXM4-40GB",
        ["5gb", "10gb", "20gb", "40gb"],
        [4750, 9620, 19500, 39250],
    );
    a100_40.profiles[2].name = "1g.10gb".to_owned();
    a100_40.profiles[3].name = "2g.10gb".to_owned();
    let mut models = vec![a30, a100_40];
    models.extend(
        SEVEN_SLICE
            .iter()
            .map(|(name, mem, mib)| seven_slice(name, *mem, *mib)),
    );
    // Without MIG: whole GPUs and shares only. Memory as the driver reports it
    // (`memory.total`, MiB) on common boards.
    models.extend([
        GpuModel::without_mig("T4-16GB", 15_360),
        GpuModel::without_mig("L4-24GB", 23_034),
        GpuModel::without_mig("A10-24GB", 23_028),
    ]);
    models
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_device_table_is_compared_field_by_field_with_the_built_in_one() {
        let cat = Catalog::builtin();
        let h100 = cat.get("H100-80GB").unwrap();
        assert!(h100.differences_from(h100).is_empty());

        let mut read = h100.clone();
        read.profiles[0].max_count = 6; // 1g.10gb
        read.profiles[0].memory_mib += 256;
        read.profiles.retain(|p| p.id != 5); // no 4g.40gb
        let mut extra = read.profiles[0].clone();
        extra.id = 47;
        extra.name = "1g.10gb+gfx".to_owned();
        read.profiles.push(extra);
        let read = GpuModel::new("H100-80GB", 8, 7, read.profiles).unwrap();
        let diffs = h100.differences_from(&read);
        assert_eq!(
            diffs,
            vec![
                "profile 19 1g.10gb: max count built-in 7, device 6".to_owned(),
                format!(
                    "profile 19 1g.10gb: memory MiB built-in {}, device {}",
                    h100.profiles[0].memory_mib,
                    h100.profiles[0].memory_mib + 256
                ),
                "profile 5 4g.40gb: not offered by the device".to_owned(),
                "profile 47 1g.10gb+gfx: offered by the device, not built in".to_owned(),
            ]
        );
        let a30 = cat.get("A30-24GB").unwrap();
        assert!(
            h100.differences_from(a30)[0]
                .starts_with("geometry: built-in 8 memory / 7 compute slices, device 4 / 4")
        );
    }

    #[test]
    fn builtin_tables_are_valid_by_construction() {
        for m in Catalog::builtin().models() {
            let again = GpuModel::try_from(GpuModelSpec::from(m.clone()));
            assert_eq!(again.as_ref(), Ok(m), "{}", m.name());
            assert!(m.memory_mib() > 0, "{}", m.name());
        }
        let t4 = Catalog::builtin();
        let t4 = t4.get("Tesla T4").expect("T4 by its driver name");
        assert_eq!(
            (t4.name(), t4.has_mig(), t4.memory_mib()),
            ("T4-16GB", false, 15_360)
        );
    }

    #[test]
    fn lookup_accepts_driver_spellings() {
        let c = Catalog::builtin();
        assert_eq!(
            c.get("NVIDIA A100-SXM4-40GB").map(GpuModel::name),
            Some("A100-SXM4-40GB")
        );
        assert_eq!(
            c.get("NVIDIA H100 80GB HBM3").map(GpuModel::name),
            Some("H100-80GB")
        );
        assert_eq!(c.get("h100 nvl").map(GpuModel::name), Some("H100-94GB"));
        assert!(c.get("V100-32GB").is_none());
    }

    #[test]
    fn ids_differ_between_families() {
        let c = Catalog::builtin();
        let a30 = c.get("A30-24GB").unwrap();
        let a100 = c.get("A100-SXM4-40GB").unwrap();
        let h100 = c.get("H100-80GB").unwrap();
        assert_eq!(a30.profile_by_id(5).unwrap().1.name, "2g.12gb");
        assert_eq!(a100.profile_by_id(5).unwrap().1.name, "4g.20gb");
        assert_eq!(a100.profile_by_name("1g.10gb").unwrap().1.id, 15);
        assert_eq!(h100.profile_by_name("1g.10gb").unwrap().1.id, 19);
        assert_eq!(
            h100.profile_by_name("3g.40gb").unwrap().1.placements.len(),
            2
        );
    }

    #[test]
    fn runtime_table_replaces_builtin_and_is_checked() {
        let mut c = Catalog::builtin();
        let mut table = c.get("H100-80GB").unwrap().profiles().to_vec();
        table.truncate(1);
        let m = GpuModel::new("H100-80GB", 8, 7, table.clone()).unwrap();
        c.insert(m);
        assert_eq!(c.get("H100-80GB").unwrap().profiles().len(), 1);

        table[0].placements.push(Placement { start: 7, size: 2 });
        let err = GpuModel::new("X", 8, 7, table).unwrap_err();
        assert!(err.to_string().contains("1g.10gb"), "{err}");
    }

    #[test]
    fn models_round_trip_through_json() {
        let c = Catalog::builtin();
        let m = c.get("A30-24GB").unwrap();
        let json = serde_json::to_string(m).unwrap();
        let back: GpuModel = serde_json::from_str(&json).unwrap();
        assert_eq!(&back, m);
        let bad = json.replace(
            "\"memory_slices\":4,\"compute",
            "\"memory_slices\":0,\"compute",
        );
        assert!(serde_json::from_str::<GpuModel>(&bad).is_err());
    }
}
