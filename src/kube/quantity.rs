//! Kubernetes resource quantities (`1Gi`, `500M`, `1.5Gi`, `1e3`) to bytes
//! and back, as the provisioner needs them for capacities.

/// Not a quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {0:?}")]
pub struct QuantityError(pub String);

/// Bytes in `q`, rounded up to a whole byte (like `Quantity.Value()`).
pub fn to_bytes(q: &str) -> Result<i64, QuantityError> {
    let err = || QuantityError(q.to_string());
    let s = q.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-')).unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    if num.is_empty() {
        return Err(err());
    }
    let value: f64 = num.parse().map_err(|_| err())?;
    let multiplier: f64 = match suffix {
        "" => 1.0,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        e if e.starts_with(['e', 'E']) => 10f64.powi(e[1..].parse::<i32>().map_err(|_| err())?),
        _ => return Err(err()),
    };
    let bytes = (value * multiplier).ceil();
    if !bytes.is_finite() || bytes < 0.0 || bytes > i64::MAX as f64 {
        return Err(err());
    }
    Ok(bytes as i64)
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
        ];
        for (q, want) in table {
            assert_eq!(to_bytes(q), Ok(want), "{q}");
        }
        for bad in ["", "Gi", "1Xi", "abc", "-1Gi"] {
            assert!(to_bytes(bad).is_err(), "{bad}");
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
}
