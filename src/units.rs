//! Byte sizes and durations as the command line and the config file spell them. Below both
//! `cli` and `config`, so that the config does not import the CLI.
//!
//! Numbers are parsed as exact decimals (integer arithmetic, never floats), so a large value
//! keeps every digit and a value that does not fit is refused instead of wrapping or
//! saturating.

/// Largest size accepted: file sizes are signed 64-bit (`off_t`, SQLite), so anything larger
/// cannot describe a file, and every later sum or doubling of a size stays inside u64.
pub const MAX_BYTES: u64 = i64::MAX as u64;

/// Largest duration accepted, in ns: timestamps are signed 64-bit nanoseconds (~292 years).
pub const MAX_DURATION_NS: i64 = i64::MAX;

/// Splits `1.5GiB` into (`1.5`, `GiB`).
fn split_number(t: &str) -> (&str, &str) {
    let at = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    t.split_at(at)
}

/// Why a decimal could not be scaled.
enum ScaleError {
    NotANumber,
    TooLarge,
}

/// `num` (digits with at most one `.`) × `mult`, rounded to the nearest integer,
/// computed exactly in u128; also says whether the result was whole before rounding.
fn scale_decimal(num: &str, mult: u128) -> Result<(u128, bool), ScaleError> {
    let (int, frac) = match num.split_once('.') {
        Some((i, f)) => (i, f),
        None => (num, ""),
    };
    if (int.is_empty() && frac.is_empty())
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(ScaleError::NotANumber);
    }
    let int = int.trim_start_matches('0');
    let frac = frac.trim_end_matches('0');
    // 20 integer digits already exceed u64; 18 decimals are far below any unit's resolution.
    if int.len() > 20 {
        return Err(ScaleError::TooLarge);
    }
    let frac = &frac[..frac.len().min(18)];
    let digits = |s: &str| -> u128 {
        s.bytes()
            .fold(0u128, |acc, b| acc * 10 + u128::from(b - b'0'))
    };
    let div = 10u128.pow(frac.len() as u32);
    let mantissa = digits(int) * div + digits(frac);
    let scaled = mantissa.checked_mul(mult).ok_or(ScaleError::TooLarge)?;
    let whole = scaled % div == 0;
    Ok(((scaled + div / 2) / div, whole))
}

/// `1048576`, `100MiB`, `1.5 GB`, `64KiB`. Binary units are powers of 1024, decimal units
/// powers of 1000, as their names say.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err(format!("`{s}`: a size cannot be negative"));
    }
    let (num, unit) = split_number(t);
    let mult: u128 = match unit.trim() {
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
    let too_large = || format!("`{s}` is too large (at most {MAX_BYTES} bytes, 8 EiB)");
    let (bytes, whole) = scale_decimal(num, mult).map_err(|e| match e {
        ScaleError::NotANumber => format!("`{s}` is not a size (e.g. 1048576, 512MiB, 2GB)"),
        ScaleError::TooLarge => too_large(),
    })?;
    if mult == 1 && !whole {
        return Err(format!("`{s}`: a byte count must be a whole number"));
    }
    u64::try_from(bytes)
        .ok()
        .filter(|&b| b <= MAX_BYTES)
        .ok_or_else(too_large)
}

/// `30`, `30s`, `1.5m`, `2h`, `7d` → nanoseconds. A bare number is seconds, as in ros2 bag.
pub fn parse_duration_ns(s: &str) -> Result<i64, String> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err(format!("`{s}`: a duration cannot be negative"));
    }
    let (num, unit) = split_number(t);
    let ns_per_unit: u128 = match unit.trim() {
        "" | "s" => 1_000_000_000,
        "ms" => 1_000_000,
        "m" | "min" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "d" => 86_400_000_000_000,
        other => {
            return Err(format!(
                "`{s}`: unknown duration unit `{other}` (use seconds, or s, m, h, d)"
            ))
        }
    };
    let too_long = || {
        format!(
            "`{s}` is too long (at most {} days)",
            MAX_DURATION_NS / 86_400_000_000_000
        )
    };
    let (ns, _) = scale_decimal(num, ns_per_unit).map_err(|e| match e {
        ScaleError::NotANumber => {
            format!("`{s}` is not a duration (e.g. 30, 90s, 15m, 2h, 1d)")
        }
        ScaleError::TooLarge => too_long(),
    })?;
    i64::try_from(ns).map_err(|_| too_long())
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

    #[test]
    fn sizes_that_do_not_fit_are_refused_not_wrapped() {
        // 2^64 exactly: a float parser saturated this to u64::MAX.
        let e = parse_bytes("17179869184GiB").unwrap_err();
        assert_eq!(
            e,
            "`17179869184GiB` is too large (at most 9223372036854775807 bytes, 8 EiB)"
        );
        for bad in [
            "18446744073709551615",
            "9223372036854775808",
            "8388608TiB",
            "99999999999999999999999999TB",
            "123456789012345678901234567890",
        ] {
            assert!(parse_bytes(bad).unwrap_err().contains("too large"), "{bad}");
        }
        // The largest accepted value keeps every digit (a float would round it).
        assert_eq!(parse_bytes("9223372036854775807").unwrap(), i64::MAX as u64);
        assert_eq!(
            parse_bytes("9007199254740993").unwrap(),
            9_007_199_254_740_993
        );
        assert_eq!(parse_bytes("8388607TiB").unwrap(), 8_388_607u64 << 40);
    }

    #[test]
    fn negative_sizes_and_durations_are_named_as_such() {
        assert_eq!(
            parse_bytes("-10").unwrap_err(),
            "`-10`: a size cannot be negative"
        );
        assert_eq!(
            parse_duration_ns("-1s").unwrap_err(),
            "`-1s`: a duration cannot be negative"
        );
    }

    #[test]
    fn durations_that_do_not_fit_in_i64_nanoseconds_are_refused() {
        for bad in ["106752d", "9223372037", "2562048h", "1e3", "1.2.3", "."] {
            assert!(parse_duration_ns(bad).is_err(), "{bad}");
        }
        assert!(parse_duration_ns("106752d")
            .unwrap_err()
            .contains("too long"));
        assert_eq!(
            parse_duration_ns("106751d").unwrap(),
            106_751 * 86_400_000_000_000
        );
        assert_eq!(parse_duration_ns("9223372036.854775807").unwrap(), i64::MAX);
        assert_eq!(parse_duration_ns("1.5ms").unwrap(), 1_500_000);
        assert_eq!(parse_duration_ns(".5").unwrap(), 500_000_000);
    }
}
