//! `ComputerSystem.Reset`: choose a `ResetType` the system allows, POST it, and follow a task
//! monitor when the BMC answers 202.

use reqwest::{Method, StatusCode};
use serde_json::json;

use super::discovery::{action_info_allowable, SystemInfo};
use super::session::Session;
use super::transport::Http;
use crate::error::FenceError;

/// A Redfish `ResetType` this agent sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetType {
    /// Power on.
    On,
    /// Power on (some BMCs list only this).
    ForceOn,
    /// Cut the power now, without asking the operating system.
    ForceOff,
    /// Restart without asking the operating system.
    ForceRestart,
    /// Power off, then on.
    PowerCycle,
}

impl ResetType {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::On => "On",
            Self::ForceOn => "ForceOn",
            Self::ForceOff => "ForceOff",
            Self::ForceRestart => "ForceRestart",
            Self::PowerCycle => "PowerCycle",
        }
    }
}

/// Chooses the first of `preferences` that the system allows; any, in order, when it lists
/// nothing (the BMC then has the last word).
pub(crate) fn pick(
    preferences: &[ResetType],
    allowable: Option<&[String]>,
) -> Result<ResetType, String> {
    let Some(allowed) = allowable else {
        return preferences
            .first()
            .copied()
            .ok_or_else(|| "no reset type wanted".to_string());
    };
    preferences
        .iter()
        .copied()
        .find(|p| allowed.iter().any(|a| a == p.as_str()))
        .ok_or_else(|| {
            format!(
                "the system allows ResetType {allowed:?}, none of {:?}",
                preferences.iter().map(|p| p.as_str()).collect::<Vec<_>>()
            )
        })
}

/// How a reset failed: before anything was sent, or refused by the BMC.
#[derive(Debug)]
pub(crate) enum ResetError {
    /// Nothing was sent (no Reset action, no allowed type, transport failure before an answer).
    NotSent(FenceError),
    /// The BMC answered the POST with an error, or its task failed.
    Refused(FenceError),
}

impl From<ResetError> for FenceError {
    fn from(e: ResetError) -> Self {
        match e {
            ResetError::NotSent(e) | ResetError::Refused(e) => e,
        }
    }
}

/// Sends the first allowed of `preferences` to `system` and waits for the BMC to accept it
/// (following a 202 task monitor until `deadline`). Returns what was sent.
pub(crate) async fn reset(
    http: &Http,
    session: &Session,
    system: &SystemInfo,
    preferences: &[ResetType],
    deadline: tokio::time::Instant,
) -> Result<ResetType, ResetError> {
    let device = http.device().to_string();
    let action = system.reset.as_ref().ok_or_else(|| {
        ResetError::NotSent(FenceError::DeviceRefused {
            device: device.clone(),
            detail: format!("{} offers no #ComputerSystem.Reset action", system.uri),
        })
    })?;
    let mut allowable = action.allowable.clone();
    if allowable.is_none() {
        if let Some(info) = &action.action_info {
            match http.get_json(info, session.auth()).await {
                Ok(v) => allowable = action_info_allowable(&v),
                Err(e) => {
                    tracing::debug!(device = %device, error = %e, "reading @Redfish.ActionInfo")
                }
            }
        }
    }
    let reset_type = pick(preferences, allowable.as_deref()).map_err(|detail| {
        ResetError::NotSent(FenceError::DeviceRefused {
            device: device.clone(),
            detail: format!("{}: {detail}", system.uri),
        })
    })?;
    let body = json!({"ResetType": reset_type.as_str()});
    tracing::info!(device = %device, system = %system.uri, reset = reset_type.as_str(), "ComputerSystem.Reset");
    let r = http
        .send(Method::POST, &action.target, session.auth(), Some(&body))
        .await
        .map_err(ResetError::NotSent)?;
    match r.status {
        StatusCode::ACCEPTED => super::task::follow(http, session, &r, deadline)
            .await
            .map_err(ResetError::Refused)?,
        s if s.is_success() => {}
        _ => {
            let what = format!("POST {} ResetType={}", action.target, reset_type.as_str());
            return Err(ResetError::Refused(
                http.check(&what, r).expect_err("not a success"),
            ));
        }
    }
    Ok(reset_type)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_types_honour_allowable_values() {
        let sushy: Vec<String> = ["On", "ForceOff", "GracefulShutdown", "ForceOn"]
            .map(String::from)
            .to_vec();
        assert_eq!(
            pick(&[ResetType::ForceOff], Some(sushy.as_slice())).unwrap(),
            ResetType::ForceOff
        );
        assert_eq!(
            pick(&[ResetType::On, ResetType::ForceOn], Some(sushy.as_slice())).unwrap(),
            ResetType::On
        );
        let only_force_on = vec!["ForceOn".to_string(), "GracefulShutdown".to_string()];
        assert_eq!(
            pick(
                &[ResetType::On, ResetType::ForceOn],
                Some(only_force_on.as_slice())
            )
            .unwrap(),
            ResetType::ForceOn
        );
        let err = pick(&[ResetType::ForceOff], Some(only_force_on.as_slice())).unwrap_err();
        assert!(err.contains("GracefulShutdown"), "{err}");
        assert_eq!(
            pick(&[ResetType::ForceOff], None).unwrap(),
            ResetType::ForceOff
        );
        assert!(pick(&[ResetType::ForceOff], Some(&[][..])).is_err());
    }
}
