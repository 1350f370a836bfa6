//! The one duration grammar of every Palisade binary's flags: a non-negative decimal number
//! with a unit, `ms`, `s`, `m` or `h` (`500ms`, `1.5s`, `10s`, `5m`, `1h`); a bare number is
//! seconds.

use std::time::Duration;

/// Parses a duration; zero is allowed (see [`parse_positive`]).
pub fn parse(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("bad duration {s:?} (use e.g. 500ms, 10s, 5m, 1h)"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" | "" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        other => {
            return Err(format!(
                "bad duration {s:?}: unknown unit {other:?} (ms, s, m, h)"
            ))
        }
    };
    if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
        return Err(format!("bad duration {s:?}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses a duration that must be longer than zero.
pub fn parse_positive(s: &str) -> Result<Duration, String> {
    let d = parse(s)?;
    if d.is_zero() {
        return Err(format!("bad duration {s:?}: must be positive"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_grammar_for_every_flag() {
        for (s, want) in [
            ("500ms", 0.5),
            ("1.5s", 1.5),
            ("10s", 10.0),
            ("10", 10.0),
            (" 5m ", 300.0),
            ("1h", 3600.0),
            ("0s", 0.0),
        ] {
            assert_eq!(parse(s), Ok(Duration::from_secs_f64(want)), "{s}");
        }
        for bad in [
            "", "s", "-1s", "1d", "1 s", "1.2.3s", "ms", "abc", "1e3s", "inf", "NaN",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        assert!(parse_positive("0s").is_err());
        assert!(parse_positive("1ms").is_ok());
    }
}
