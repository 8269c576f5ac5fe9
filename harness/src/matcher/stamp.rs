//! `{$stamp_ms: "$name"}`: an integer of milliseconds since the Unix epoch that falls in
//! the whole second a `Z`-shape stamp names (`YYYY-MM-DDTHH:MM:SSZ`, UTC), the stamp
//! being the value `$name` was bound to earlier (in the same frame, before this key, or
//! in an earlier step). It asserts at once that the stamp has the shape and that the two
//! values state the same instant: worker-protocol.md, "Framing what the model reads"
//! (`runtime.inspect` answers `now` in the `Z` shape of the frame stamps and `now_ms`).
//!
//! The parser is the harness's own (never the implementation's formatter), so a mutated
//! implementation cannot change what it is judged by.

use serde_json::Value;

use crate::bind::{Bindings, Placeholder, Token, parse_token};

/// The key of the pattern.
pub const KEY: &str = "$stamp_ms";

/// Seconds since the Unix epoch of a `YYYY-MM-DDTHH:MM:SSZ` stamp, or why it is not one
/// (another shape, a fraction of a second, an impossible date or time, before 1970).
pub fn parse_z_seconds(stamp: &str) -> Result<u64, String> {
    let b = stamp.as_bytes();
    let shape_ok = b.len() == 20
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            10 => *c == b'T',
            13 | 16 => *c == b':',
            19 => *c == b'Z',
            _ => c.is_ascii_digit(),
        });
    if !shape_ok {
        return Err(format!(
            "{stamp:?} is not in the `Z` shape YYYY-MM-DDTHH:MM:SSZ"
        ));
    }
    let num =
        |from: usize, to: usize| -> i64 { stamp[from..to].parse().expect("digits checked above") };
    let (year, month, day) = (num(0, 4), num(5, 7), num(8, 10));
    let (hour, minute, second) = (num(11, 13), num(14, 16), num(17, 19));
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let month_days = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1..=12).contains(&month)
        || day < 1
        || day > month_days[(month - 1) as usize]
        || hour > 23
        || minute > 59
        || second > 59
    {
        return Err(format!("{stamp:?} names no valid UTC date and time"));
    }
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3_600 + minute * 60 + second;
    u64::try_from(secs).map_err(|_| format!("{stamp:?} is before the Unix epoch"))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Checks `actual` against `{$stamp_ms: operand}`: `Err` says why it does not match.
pub fn check(operand: &Value, actual: &Value, bindings: &Bindings) -> Result<(), String> {
    let name = match operand.as_str().map(parse_token) {
        Some(Ok(Token::Placeholder(Placeholder::Named(name)))) => name,
        _ => return Err("`$stamp_ms` takes a named placeholder (`$now`)".into()),
    };
    let Some(stamp) = bindings.get(&name) else {
        return Err(format!(
            "`$stamp_ms`: ${name} is not bound yet (bind the stamp before this value)"
        ));
    };
    let Some(stamp) = stamp.as_str() else {
        return Err(format!("`$stamp_ms`: ${name} is not a string"));
    };
    let secs = parse_z_seconds(stamp)?;
    let Some(ms) = actual.as_u64() else {
        return Err("expected milliseconds since the Unix epoch (an unsigned integer)".into());
    };
    if ms / 1000 == secs {
        Ok(())
    } else {
        Err(format!(
            "{ms} ms since the epoch is not within the second {stamp} ({} ms)",
            secs * 1000
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn stamps_parse_to_epoch_seconds() {
        assert_eq!(parse_z_seconds("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(parse_z_seconds("2026-12-01T00:00:00Z"), Ok(1_796_083_200));
        assert_eq!(parse_z_seconds("2000-02-29T23:59:59Z"), Ok(951_868_799));
    }

    #[test]
    fn other_shapes_and_impossible_times_are_refused() {
        for bad in [
            "2026-12-01T00:00:00.000Z",
            "2026-12-01 00:00:00Z",
            "2026-12-01T00:00:00+00:00",
            "2026-12-01T00:00:00",
            "2026-02-29T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-12-01T24:00:00Z",
            "1969-12-31T23:59:59Z",
            "２026-12-01T00:00:00Z",
        ] {
            assert!(parse_z_seconds(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn milliseconds_must_fall_in_the_stamped_second() {
        let mut b = Bindings::new();
        b.bind("now", json!("2026-12-01T00:00:00Z")).unwrap();
        let op = json!("$now");
        assert!(check(&op, &json!(1_796_083_200_000u64), &b).is_ok());
        assert!(check(&op, &json!(1_796_083_200_999u64), &b).is_ok());
        assert!(check(&op, &json!(1_796_083_201_000u64), &b).is_err());
        assert!(check(&op, &json!(1_796_083_199_999u64), &b).is_err());
        assert!(check(&op, &json!("1796083200000"), &b).is_err());
        assert!(check(&json!("$unbound"), &json!(0), &b).is_err());
        assert!(check(&json!("now"), &json!(0), &b).is_err());
    }
}
