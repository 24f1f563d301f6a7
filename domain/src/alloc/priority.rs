//! Priority.

use super::*;

/// How urgent an allocation is; orders as `High > Normal > Preemptible`.
///
/// Who may ask for `High` is an authorization question for the server, not decided here.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum PriorityClass {
    /// Runs on spare capacity and is the first to be preempted.
    Preemptible,
    #[default]
    Normal,
    High,
}

impl PriorityClass {
    pub const ALL: [PriorityClass; 3] = [
        PriorityClass::High,
        PriorityClass::Normal,
        PriorityClass::Preemptible,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PriorityClass::High => "high",
            PriorityClass::Normal => "normal",
            PriorityClass::Preemptible => "preemptible",
        }
    }
}

impl FromStr for PriorityClass {
    type Err = AppError;
    fn from_str(s: &str) -> Result<Self, AppError> {
        match s.trim() {
            "high" => Ok(PriorityClass::High),
            "normal" => Ok(PriorityClass::Normal),
            "preemptible" => Ok(PriorityClass::Preemptible),
            _ => Err(AppError::invalid(
                "priority",
                "must be high, normal or preemptible",
            )),
        }
    }
}

impl fmt::Display for PriorityClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
