//! component-base's `--feature-gates`: `Name=bool` pairs, comma separated,
//! each naming a gate the component knows. One parser for every module;
//! each module reads its typed gates from the [`FeatureGates`] it returns.

use super::goflags::parse_go_bool;

/// The gates a component knows, each with its default.
pub type KnownGates = &'static [(&'static str, bool)];

/// Why a `--feature-gates` value was refused (component-base's texts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    #[error("missing bool value for {0}")]
    MissingValue(String),
    #[error("invalid value of {0}")]
    InvalidValue(String),
    #[error("unrecognized feature gate: {0}")]
    Unknown(String),
}

/// The gates in effect: the known gates' defaults, overridden by the
/// values given (the last one of a gate wins).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeatureGates {
    known: KnownGates,
    given: Vec<(&'static str, bool)>,
}

/// Parses a `--feature-gates` value against the gates a component knows.
pub fn parse(value: &str, known: KnownGates) -> Result<FeatureGates, GateError> {
    let mut given = Vec::new();
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, v) = part.split_once('=').ok_or_else(|| GateError::MissingValue(part.to_string()))?;
        let name = name.trim();
        let Some(&(gate, _)) = known.iter().find(|(g, _)| *g == name) else {
            return Err(GateError::Unknown(name.to_string()));
        };
        let on = parse_go_bool(v.trim()).map_err(|_| GateError::InvalidValue(part.to_string()))?;
        given.push((gate, on));
    }
    Ok(FeatureGates { known, given })
}

impl FeatureGates {
    /// The gate's value given on the command line, if it was.
    pub fn explicit(&self, gate: &str) -> Option<bool> {
        self.given.iter().rev().find(|(g, _)| *g == gate).map(|(_, on)| *on)
    }

    /// Whether the gate is on: as given, else its default (an unknown gate is off).
    pub fn enabled(&self, gate: &str) -> bool {
        self.explicit(gate).or_else(|| self.known.iter().find(|(g, _)| *g == gate).map(|(_, d)| *d)).unwrap_or(false)
    }
}

/// The names of a component's gates.
pub fn names(known: KnownGates) -> impl Iterator<Item = &'static str> {
    known.iter().map(|(g, _)| *g)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KNOWN: KnownGates = &[("On", true), ("Off", false)];

    #[test]
    fn defaults_apply_unless_given_and_the_last_value_wins() {
        let g = parse("", KNOWN).unwrap();
        assert!(g.enabled("On") && !g.enabled("Off") && !g.enabled("Other"));
        assert_eq!(g.explicit("On"), None);
        let g = parse(" Off=true, On=false ,Off=false", KNOWN).unwrap();
        assert_eq!((g.enabled("On"), g.explicit("Off")), (false, Some(false)));
    }

    #[test]
    fn component_base_texts_for_bad_values() {
        let err = |s| parse(s, KNOWN).unwrap_err().to_string();
        assert_eq!(err("Nope=true"), "unrecognized feature gate: Nope");
        assert_eq!(err("On"), "missing bool value for On");
        assert_eq!(err("On=maybe"), "invalid value of On=maybe");
    }
}
