//! Finding the ComputerSystem to act on, and reading what we need from it.
//!
//! The choice, in order:
//! 1. `systems_uri` given: that resource, nothing else is read;
//! 2. `system` (the CLI's `plug`) given: the one member whose `Id`, `Name` or `UUID` equals it;
//! 3. `uuid` given: the one member reporting that UUID;
//! 4. nothing given: the only member. With several members this is **refused**
//!    (`fence_redfish` silently takes the last one; fencing the wrong machine is worse than
//!    not fencing).
//!
//! Whichever way it was chosen, a pinned `uuid` must then match the system's `UUID`, or
//! nothing is commanded ([`FenceError::IdentityMismatch`]).

use serde_json::Value;

use super::session::Session;
use super::transport::Http;
use crate::error::FenceError;
use crate::target::RedfishTarget;

/// What we use of a ComputerSystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SystemInfo {
    /// Its URI (`@odata.id`, else the URI it was read from).
    pub(crate) uri: String,
    /// `Id`.
    pub(crate) id: Option<String>,
    /// `Name`.
    pub(crate) name: Option<String>,
    /// `UUID`, lower case.
    pub(crate) uuid: Option<String>,
    /// `PowerState` as reported.
    pub(crate) power_state: Option<String>,
    /// The `#ComputerSystem.Reset` action, if offered.
    pub(crate) reset: Option<ResetAction>,
}

/// The `#ComputerSystem.Reset` action of a system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResetAction {
    /// Where to POST.
    pub(crate) target: String,
    /// `ResetType@Redfish.AllowableValues`, when listed inline.
    pub(crate) allowable: Option<Vec<String>>,
    /// `@Redfish.ActionInfo`, where the allowable values may be listed instead.
    pub(crate) action_info: Option<String>,
}

/// Checks a `systems_uri`: an absolute path under `/redfish/v1/Systems/`.
pub(crate) fn check_systems_uri(p: &str) -> Result<String, String> {
    let p = p.trim_end_matches('/');
    match p.strip_prefix("/redfish/v1/Systems/") {
        Some(id) if !id.is_empty() && !id.contains("..") => Ok(p.to_string()),
        _ => Err(format!(
            "systems_uri must be /redfish/v1/Systems/<id>, got {p:?}"
        )),
    }
}

/// Checks a UUID (8-4-4-4-12 hex) and lower-cases it.
pub(crate) fn check_uuid(u: &str) -> Result<String, String> {
    let groups: Vec<&str> = u.split('-').collect();
    let ok = groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups
            .iter()
            .all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()));
    if ok {
        Ok(u.to_ascii_lowercase())
    } else {
        Err(format!("uuid must be 8-4-4-4-12 hex digits, got {u:?}"))
    }
}

/// The member URIs of a collection.
pub(crate) fn members(collection: &Value) -> Result<Vec<String>, String> {
    let list = collection
        .get("Members")
        .and_then(Value::as_array)
        .ok_or("the Systems collection has no Members array")?;
    list.iter()
        .map(|m| {
            m.get("@odata.id")
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| format!("a Systems member has no @odata.id: {m}"))
        })
        .collect()
}

/// Reads what we use of a ComputerSystem body.
pub(crate) fn parse_system(read_from: &str, v: &Value) -> Result<SystemInfo, String> {
    if !v.is_object() {
        return Err(format!("{read_from} is not a JSON object"));
    }
    let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    let reset = match v.pointer("/Actions/#ComputerSystem.Reset") {
        None => None,
        Some(a) => {
            let target = a
                .get("target")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("{read_from}: #ComputerSystem.Reset has no target"))?;
            let allowable = match a.get("ResetType@Redfish.AllowableValues") {
                None => None,
                Some(Value::Array(xs)) => Some(
                    xs.iter()
                        .map(|x| x.as_str().map(str::to_string))
                        .collect::<Option<Vec<_>>>()
                        .ok_or_else(|| {
                            format!(
                                "{read_from}: ResetType@Redfish.AllowableValues holds a non-string"
                            )
                        })?,
                ),
                Some(_) => {
                    return Err(format!(
                        "{read_from}: ResetType@Redfish.AllowableValues is not an array"
                    ))
                }
            };
            Some(ResetAction {
                target: target.to_string(),
                allowable,
                action_info: a
                    .get("@Redfish.ActionInfo")
                    .and_then(Value::as_str)
                    .map(str::to_string),
            })
        }
    };
    Ok(SystemInfo {
        uri: s("@odata.id").unwrap_or_else(|| read_from.to_string()),
        id: s("Id"),
        name: s("Name"),
        uuid: s("UUID").map(|u| u.to_ascii_lowercase()),
        power_state: s("PowerState"),
        reset,
    })
}

/// The allowable `ResetType`s listed by an ActionInfo resource, if it lists them.
pub(crate) fn action_info_allowable(v: &Value) -> Option<Vec<String>> {
    v.get("Parameters")?
        .as_array()?
        .iter()
        .find(|p| p.get("Name").and_then(Value::as_str) == Some("ResetType"))?
        .get("AllowableValues")?
        .as_array()?
        .iter()
        .map(|x| x.as_str().map(str::to_string))
        .collect()
}

/// Why no system was chosen.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum NoChoice {
    /// The collection is empty.
    Empty,
    /// Several systems and nothing names one.
    Ambiguous(Vec<String>),
    /// Nothing matches the selector.
    NoMatch(String),
    /// Several match the selector.
    SeveralMatch(String, Vec<String>),
}

impl std::fmt::Display for NoChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Empty => f.write_str("the Systems collection is empty"),
            Self::Ambiguous(all) => write!(
                f,
                "the BMC manages {} systems ({}) and none is named: give systems_uri, plug or uuid",
                all.len(),
                all.join(", ")
            ),
            Self::NoMatch(sel) => write!(f, "no system has Id, Name or UUID {sel:?}"),
            Self::SeveralMatch(sel, all) => {
                write!(f, "several systems match {sel:?}: {}", all.join(", "))
            }
        }
    }
}

/// Chooses among the members (pure: the rules of the module docs, steps 2 to 4).
pub(crate) fn choose<'a>(
    systems: &'a [SystemInfo],
    by_name: Option<&str>,
    by_uuid: Option<&str>,
) -> Result<&'a SystemInfo, NoChoice> {
    let matching: Vec<&SystemInfo> = match (by_name, by_uuid) {
        (Some(sel), _) => systems
            .iter()
            .filter(|s| {
                s.id.as_deref() == Some(sel)
                    || s.name.as_deref() == Some(sel)
                    || s.uuid.as_deref() == Some(sel.to_ascii_lowercase().as_str())
            })
            .collect(),
        (None, Some(u)) => systems
            .iter()
            .filter(|s| s.uuid.as_deref() == Some(u))
            .collect(),
        (None, None) => {
            return match systems {
                [] => Err(NoChoice::Empty),
                [only] => Ok(only),
                _ => Err(NoChoice::Ambiguous(
                    systems.iter().map(|s| s.uri.clone()).collect(),
                )),
            }
        }
    };
    let sel = by_name.or(by_uuid).unwrap_or_default().to_string();
    match matching.as_slice() {
        [] => Err(NoChoice::NoMatch(sel)),
        [one] => Ok(one),
        several => Err(NoChoice::SeveralMatch(
            sel,
            several.iter().map(|s| s.uri.clone()).collect(),
        )),
    }
}

/// Reads one ComputerSystem.
pub(crate) async fn read_system(
    http: &Http,
    session: &Session,
    uri: &str,
) -> Result<SystemInfo, FenceError> {
    let v = http.get_json(uri, session.auth()).await?;
    parse_system(uri, &v).map_err(|detail| FenceError::Protocol {
        device: http.device().to_string(),
        detail,
    })
}

/// The member URIs of the service root's Systems collection.
pub(crate) async fn system_uris(http: &Http, session: &Session) -> Result<Vec<String>, FenceError> {
    let collection_uri = session
        .root()
        .pointer("/Systems/@odata.id")
        .and_then(Value::as_str)
        .unwrap_or("/redfish/v1/Systems")
        .to_string();
    let collection = http.get_json(&collection_uri, session.auth()).await?;
    members(&collection).map_err(|detail| FenceError::Protocol {
        device: http.device().to_string(),
        detail,
    })
}

/// Every system of the Systems collection (for `list`).
pub(crate) async fn list_systems(
    http: &Http,
    session: &Session,
) -> Result<Vec<SystemInfo>, FenceError> {
    let mut systems = Vec::new();
    for uri in system_uris(http, session).await? {
        systems.push(read_system(http, session, &uri).await?);
    }
    Ok(systems)
}

/// Finds the target's system and checks its identity.
///
/// Guarantees: `Ok` only for a system chosen by the rules of the module docs and, when the
/// target pins a UUID, reporting that UUID.
pub(crate) async fn discover(
    http: &Http,
    session: &Session,
    target: &RedfishTarget,
) -> Result<SystemInfo, FenceError> {
    let device = http.device();
    let system = match &target.systems_uri {
        Some(uri) => read_system(http, session, uri).await?,
        None => {
            let uris = system_uris(http, session).await?;
            let mut systems = Vec::with_capacity(uris.len());
            if target.system.is_none() && target.system_uuid.is_none() && uris.len() > 1 {
                // Refused before reading each member: the answer cannot change.
                return Err(FenceError::Config(format!(
                    "{device}: {}",
                    NoChoice::Ambiguous(uris)
                )));
            }
            for uri in &uris {
                systems.push(read_system(http, session, uri).await?);
            }
            choose(
                &systems,
                target.system.as_deref(),
                target.system_uuid.as_deref(),
            )
            .map_err(|e| FenceError::Config(format!("{device}: {e}")))?
            .clone()
        }
    };
    if let Some(pinned) = &target.system_uuid {
        // Case-insensitive: a UUID is its 16 bytes, whatever case the BMC prints them in.
        if !system
            .uuid
            .as_deref()
            .is_some_and(|u| u.trim().eq_ignore_ascii_case(pinned))
        {
            return Err(FenceError::IdentityMismatch {
                device: device.to_string(),
                expected: format!("system UUID {pinned}"),
                found: format!(
                    "{} reports UUID {}",
                    system.uri,
                    system.uuid.as_deref().unwrap_or("(none)")
                ),
            });
        }
    }
    Ok(system)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sys(uri: &str, id: &str, name: &str, uuid: &str) -> SystemInfo {
        SystemInfo {
            uri: uri.into(),
            id: Some(id.into()),
            name: Some(name.into()),
            uuid: Some(uuid.into()),
            power_state: Some("On".into()),
            reset: None,
        }
    }

    #[test]
    fn a_sushy_computer_system_parses() {
        let v = json!({
            "@odata.id": "/redfish/v1/Systems/1111",
            "Id": "1111", "Name": "node-a", "UUID": "1111AAAA-1111-1111-1111-111111111111",
            "PowerState": "On",
            "Actions": {"#ComputerSystem.Reset": {
                "target": "/redfish/v1/Systems/1111/Actions/ComputerSystem.Reset",
                "ResetType@Redfish.AllowableValues": ["On", "ForceOff", "GracefulShutdown"]}}
        });
        let s = parse_system("/redfish/v1/Systems/1111", &v).unwrap();
        assert_eq!(
            s.uuid.as_deref(),
            Some("1111aaaa-1111-1111-1111-111111111111")
        );
        assert_eq!(s.power_state.as_deref(), Some("On"));
        let r = s.reset.unwrap();
        assert_eq!(
            r.target,
            "/redfish/v1/Systems/1111/Actions/ComputerSystem.Reset"
        );
        assert_eq!(r.allowable.unwrap(), ["On", "ForceOff", "GracefulShutdown"]);
        assert!(parse_system("x", &json!([1])).is_err());
        assert!(parse_system("x", &json!({"Actions": {"#ComputerSystem.Reset": {}}})).is_err());
        assert!(parse_system(
            "x",
            &json!({"Actions": {"#ComputerSystem.Reset": {"target": "/t", "ResetType@Redfish.AllowableValues": "On"}}})
        )
        .is_err());
    }

    #[test]
    fn action_info_lists_reset_types() {
        let v =
            json!({"Parameters": [{"Name": "ResetType", "AllowableValues": ["On", "ForceOff"]}]});
        assert_eq!(action_info_allowable(&v).unwrap(), ["On", "ForceOff"]);
        assert_eq!(action_info_allowable(&json!({"Parameters": []})), None);
    }

    #[test]
    fn several_systems_and_no_selector_is_refused_not_guessed() {
        let a = sys(
            "/redfish/v1/Systems/a",
            "a",
            "node-a",
            "aaaaaaaa-0000-0000-0000-000000000000",
        );
        let b = sys(
            "/redfish/v1/Systems/b",
            "b",
            "node-b",
            "bbbbbbbb-0000-0000-0000-000000000000",
        );
        let both = [a.clone(), b.clone()];
        assert!(matches!(choose(&both, None, None), Err(NoChoice::Ambiguous(v)) if v.len() == 2));
        assert_eq!(choose(std::slice::from_ref(&a), None, None).unwrap(), &a);
        assert_eq!(choose(&[], None, None), Err(NoChoice::Empty));
        assert_eq!(choose(&both, Some("node-b"), None).unwrap(), &b);
        assert_eq!(choose(&both, Some("a"), None).unwrap(), &a);
        assert_eq!(
            choose(&both, Some("BBBBBBBB-0000-0000-0000-000000000000"), None).unwrap(),
            &b
        );
        assert_eq!(
            choose(&both, None, Some("bbbbbbbb-0000-0000-0000-000000000000")).unwrap(),
            &b
        );
        assert!(matches!(
            choose(&both, Some("node-c"), None),
            Err(NoChoice::NoMatch(_))
        ));
        let twin = sys(
            "/redfish/v1/Systems/c",
            "c",
            "node-a",
            "cccccccc-0000-0000-0000-000000000000",
        );
        assert!(matches!(
            choose(&[a, twin], Some("node-a"), None),
            Err(NoChoice::SeveralMatch(_, v)) if v.len() == 2
        ));
    }

    #[test]
    fn systems_uris_and_uuids_are_checked() {
        assert_eq!(
            check_systems_uri("/redfish/v1/Systems/1/").unwrap(),
            "/redfish/v1/Systems/1"
        );
        assert!(check_systems_uri("/redfish/v1/Systems/").is_err());
        assert!(check_systems_uri("/redfish/v1/Managers/1").is_err());
        assert!(check_systems_uri("/redfish/v1/Systems/../Managers").is_err());
        assert_eq!(
            check_uuid("ABCDEF01-2345-6789-abcd-ef0123456789").unwrap(),
            "abcdef01-2345-6789-abcd-ef0123456789"
        );
        assert!(check_uuid("abcdef01-2345-6789-abcd").is_err());
        assert!(check_uuid("abcdef0g-2345-6789-abcd-ef0123456789").is_err());
        assert_eq!(
            members(&json!({"Members": [{"@odata.id": "/a"}, {"@odata.id": "/b"}]})).unwrap(),
            ["/a", "/b"]
        );
        assert!(members(&json!({"Members": [{}]})).is_err());
        assert!(members(&json!({})).is_err());
    }
}
