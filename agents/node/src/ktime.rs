//! The API's `Time` and `MicroTime` now (the agent's times are jiff's [`Timestamp`]s, as
//! `k8s-openapi`'s are: a `Timestamp` `t` is the API's `Time(t)`).

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};

/// `Time` now.
pub fn now() -> Time {
    Time(Timestamp::now())
}

/// `MicroTime` now.
pub fn micro_now() -> MicroTime {
    MicroTime(Timestamp::now())
}
