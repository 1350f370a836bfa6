//! Reading a system's `PowerState`: the only read that verification trusts.

use async_trait::async_trait;

use super::discovery::read_system;
use super::session::Session;
use super::transport::Http;
use crate::error::FenceError;
use crate::power::PowerState;
use crate::verify::StatusProbe;

/// Maps a Redfish `PowerState` to ours. Only `Off` is off: `PoweringOff` is still on as far as
/// fencing is concerned, and so is anything this code does not know.
pub(crate) fn parse_power_state(s: &str) -> PowerState {
    match s {
        "On" => PowerState::On,
        "Off" => PowerState::Off,
        _ => PowerState::Unknown,
    }
}

/// Reads the power state of the system at `uri` (a fresh GET, never a cached body).
pub(crate) async fn read_power_state(
    http: &Http,
    session: &Session,
    uri: &str,
) -> Result<PowerState, FenceError> {
    let system = read_system(http, session, uri).await?;
    match system.power_state.as_deref() {
        Some(s) => Ok(parse_power_state(s)),
        None => Err(FenceError::Protocol {
            device: http.device().to_string(),
            detail: format!("{uri} reports no PowerState"),
        }),
    }
}

/// A [`StatusProbe`] over an open session, for `verify`.
pub(crate) struct PowerProbe<'a> {
    pub(crate) http: &'a Http,
    pub(crate) session: &'a Session,
    pub(crate) uri: &'a str,
}

#[async_trait]
impl StatusProbe for PowerProbe<'_> {
    async fn probe(&mut self) -> Result<PowerState, FenceError> {
        read_power_state(self.http, self.session, self.uri).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_off_is_off() {
        assert_eq!(parse_power_state("Off"), PowerState::Off);
        assert_eq!(parse_power_state("On"), PowerState::On);
        for s in ["PoweringOff", "PoweringOn", "Paused", "off", "OFF", ""] {
            assert_eq!(parse_power_state(s), PowerState::Unknown, "{s}");
        }
    }
}
