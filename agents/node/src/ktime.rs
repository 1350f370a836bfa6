//! Conversions from `chrono` times to the API's `Time` and `MicroTime`.

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;

fn ts(t: DateTime<Utc>) -> Timestamp {
    let nanos = i32::try_from(t.timestamp_subsec_nanos()).unwrap_or(0);
    Timestamp::new(t.timestamp(), nanos).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// `Time` of a chrono time.
pub fn time(t: DateTime<Utc>) -> Time {
    Time(ts(t))
}

/// `Time` now.
pub fn now() -> Time {
    time(Utc::now())
}

/// `MicroTime` now.
pub fn micro_now() -> MicroTime {
    MicroTime(ts(Utc::now()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversion_keeps_the_instant() {
        let t = DateTime::parse_from_rfc3339("2026-11-22T09:00:01.25Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(time(t).0.to_string(), "2026-11-22T09:00:01.25Z");
    }
}
