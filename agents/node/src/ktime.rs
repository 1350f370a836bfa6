//! The API's `Time` and `MicroTime` of a [`Timestamp`] (the agent's times are jiff's, as
//! `k8s-openapi`'s are).

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};

/// `Time` of a timestamp.
pub fn time(t: Timestamp) -> Time {
    Time(t)
}

/// `Time` now.
pub fn now() -> Time {
    time(Timestamp::now())
}

/// `MicroTime` now.
pub fn micro_now() -> MicroTime {
    MicroTime(Timestamp::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversion_keeps_the_instant() {
        let t: Timestamp = "2026-11-22T09:00:01.25Z".parse().unwrap();
        assert_eq!(time(t).0.to_string(), "2026-11-22T09:00:01.25Z");
    }
}
