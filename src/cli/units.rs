//! Byte sizes and durations as the command line and the config file spell them.

/// `1048576`, `100MiB`, `1.5 GB`, `64KiB`. Binary units are powers of 1024, decimal units
/// powers of 1000, as their names say.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "`{s}`: unknown size unit `{other}` (use bytes, KiB, MiB, GiB, KB, MB or GB)"
            ))
        }
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size (e.g. 1048576, 512MiB, 2GB)"))?;
    let bytes = v * mult as f64;
    if !bytes.is_finite() || bytes > u64::MAX as f64 {
        return Err(format!("`{s}` is too large"));
    }
    if mult == 1 && num.contains('.') {
        return Err(format!("`{s}`: a byte count must be a whole number"));
    }
    Ok(bytes.round() as u64)
}

/// `30`, `30s`, `1.5m`, `2h`, `7d` → nanoseconds. A bare number is seconds, as in ros2 bag.
pub fn parse_duration_ns(s: &str) -> Result<i64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let secs: f64 = match unit.trim() {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        "d" => 86400.0,
        other => {
            return Err(format!(
                "`{s}`: unknown duration unit `{other}` (use seconds, or s, m, h, d)"
            ))
        }
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration (e.g. 30, 90s, 15m, 2h, 1d)"))?;
    let ns = v * secs * 1e9;
    if !ns.is_finite() || ns > i64::MAX as f64 {
        return Err(format!("`{s}` is too long"));
    }
    Ok(ns.round() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_accept_plain_binary_and_decimal_units() {
        assert_eq!(parse_bytes("86016").unwrap(), 86016);
        assert_eq!(parse_bytes("100MiB").unwrap(), 100 << 20);
        assert_eq!(parse_bytes("2 GiB").unwrap(), 2 << 30);
        assert_eq!(parse_bytes("64KiB").unwrap(), 65536);
        assert_eq!(parse_bytes("1.5GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_bytes("20GB").unwrap(), 20_000_000_000);
        assert_eq!(parse_bytes("3KB").unwrap(), 3000);
    }

    #[test]
    fn sizes_reject_garbage_with_the_input_in_the_message() {
        for bad in ["", "abc", "10 parsecs", "-5", "1.5", "5XB"] {
            let e = parse_bytes(bad).unwrap_err();
            assert!(e.contains(&format!("`{bad}`")), "{e}");
        }
    }

    #[test]
    fn durations_take_seconds_and_suffixes() {
        assert_eq!(parse_duration_ns("30").unwrap(), 30_000_000_000);
        assert_eq!(parse_duration_ns("90s").unwrap(), 90_000_000_000);
        assert_eq!(parse_duration_ns("15m").unwrap(), 900_000_000_000);
        assert_eq!(parse_duration_ns("2h").unwrap(), 7_200_000_000_000);
        assert_eq!(parse_duration_ns("1d").unwrap(), 86_400_000_000_000);
        assert_eq!(parse_duration_ns("0.5").unwrap(), 500_000_000);
        assert!(parse_duration_ns("-1").is_err());
        assert!(parse_duration_ns("1w")
            .unwrap_err()
            .contains("unknown duration unit"));
    }
}
