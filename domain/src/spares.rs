//! Hot spares (docs/operations.md, "Hot spares"): per GPU model, platform admins keep a
//! number of GPUs (or a percentage of the model's in-service GPUs) idle. Ordinary work is
//! not placed on them; a high-priority allocation displaced from a GPU that turned
//! unhealthy, or from a node that was lost, is placed on one first. The pool is chosen
//! anew each scheduler pass among idle GPUs, so it refills as capacity frees.
//!
//! The rules here are pure: validation, how many a model keeps, which GPUs they are.

use crate::error::AppError;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The largest share of a model's GPUs that may be kept as spares.
pub const MAX_PERCENT: i64 = 50;
/// The most spares one model may keep (a sanity bound).
pub const MAX_GPUS: i64 = 10_000;

/// What a platform admin asks for one model: either `gpus` or `percent`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SpareRequest {
    /// Keep this many GPUs of the model as spares (0 keeps none).
    #[serde(default)]
    pub gpus: Option<i64>,
    /// Keep this percentage (0–50) of the model's in-service GPUs, rounded up.
    #[serde(default)]
    pub percent: Option<i64>,
}

/// A valid rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpareRule {
    Gpus(u32),
    Percent(u32),
}

impl SpareRule {
    /// Checks a request; errors name the field.
    pub fn validate(req: &SpareRequest) -> Result<SpareRule, AppError> {
        match (req.gpus, req.percent) {
            (Some(_), Some(_)) => Err(AppError::invalid(
                "percent",
                "give either gpus or percent, not both",
            )),
            (None, None) => Err(AppError::invalid(
                "gpus",
                "give the number of spare GPUs (gpus) or a percentage (percent)",
            )),
            (Some(n), None) => {
                if !(0..=MAX_GPUS).contains(&n) {
                    return Err(AppError::invalid(
                        "gpus",
                        format!("gpus must be between 0 and {MAX_GPUS}"),
                    ));
                }
                Ok(SpareRule::Gpus(u32::try_from(n).unwrap_or(0)))
            }
            (None, Some(p)) => {
                if !(0..=MAX_PERCENT).contains(&p) {
                    return Err(AppError::invalid(
                        "percent",
                        format!("percent must be between 0 and {MAX_PERCENT}"),
                    ));
                }
                Ok(SpareRule::Percent(u32::try_from(p).unwrap_or(0)))
            }
        }
    }

    /// How many spares the model keeps when it has `in_service` GPUs (online, neither
    /// drained nor unhealthy, not shared): never more than it has.
    pub fn wanted(self, in_service: u32) -> u32 {
        match self {
            SpareRule::Gpus(n) => n.min(in_service),
            SpareRule::Percent(p) => (p * in_service).div_ceil(100).min(in_service),
        }
    }

    pub fn gpus(self) -> Option<u32> {
        match self {
            SpareRule::Gpus(n) => Some(n),
            SpareRule::Percent(_) => None,
        }
    }

    pub fn percent(self) -> Option<u32> {
        match self {
            SpareRule::Percent(p) => Some(p),
            SpareRule::Gpus(_) => None,
        }
    }
}

/// A GPU that may be a spare: online, in service (not drained, not unhealthy), of a known
/// model, not shared by an admin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub uuid: String,
    pub model: String,
    pub hostname: String,
    pub index: u32,
    /// No allocation holds it (or an instance of it) and no process runs on it.
    pub idle: bool,
    /// It was a spare in the last pass (kept first, so the pool does not wander).
    pub was_spare: bool,
}

/// The pool of one model in one pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelPool {
    /// How many spares the rule asks for now.
    pub wanted: u32,
    /// The GPUs kept as spares (idle ones only: at most `wanted`).
    pub gpus: Vec<String>,
}

impl ModelPool {
    /// Spares missing because too few GPUs are idle (the pool refills as work ends).
    pub fn short(&self) -> u32 {
        self.wanted
            .saturating_sub(u32::try_from(self.gpus.len()).unwrap_or(u32::MAX))
    }
}

/// Which GPUs are spares: per model with a rule, `wanted` of its in-service GPUs, chosen
/// among the idle ones, last pass's spares first, then by (hostname, index).
pub fn choose(
    rules: &BTreeMap<String, SpareRule>,
    candidates: &[Candidate],
) -> BTreeMap<String, ModelPool> {
    let mut out = BTreeMap::new();
    for (model, rule) in rules {
        let mut of_model: Vec<&Candidate> =
            candidates.iter().filter(|c| &c.model == model).collect();
        let wanted = rule.wanted(u32::try_from(of_model.len()).unwrap_or(u32::MAX));
        of_model.retain(|c| c.idle);
        of_model.sort_by(|a, b| {
            (!a.was_spare, &a.hostname, a.index).cmp(&(!b.was_spare, &b.hostname, b.index))
        });
        let gpus = of_model
            .into_iter()
            .take(usize::try_from(wanted).unwrap_or(0))
            .map(|c| c.uuid.clone())
            .collect();
        out.insert(model.clone(), ModelPool { wanted, gpus });
    }
    out
}

/// Every spare GPU's UUID in `pools`.
pub fn spare_set(pools: &BTreeMap<String, ModelPool>) -> BTreeSet<String> {
    pools
        .values()
        .flat_map(|p| p.gpus.iter().cloned())
        .collect()
}

/// One model's spares as platform admins see them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SpareView {
    pub model: String,
    /// The rule: a number of GPUs, or a percentage of the model's in-service GPUs.
    pub gpus: Option<u32>,
    pub percent: Option<u32>,
    /// How many the rule asks for now (as of the last scheduler pass).
    pub wanted: u32,
    /// The GPUs kept idle as spares now (`GPU-…`); fewer than `wanted` while the pool is
    /// short (it refills as capacity frees).
    pub spare_gpus: Vec<String>,
    pub updated_by: Option<String>,
    pub updated_at: DateTime<Utc>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(gpus: Option<i64>, percent: Option<i64>) -> SpareRequest {
        SpareRequest { gpus, percent }
    }

    fn field(e: AppError) -> String {
        e.field().unwrap_or_default().to_owned()
    }

    #[test]
    fn validation_names_the_field() {
        assert_eq!(
            SpareRule::validate(&req(Some(2), None)),
            Ok(SpareRule::Gpus(2))
        );
        assert_eq!(
            SpareRule::validate(&req(None, Some(10))),
            Ok(SpareRule::Percent(10))
        );
        assert_eq!(
            field(SpareRule::validate(&req(Some(-1), None)).expect_err("refused")),
            "gpus"
        );
        assert_eq!(
            field(SpareRule::validate(&req(None, Some(51))).expect_err("refused")),
            "percent"
        );
        assert_eq!(
            field(SpareRule::validate(&req(None, Some(-5))).expect_err("refused")),
            "percent"
        );
        assert_eq!(
            field(SpareRule::validate(&req(Some(1), Some(1))).expect_err("refused")),
            "percent"
        );
        assert_eq!(
            field(SpareRule::validate(&req(None, None)).expect_err("refused")),
            "gpus"
        );
    }

    #[test]
    fn wanted_is_bounded_by_the_gpus_in_service() {
        assert_eq!(SpareRule::Gpus(3).wanted(2), 2);
        assert_eq!(SpareRule::Gpus(1).wanted(8), 1);
        // 10 % of 8 is 0.8: rounded up, one spare.
        assert_eq!(SpareRule::Percent(10).wanted(8), 1);
        assert_eq!(SpareRule::Percent(10).wanted(20), 2);
        assert_eq!(SpareRule::Percent(10).wanted(21), 3);
        assert_eq!(SpareRule::Percent(0).wanted(21), 0);
        assert_eq!(SpareRule::Percent(50).wanted(0), 0);
    }

    fn c(host: &str, index: u32, idle: bool, was: bool) -> Candidate {
        Candidate {
            uuid: format!("GPU-{host}-{index}"),
            model: "H100-80GB".into(),
            hostname: host.into(),
            index,
            idle,
            was_spare: was,
        }
    }

    #[test]
    fn spares_are_idle_gpus_in_a_stable_order() {
        let rules = BTreeMap::from([("H100-80GB".to_owned(), SpareRule::Gpus(2))]);
        let gpus = [
            c("b", 0, true, false),
            c("a", 1, true, false),
            c("a", 0, false, false),
            c("b", 1, true, false),
        ];
        let pools = choose(&rules, &gpus);
        let p = &pools["H100-80GB"];
        assert_eq!(p.wanted, 2);
        assert_eq!(p.gpus, ["GPU-a-1", "GPU-b-0"]);
        assert_eq!(p.short(), 0);
        // Last pass's spares stay spares although an earlier GPU freed.
        let gpus = [
            c("a", 0, true, false),
            c("a", 1, true, true),
            c("b", 0, true, true),
        ];
        assert_eq!(
            choose(&rules, &gpus)["H100-80GB"].gpus,
            ["GPU-a-1", "GPU-b-0"]
        );
        // Too few idle: the pool is short, and refills when one frees.
        let busy = [
            c("a", 0, false, false),
            c("a", 1, true, true),
            c("b", 0, false, false),
        ];
        let p = &choose(&rules, &busy)["H100-80GB"];
        assert_eq!((p.gpus.len(), p.short()), (1, 1));
        // Models without a rule keep none; other models' GPUs do not count.
        let other = Candidate {
            model: "A100-SXM4-40GB".into(),
            ..c("z", 0, true, false)
        };
        let pools = choose(&rules, &[other]);
        assert_eq!(pools["H100-80GB"].wanted, 0);
        assert!(spare_set(&pools).is_empty());
    }
}
