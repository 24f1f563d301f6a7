//! Kinds and units.

use super::*;

/// The most milli-GPU one share may have (a whole GPU's worth).
pub const SHARE_MILLI_MAX: u32 = 1000;

/// What one unit of an allocation is. The string form (see the module docs) round-trips
/// through [`FromStr`] and [`Display`](fmt::Display); serde uses it too.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum GpuKind {
    /// A MIG instance of `profile` (e.g. `1g.10gb`).
    Mig { model: String, profile: String },
    /// A whole GPU.
    Whole { model: String },
    /// `milli` (1..=1000) milli-GPU of a time-shared GPU.
    Share { model: String, milli: u32 },
}

const KIND_FORMAT: &str =
    "use MODEL:PROFILE, MODEL:whole or MODEL:share:MILLI, e.g. H100-80GB:1g.10gb";

fn share_range_error() -> AppError {
    AppError::invalid(
        "kind",
        "a share is 1 to 1000 milli-GPU, e.g. H100-80GB:share:250",
    )
}

impl FromStr for GpuKind {
    type Err = AppError;

    /// Parses the syntax only; [`GpuKind::canonical`] checks it against a catalog.
    fn from_str(s: &str) -> Result<Self, AppError> {
        let s = s.trim();
        if s.is_empty() {
            return Err(AppError::invalid("kind", "is required"));
        }
        let bad = || AppError::invalid("kind", KIND_FORMAT);
        let mut parts = s.split(':').map(str::trim);
        let model = parts
            .next()
            .filter(|m| !m.is_empty())
            .ok_or_else(bad)?
            .to_owned();
        let what = parts.next().filter(|p| !p.is_empty()).ok_or_else(bad)?;
        let arg = parts.next();
        if parts.next().is_some() {
            return Err(bad());
        }
        match arg {
            None if what.eq_ignore_ascii_case("whole") => Ok(GpuKind::Whole { model }),
            None if what.eq_ignore_ascii_case("share") => Err(share_range_error()),
            None => Ok(GpuKind::Mig {
                model,
                profile: what.to_owned(),
            }),
            Some(milli) if what.eq_ignore_ascii_case("share") => {
                let milli = milli
                    .parse::<u32>()
                    .ok()
                    .filter(|m| (1..=SHARE_MILLI_MAX).contains(m))
                    .ok_or_else(share_range_error)?;
                Ok(GpuKind::Share { model, milli })
            }
            Some(_) => Err(bad()),
        }
    }
}

impl fmt::Display for GpuKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuKind::Mig { model, profile } => write!(f, "{model}:{profile}"),
            GpuKind::Whole { model } => write!(f, "{model}:whole"),
            GpuKind::Share { model, milli } => write!(f, "{model}:share:{milli}"),
        }
    }
}

impl TryFrom<String> for GpuKind {
    type Error = AppError;
    fn try_from(s: String) -> Result<Self, AppError> {
        s.parse()
    }
}

impl From<GpuKind> for String {
    fn from(k: GpuKind) -> Self {
        k.to_string()
    }
}

impl GpuKind {
    /// A share's milli-GPU; `None` for other kinds.
    pub fn share_milli(&self) -> Option<u32> {
        match self {
            GpuKind::Share { milli, .. } => Some(*milli),
            _ => None,
        }
    }

    /// The model as written (canonical after [`GpuKind::canonical`]).
    pub fn model(&self) -> &str {
        match self {
            GpuKind::Mig { model, .. }
            | GpuKind::Whole { model }
            | GpuKind::Share { model, .. } => model,
        }
    }

    /// Words for people: `1g.10gb on H100-80GB`, `whole H100-80GB`, `25% share of H100-80GB`.
    pub fn label(&self) -> String {
        match self {
            GpuKind::Mig { model, profile } => format!("{profile} on {model}"),
            GpuKind::Whole { model } => format!("whole {model}"),
            GpuKind::Share { model, milli } => {
                let (whole, tenth) = (milli / 10, milli % 10);
                if tenth == 0 {
                    format!("{whole}% share of {model}")
                } else {
                    format!("{whole}.{tenth}% share of {model}")
                }
            }
        }
    }

    /// The same kind with the catalog's spelling of model and profile
    /// (`H100-SXM5-80GB:1G.10GB` → `H100-80GB:1g.10gb`); errors on `kind` if the model
    /// or profile is unknown or a share is out of range.
    pub fn canonical(&self, catalog: &Catalog) -> Result<GpuKind, AppError> {
        let model = find_model(catalog, self.model())?;
        let name = model.name().to_owned();
        Ok(match self {
            GpuKind::Mig { profile, .. } => GpuKind::Mig {
                model: name,
                profile: find_profile(model, profile)?.name.clone(),
            },
            GpuKind::Whole { .. } => GpuKind::Whole { model: name },
            GpuKind::Share { milli, .. } => {
                check_milli(*milli)?;
                GpuKind::Share {
                    model: name,
                    milli: *milli,
                }
            }
        })
    }

    /// The quota line this kind counts against: the model (`H100-80GB`) for MIG slices
    /// and whole GPUs, in compute slices; the model's shared quota (`H100-80GB:shared`)
    /// for shares, in milli-GPU.
    pub fn quota_key(&self) -> String {
        match self {
            GpuKind::Share { model, .. } => shared_quota_key(model),
            GpuKind::Mig { model, .. } | GpuKind::Whole { model } => model.clone(),
        }
    }

    /// Units one of this kind costs on its [`quota_key`](Self::quota_key): compute
    /// slices of its model, or a share's milli-GPU (see the module docs).
    pub fn unit_cost(&self, catalog: &Catalog) -> Result<u32, AppError> {
        let model = find_model(catalog, self.model())?;
        let slices = u32::from(model.compute_slices());
        match self {
            GpuKind::Mig { profile, .. } => {
                Ok(u32::from(find_profile(model, profile)?.compute_slices))
            }
            GpuKind::Whole { .. } => Ok(slices),
            GpuKind::Share { milli, .. } => {
                check_milli(*milli)?;
                Ok(*milli)
            }
        }
    }

    /// Units one whole GPU of this kind's model counts on its quota line: milli-GPU
    /// (1000) for a share, the model's compute slices otherwise (1 for an unknown model),
    /// so `units / units_per_gpu` is the GPUs an allocation holds.
    pub fn units_per_gpu(&self, catalog: &Catalog) -> u32 {
        match self {
            GpuKind::Share { .. } => 1000,
            _ => find_model(catalog, self.model())
                .map_or(1, |m| u32::from(m.compute_slices()).max(1)),
        }
    }

    /// Units `count` of this kind cost against quota.
    pub fn units(&self, count: u32, catalog: &Catalog) -> Result<u32, AppError> {
        self.unit_cost(catalog)?
            .checked_mul(count)
            .ok_or_else(|| AppError::invalid("count", "is too large"))
    }
}

/// The quota line of `model`'s shares (milli-GPU): `H100-80GB:shared`.
pub fn shared_quota_key(model: &str) -> String {
    format!("{model}{SHARED_QUOTA_SUFFIX}")
}

/// What [`shared_quota_key`] appends.
pub const SHARED_QUOTA_SUFFIX: &str = ":shared";

/// The model of a quota line and whether it is the shared one (`H100-80GB:shared` →
/// `("H100-80GB", true)`).
pub fn split_quota_key(key: &str) -> (&str, bool) {
    match key.strip_suffix(SHARED_QUOTA_SUFFIX) {
        Some(model) => (model, true),
        None => (key, false),
    }
}

fn check_milli(milli: u32) -> Result<(), AppError> {
    if (1..=SHARE_MILLI_MAX).contains(&milli) {
        Ok(())
    } else {
        Err(share_range_error())
    }
}

fn find_model<'c>(catalog: &'c Catalog, name: &str) -> Result<&'c GpuModel, AppError> {
    catalog.get(name).ok_or_else(|| {
        let known: Vec<&str> = catalog.models().map(GpuModel::name).collect();
        AppError::invalid(
            "kind",
            format!(
                "unknown GPU model {name}; known models: {}",
                known.join(", ")
            ),
        )
    })
}

fn find_profile<'m>(
    model: &'m GpuModel,
    profile: &str,
) -> Result<&'m crate::mig::Profile, AppError> {
    model
        .profiles()
        .iter()
        .find(|p| p.name.eq_ignore_ascii_case(profile))
        .ok_or_else(|| {
            let offered: Vec<&str> = model.profiles().iter().map(|p| p.name.as_str()).collect();
            AppError::invalid(
                "kind",
                format!(
                    "{} has no MIG profile {profile}; it offers {}",
                    model.name(),
                    offered.join(", ")
                ),
            )
        })
}
