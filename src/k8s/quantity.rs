//! Kubernetes resource quantities (`1Gi`, `500M`, `1.5Gi`, `1e3`) to bytes
//! and back, as the provisioner needs them for capacities. Exact: the
//! mantissa's digits and the suffix's powers of ten and two, never a float
//! (`1.07G` is 1 070 000 000 bytes, as upstream's `Quantity.Value()`).

/// Not a quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {0:?}")]
pub struct QuantityError(pub String);

/// Bytes in `q`: its exact value rounded up to a whole byte, as
/// `Quantity.Value()` rounds. Past `i64::MAX` a binary suffix is capped
/// there (upstream's parser caps a binarySI quantity at 2^63-1) and any
/// other quantity fails, as does a negative one.
pub fn to_bytes(q: &str) -> Result<i64, QuantityError> {
    parse(q.trim()).and_then(Parsed::bytes).ok_or_else(|| QuantityError(q.to_string()))
}

/// A quantity's parts: its value is ±`int.frac` × 10^`exp10` × 2^`exp2`.
struct Parsed<'a> {
    negative: bool,
    int: &'a str,
    frac: &'a str,
    exp10: i64,
    exp2: u32,
}

/// `[+-]digits[.digits][suffix]` (`1.`, `.5` too), the suffix one of
/// upstream's: Ki..Ei, n u m k M G T P E, or `e`/`E` and an exponent.
fn parse(s: &str) -> Option<Parsed<'_>> {
    let digits = |s: &str| s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (negative, rest) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let (int, rest) = rest.split_at(digits(rest));
    let (frac, suffix) = match rest.strip_prefix('.') {
        Some(rest) => rest.split_at(digits(rest)),
        None => ("", rest),
    };
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    let (exp10, exp2) = match suffix {
        "" => (0, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        e if e.starts_with(['e', 'E']) => (e[1..].parse::<i64>().ok()?, 0),
        _ => return None,
    };
    let exp10 = exp10.checked_sub(i64::try_from(frac.len()).ok()?)?;
    Some(Parsed { negative, int, frac, exp10, exp2 })
}

/// Largest number of decimal digits below `i64::MAX` (10^19 > 2^63).
const MAX_DIGITS: usize = 19;

impl Parsed<'_> {
    /// The value rounded up to an integer (see [`to_bytes`]).
    fn bytes(self) -> Option<i64> {
        // The mantissa's digits, most significant first, without leading zeros.
        let mut digits: Vec<u8> =
            self.int.bytes().chain(self.frac.bytes()).map(|b| b - b'0').skip_while(|&d| d == 0).collect();
        if digits.is_empty() {
            return Some(0);
        }
        if self.negative {
            return None;
        }
        times_two_to(&mut digits, self.exp2);
        let whole = match usize::try_from(self.exp10) {
            // At least 10^(len - 1 + zeros): past i64::MAX from 20 digits on.
            Ok(zeros) if digits.len().saturating_add(zeros) > MAX_DIGITS => None,
            Ok(zeros) => Some(number(&digits) * 10u128.pow(zeros as u32)),
            Err(_) => {
                let shift = usize::try_from(self.exp10.unsigned_abs()).unwrap_or(usize::MAX);
                let (int, frac) = digits.split_at(digits.len().saturating_sub(shift));
                (int.len() <= MAX_DIGITS).then(|| number(int) + u128::from(frac.iter().any(|&d| d != 0)))
            }
        };
        match whole.and_then(|w| i64::try_from(w).ok()) {
            Some(bytes) => Some(bytes),
            None if self.exp2 > 0 => Some(i64::MAX),
            None => None,
        }
    }
}

/// `digits` (decimal, most significant first) multiplied by 2^`exp` (at most 60).
fn times_two_to(digits: &mut Vec<u8>, exp: u32) {
    let factor = 1u128 << exp;
    let mut carry = 0u128;
    for d in digits.iter_mut().rev() {
        let v = u128::from(*d) * factor + carry;
        *d = (v % 10) as u8;
        carry = v / 10;
    }
    while carry > 0 {
        digits.insert(0, (carry % 10) as u8);
        carry /= 10;
    }
}

/// The number `digits` write (at most [`MAX_DIGITS`] of them).
fn number(digits: &[u8]) -> u128 {
    digits.iter().fold(0, |n, &d| n * 10 + u128::from(d))
}

/// `bytes` in BinarySI form, as `resource.NewQuantity(bytes, BinarySI)`
/// prints it: the largest binary suffix that divides it exactly.
pub fn from_bytes(bytes: i64) -> String {
    const SUFFIXES: [&str; 6] = ["Ei", "Pi", "Ti", "Gi", "Mi", "Ki"];
    if bytes != 0 {
        for (i, s) in SUFFIXES.iter().enumerate() {
            let unit = 1i64 << (10 * (6 - i));
            if bytes % unit == 0 {
                return format!("{}{s}", bytes / unit);
            }
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse() {
        let table = [
            ("1Gi", 1 << 30),
            ("1Mi", 1 << 20),
            ("500M", 500_000_000),
            ("1.5Gi", 3 << 29),
            ("1e3", 1000),
            ("100", 100),
            ("1500m", 2),
            ("2k", 2000),
            ("1.07G", 1_070_000_000),
            ("2.01Gi", 2_158_221_067),
            ("0.1", 1),
            ("1u", 1),
            ("1500n", 1),
            ("+1Ki", 1024),
            (".5k", 500),
            ("1.", 1),
            ("-0", 0),
            ("0e999999999", 0),
            ("1e-999999999", 1),
            ("1E+3", 1000),
            ("9223372036854775807", i64::MAX),
            ("9.223372036854775807E", i64::MAX),
            ("8Ei", i64::MAX),
            ("12345678901234567890Ei", i64::MAX),
        ];
        let wrong: Vec<_> = table.iter().filter(|(q, want)| to_bytes(q) != Ok(*want)).collect();
        assert!(wrong.is_empty(), "{:?}", wrong.iter().map(|(q, want)| (q, want, to_bytes(q))).collect::<Vec<_>>());
        for bad in [
            "",
            "Gi",
            "1Xi",
            "abc",
            "-1Gi",
            "-0.5",
            "1e",
            "1.2.3",
            "1 Gi",
            "9223372036854775808",
            "9.3E",
            "1e999999999",
            "1e99999999999999999999",
        ] {
            assert!(to_bytes(bad).is_err(), "{bad}: {:?}", to_bytes(bad));
        }
    }

    #[test]
    fn print() {
        assert_eq!(from_bytes(1 << 30), "1Gi");
        assert_eq!(from_bytes(3 << 29), "1536Mi");
        assert_eq!(from_bytes(1000), "1000");
        assert_eq!(from_bytes(0), "0");
        assert_eq!(from_bytes(1 << 20), "1Mi");
    }

    /// A suffix's factor as a fraction (numerator, denominator) and
    /// whether it is binary.
    fn factor(suffix: &str) -> (i128, i128, bool) {
        let ten = |e: i32| if e >= 0 { (10i128.pow(e as u32), 1) } else { (1, 10i128.pow(e.unsigned_abs())) };
        let binary = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
        if let Some(i) = binary.iter().position(|b| *b == suffix) {
            return (1 << (10 * (i + 1)), 1, true);
        }
        let e = match suffix {
            "n" => -9,
            "u" => -6,
            "m" => -3,
            "" => 0,
            "k" => 3,
            "M" => 6,
            "G" => 9,
            "T" => 12,
            "P" => 15,
            "E" => 18,
            e => e[1..].parse().unwrap(),
        };
        let (n, d) = ten(e);
        (n, d, false)
    }

    /// `Quantity.Value()` of (sign, digits, fraction, suffix) with i128
    /// fractions: ceil; negative is an error here; past i64::MAX a binary
    /// suffix is capped (as upstream's parser caps it) and any other fails.
    fn model(negative: bool, int: &str, frac: Option<&str>, suffix: &str) -> Option<i64> {
        let frac = frac.unwrap_or("");
        let digits = format!("{int}{frac}");
        if digits.is_empty() {
            return None;
        }
        let (fn_, fd, binary) = factor(suffix);
        let num = digits.parse::<i128>().unwrap() * fn_;
        let den = 10i128.pow(frac.len() as u32) * fd;
        if num == 0 {
            return Some(0);
        }
        if negative {
            return None;
        }
        let ceil = (num + den - 1) / den;
        match i64::try_from(ceil) {
            Ok(v) => Some(v),
            Err(_) if binary => Some(i64::MAX),
            Err(_) => None,
        }
    }

    fn suffix() -> impl Strategy<Value = String> {
        const NAMED: &[&str] = &["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E"];
        prop_oneof![
            proptest::sample::select(NAMED).prop_map(str::to_string),
            (proptest::sample::select(&["e", "E"][..]), proptest::sample::select(&["", "+", "-"][..]), 0u32..=20)
                .prop_map(|(e, sign, n)| format!("{e}{sign}{n}")),
        ]
    }

    use proptest::prelude::*;

    proptest! {
        /// Exact, as `Quantity.Value()`: a rational model over random
        /// mantissas, signs, suffixes and exponents.
        #[test]
        fn bytes_are_the_exact_value_rounded_up(
            sign in proptest::sample::select(&["", "+", "-"][..]),
            int in "[0-9]{0,7}",
            frac in proptest::option::of("[0-9]{0,6}"),
            suffix in suffix(),
        ) {
            let q = format!("{sign}{int}{}{suffix}", frac.as_deref().map(|f| format!(".{f}")).unwrap_or_default());
            let want = model(sign == "-", &int, frac.as_deref(), &suffix);
            prop_assert_eq!(to_bytes(&q).ok(), want, "{}", q);
        }

        /// What `from_bytes` prints, `to_bytes` reads back.
        #[test]
        fn printed_bytes_read_back(bytes in 0i64..=i64::MAX) {
            prop_assert_eq!(to_bytes(&from_bytes(bytes)), Ok(bytes));
        }
    }
}
