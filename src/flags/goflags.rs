//! Go `flag`/`pflag` command-line syntax, normalised so that argh can parse it.
//!
//! Accepted, as upstream's Go sidecars accept it: `-name` and `--name`,
//! `--name=value` and `--name value`, bare booleans `--x` and `--x=true|false`.
//! Flags are looked up in a table built from argh's own flag descriptions, so
//! there is no second list of flag names.

use std::{fmt, time::Duration};

/// Whether a flag takes a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlagKind {
    /// Go `bool` that defaults to false (an argh switch): `--x`, `--x=true`, `--x=false`.
    Bool,
    /// Go `bool` that defaults to true (an argh option whose `arg_name` is
    /// [`BOOL_ARG`]): the same spellings, passed to argh as `--x true|false`.
    BoolValue,
    /// Every other flag: `--x=v` or `--x v`.
    Value,
}

/// The argh `arg_name` that marks an option as a Go boolean.
pub const BOOL_ARG: &str = "bool";

/// argh parser for [`FlagKind::BoolValue`] options.
pub fn go_bool_value(s: &str) -> Result<bool, String> {
    parse_go_bool(s)
}

/// One flag as written on the command line, after normalisation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GivenFlag {
    /// Name without dashes.
    pub name: String,
    /// The value; `"true"`/`"false"` for booleans.
    pub value: String,
}

/// Where tokenising stopped.
#[derive(Debug, PartialEq, Eq)]
pub struct Tokenized {
    /// The flags, in order of appearance.
    pub flags: Vec<GivenFlag>,
    /// Index of the first token that is not a flag (a module name), if any.
    pub rest: usize,
}

/// A command-line error, worded like Go's `flag` package words it.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum FlagError {
    /// No such flag.
    #[error("flag provided but not defined: -{0}")]
    Unknown(String),
    /// A value flag at the end of the line.
    #[error("flag needs an argument: -{0}")]
    MissingValue(String),
    /// A value that does not parse.
    #[error("invalid value {value:?} for flag -{flag}: {reason}")]
    BadValue {
        /// The flag.
        flag: String,
        /// What was given.
        value: String,
        /// Why it was refused.
        reason: String,
    },
    /// A stray positional argument.
    #[error("unexpected argument {0:?}")]
    Unexpected(String),
}

/// Splits `args` into flags until the first non-flag token.
///
/// `kind_of` answers `None` for an unknown flag. A `--` token ends the flags.
pub fn tokenize(args: &[String], kind_of: impl Fn(&str) -> Option<FlagKind>) -> Result<Tokenized, FlagError> {
    let mut flags = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        if arg == "--" {
            return Ok(Tokenized { flags, rest: i + 1 });
        }
        let Some(body) = arg
            .strip_prefix("--")
            .or_else(|| arg.strip_prefix('-'))
            .filter(|b| !b.is_empty() && !arg.starts_with("---"))
        else {
            return Ok(Tokenized { flags, rest: i });
        };
        let (name, inline) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (body, None),
        };
        let kind = kind_of(name).ok_or_else(|| FlagError::Unknown(name.to_string()))?;
        let value = match (kind, inline) {
            (FlagKind::Bool | FlagKind::BoolValue, None) => "true".to_string(),
            (FlagKind::Bool | FlagKind::BoolValue, Some(v)) => parse_go_bool(v)
                .map_err(|reason| FlagError::BadValue { flag: name.into(), value: v.into(), reason })?
                .to_string(),
            (FlagKind::Value, Some(v)) => v.to_string(),
            (FlagKind::Value, None) => {
                i += 1;
                args.get(i).cloned().ok_or_else(|| FlagError::MissingValue(name.to_string()))?
            }
        };
        flags.push(GivenFlag { name: name.to_string(), value });
        i += 1;
    }
    Ok(Tokenized { flags, rest: i })
}

/// Keeps the last occurrence of every flag (Go's flag package: last wins),
/// in order of first appearance.
pub fn last_wins(flags: Vec<GivenFlag>) -> Vec<GivenFlag> {
    let mut out: Vec<GivenFlag> = Vec::with_capacity(flags.len());
    for f in flags {
        match out.iter_mut().find(|o| o.name == f.name) {
            Some(o) => o.value = f.value,
            None => out.push(f),
        }
    }
    out
}

/// Renders flags the way argh wants them: `--name value`, booleans as a bare
/// switch when true and nothing when false.
pub fn to_argh_args(flags: &[GivenFlag], kind_of: impl Fn(&str) -> Option<FlagKind>) -> Vec<String> {
    let mut out = Vec::with_capacity(flags.len() * 2);
    for f in flags {
        match kind_of(&f.name) {
            Some(FlagKind::Bool) if f.value == "true" => out.push(format!("--{}", f.name)),
            Some(FlagKind::Bool) => {}
            Some(FlagKind::BoolValue) => {
                out.push(format!("--{}", f.name));
                out.push(f.value.clone());
            }
            _ => {
                out.push(format!("--{}", f.name));
                out.push(f.value.clone());
            }
        }
    }
    out
}

/// Go's `strconv.ParseBool`.
pub fn parse_go_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err("parse error".to_string()),
    }
}

/// Go's `time.ParseDuration`: `300ms`, `-1.5h`, `2h45m`, `1m30s`, `0`.
/// Units: ns, us (µs, μs), ms, s, m, h. Negative durations are refused: no
/// upstream flag accepts one meaningfully.
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let err = || format!("time: invalid duration {s:?}");
    let body = s.strip_prefix('+').unwrap_or(s);
    if let Some(negated) = body.strip_prefix('-') {
        return if !negated.is_empty() && negated.chars().all(|c| c == '0' || c == '.') {
            Ok(Duration::ZERO)
        } else {
            Err(format!("{}: negative durations are not accepted", err()))
        };
    }
    if body == "0" {
        return Ok(Duration::ZERO);
    }
    if body.is_empty() {
        return Err(err());
    }
    let mut total_nanos: f64 = 0.0;
    let mut rest = body;
    while !rest.is_empty() {
        let num_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        if num_len == 0 {
            return Err(err());
        }
        let number: f64 = rest[..num_len].parse().map_err(|_| err())?;
        rest = &rest[num_len..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let nanos_per_unit = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            "" => return Err(format!("time: missing unit in duration {s:?}")),
            u => return Err(format!("time: unknown unit {u:?} in duration {s:?}")),
        };
        rest = &rest[unit_len..];
        total_nanos += number * nanos_per_unit;
    }
    if !total_nanos.is_finite() || total_nanos > u64::MAX as f64 {
        return Err(err());
    }
    Ok(Duration::from_nanos(total_nanos.round() as u64))
}

/// Formats a duration the way Go prints one (`1m30s`, `500ms`, `0s`), for
/// help texts and logs.
pub struct GoDuration(pub Duration);

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d.is_zero() {
            return write!(f, "0s");
        }
        if d < Duration::from_secs(1) {
            let n = d.as_nanos();
            return if n.is_multiple_of(1_000_000) {
                write!(f, "{}ms", n / 1_000_000)
            } else if n.is_multiple_of(1_000) {
                write!(f, "{}µs", n / 1_000)
            } else {
                write!(f, "{n}ns")
            };
        }
        let secs = d.as_secs();
        let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
        let frac = d.subsec_nanos();
        if h > 0 {
            write!(f, "{h}h{m}m")?;
        } else if m > 0 {
            write!(f, "{m}m")?;
        }
        if frac == 0 {
            write!(f, "{s}s")
        } else {
            let frac = format!("{:09}", frac);
            write!(f, "{s}.{}s", frac.trim_end_matches('0'))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(name: &str) -> Option<FlagKind> {
        match name {
            "csi-address" | "v" | "probe-timeout" => Some(FlagKind::Value),
            "leader-election" | "enable-pprof" => Some(FlagKind::Bool),
            "immediate-topology" => Some(FlagKind::BoolValue),
            _ => None,
        }
    }

    fn args(s: &[&str]) -> Vec<String> {
        s.iter().map(|a| a.to_string()).collect()
    }

    fn flag(name: &str, value: &str) -> GivenFlag {
        GivenFlag { name: name.into(), value: value.into() }
    }

    #[test]
    fn every_go_spelling_of_a_flag_normalises_the_same() {
        let table: &[&[&str]] =
            &[&["--csi-address=/x"], &["-csi-address=/x"], &["--csi-address", "/x"], &["-csi-address", "/x"]];
        for line in table {
            let t = tokenize(&args(line), kinds).unwrap();
            assert_eq!(t.flags, vec![flag("csi-address", "/x")], "{line:?}");
            assert_eq!(t.rest, line.len());
        }
    }

    #[test]
    fn booleans_take_no_separate_value() {
        let table: &[(&[&str], &str)] = &[
            (&["--leader-election"], "true"),
            (&["-leader-election"], "true"),
            (&["--leader-election=true"], "true"),
            (&["--leader-election=false"], "false"),
            (&["--leader-election=0"], "false"),
            (&["--leader-election=T"], "true"),
        ];
        for (line, want) in table {
            let t = tokenize(&args(line), kinds).unwrap();
            assert_eq!(t.flags, vec![flag("leader-election", want)], "{line:?}");
        }
        // A bare boolean followed by a word: the word is not its value.
        let t = tokenize(&args(&["--leader-election", "prober"]), kinds).unwrap();
        assert_eq!(t.rest, 1);
    }

    #[test]
    fn verbosity_short_form() {
        let t = tokenize(&args(&["-v=5"]), kinds).unwrap();
        assert_eq!(t.flags, vec![flag("v", "5")]);
        let t = tokenize(&args(&["-v", "5"]), kinds).unwrap();
        assert_eq!(t.flags, vec![flag("v", "5")]);
    }

    #[test]
    fn stops_at_the_first_positional_token() {
        let t = tokenize(&args(&["--v=2", "registrar", "--timeout=1s"]), kinds).unwrap();
        assert_eq!(t.rest, 1);
        let t = tokenize(&args(&["--", "x"]), kinds).unwrap();
        assert_eq!(t.rest, 1);
    }

    #[test]
    fn errors_name_the_flag() {
        assert_eq!(tokenize(&args(&["--nope=1"]), kinds), Err(FlagError::Unknown("nope".into())));
        assert_eq!(tokenize(&args(&["--csi-address"]), kinds), Err(FlagError::MissingValue("csi-address".into())));
        let e = tokenize(&args(&["--enable-pprof=maybe"]), kinds).unwrap_err();
        assert_eq!(e.to_string(), "invalid value \"maybe\" for flag -enable-pprof: parse error");
        assert!(tokenize(&args(&["---x"]), kinds).unwrap().rest == 0);
    }

    #[test]
    fn last_occurrence_wins() {
        let out = last_wins(vec![flag("v", "1"), flag("csi-address", "/a"), flag("v", "5")]);
        assert_eq!(out, vec![flag("v", "5"), flag("csi-address", "/a")]);
    }

    #[test]
    fn argh_rendering() {
        let out =
            to_argh_args(&[flag("leader-election", "false"), flag("enable-pprof", "true"), flag("v", "3")], kinds);
        assert_eq!(out, args(&["--enable-pprof", "--v", "3"]));
    }

    #[test]
    fn go_durations() {
        let ok: &[(&str, Duration)] = &[
            ("0", Duration::ZERO),
            ("500ms", Duration::from_millis(500)),
            ("1m30s", Duration::from_secs(90)),
            ("1.5h", Duration::from_secs(5400)),
            ("2h45m", Duration::from_secs(9900)),
            ("10us", Duration::from_micros(10)),
            ("10µs", Duration::from_micros(10)),
            ("3ns", Duration::from_nanos(3)),
            ("+15s", Duration::from_secs(15)),
            ("0.5s", Duration::from_millis(500)),
        ];
        for (s, want) in ok {
            assert_eq!(parse_go_duration(s), Ok(*want), "{s}");
        }
        for bad in ["", "5", "1x", "s", "1.2.3s", "-1s", "ms5"] {
            assert!(parse_go_duration(bad).is_err(), "{bad} should fail");
        }
    }

    #[test]
    fn durations_print_like_go() {
        let table: &[(Duration, &str)] = &[
            (Duration::ZERO, "0s"),
            (Duration::from_millis(500), "500ms"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_secs(15), "15s"),
            (Duration::from_secs(300), "5m0s"),
            (Duration::from_secs(3600), "1h0m0s"),
            (Duration::from_millis(1500), "1.5s"),
        ];
        for (d, want) in table {
            assert_eq!(GoDuration(*d).to_string(), *want);
        }
    }
}
