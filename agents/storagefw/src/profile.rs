//! Request profiles: how to say "block node N", "unblock node N" and "is node N blocked?" to
//! one vendor's storage admin API. Pure data and pure rendering; no I/O.
//!
//! A profile is JSON, for example the built-in `lab` profile:
//!
//! ```json
//! {
//!   "name": "lab",
//!   "block":   {"method": "POST", "path": "/v1/nodes/{node}/block", "body": {"addresses": "{addresses}", "hold": "{hold}"}},
//!   "unblock": {"method": "POST", "path": "/v1/nodes/{node}/unblock", "body": {"hold": "{hold}"}},
//!   "status":  {"method": "GET",  "path": "/v1/nodes/{node}"},
//!   "blocked_pointer": "/blocked",
//!   "blocked_value": true
//! }
//! ```
//!
//! Placeholders: `{node}` (the node name), `{addresses}` (the node's addresses) and `{hold}`
//! (the fence's own hold, see below; empty when the caller names none). In a path,
//! `{addresses}` becomes a comma-separated list. In a body, a string that is exactly
//! `"{addresses}"` becomes a JSON array of strings; elsewhere in strings it is comma-joined.
//!
//! **Holds.** A controller that fences directly (no token-checking firewall-bridge between it
//! and the array) names each fence's block with a hold (`palisade-<NodeFence UID>`), and its
//! unblock lifts only that hold: the node stays blocked while any other hold remains. A leader
//! frozen after its last leadership check and resumed after a standby has fenced the node
//! again can therefore deliver its late unblock without lifting the newer block. An array
//! whose API cannot scope a block this way (a profile without `{hold}` in its unblock) gives no
//! such protection; put such a device behind the firewall-bridge, whose fencing tokens refuse
//! the deposed leader. The lab storage server keeps holds; an unblock with an empty hold is the
//! operator's node-wide unblock.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::StorageFwError;

/// One templated HTTP request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestTemplate {
    /// HTTP method: GET, POST, PUT, PATCH or DELETE.
    pub method: String,
    /// Path relative to the target's base URL, starting with `/`.
    pub path: String,
    /// JSON body template; no body when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Value>,
}

/// A vendor profile: request templates plus where the status response says "blocked".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Profile name (for logs and evidence).
    pub name: String,
    /// Request that blocks a node.
    pub block: RequestTemplate,
    /// Request that unblocks (unfences) a node.
    pub unblock: RequestTemplate,
    /// Request that reads a node's status.
    pub status: RequestTemplate,
    /// JSON pointer (RFC 6901) into the status response.
    pub blocked_pointer: String,
    /// The value at `blocked_pointer` that means "blocked"; any other value means not blocked.
    pub blocked_value: Value,
}

/// A request with every placeholder substituted.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderedRequest {
    /// HTTP method (validated).
    pub method: String,
    /// Path with placeholders substituted.
    pub path: String,
    /// Body with placeholders substituted.
    pub body: Option<Value>,
}

/// The node a request is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRef {
    name: String,
    addresses: Vec<IpAddr>,
    hold: Option<String>,
}

impl NodeRef {
    /// Validates a node name (DNS-1123 subdomain: lowercase alphanumerics, `-` and `.`, at most
    /// 253 characters) so that it can be placed into a URL path without escaping.
    pub fn new(name: &str, addresses: Vec<IpAddr>) -> Result<Self, StorageFwError> {
        let bad = |reason: &str| StorageFwError::InvalidNode {
            node: name.to_owned(),
            reason: reason.to_owned(),
        };
        if name.is_empty() || name.len() > 253 {
            return Err(bad("name must be 1..=253 characters"));
        }
        if !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        {
            return Err(bad("name must be lowercase alphanumerics, '-' or '.'"));
        }
        if !name.as_bytes()[0].is_ascii_alphanumeric()
            || !name.as_bytes()[name.len() - 1].is_ascii_alphanumeric()
        {
            return Err(bad("name must start and end with an alphanumeric"));
        }
        Ok(NodeRef {
            name: name.to_owned(),
            addresses,
            hold: None,
        })
    }

    /// Names the fence's own hold on the node (`{hold}` in a profile): a block adds it, an
    /// unblock lifts only it. The same characters as a node name, at most 253.
    pub fn with_hold(mut self, hold: &str) -> Result<Self, StorageFwError> {
        let ok = !hold.is_empty()
            && hold.len() <= 253
            && hold
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        if !ok {
            return Err(StorageFwError::InvalidNode {
                node: self.name,
                reason: format!(
                    "hold {hold:?} must be 1..=253 lowercase alphanumerics, '-' or '.'"
                ),
            });
        }
        self.hold = Some(hold.to_owned());
        Ok(self)
    }

    /// The fence's hold, if named.
    pub fn hold(&self) -> Option<&str> {
        self.hold.as_deref()
    }

    /// The node name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's addresses (may be empty when the array knows them already).
    pub fn addresses(&self) -> &[IpAddr] {
        &self.addresses
    }
}

const METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];

impl Profile {
    /// The built-in profile of the Palisade lab storage server.
    pub fn lab() -> Self {
        serde_json::from_value(serde_json::json!({
            "name": "lab",
            "block": {"method": "POST", "path": "/v1/nodes/{node}/block", "body": {"addresses": "{addresses}", "hold": "{hold}"}},
            "unblock": {"method": "POST", "path": "/v1/nodes/{node}/unblock", "body": {"hold": "{hold}"}},
            "status": {"method": "GET", "path": "/v1/nodes/{node}"},
            "blocked_pointer": "/blocked",
            "blocked_value": true
        }))
        .unwrap_or_else(|e| unreachable!("the built-in lab profile is valid JSON: {e}"))
    }

    /// Looks up a built-in profile by name.
    pub fn builtin(name: &str) -> Result<Self, StorageFwError> {
        match name {
            "lab" => Ok(Profile::lab()),
            other => Err(StorageFwError::InvalidProfile {
                name: other.to_owned(),
                reason: "no built-in profile of that name (built-in: lab); pass a JSON profile"
                    .to_owned(),
            }),
        }
    }

    /// Parses and validates a JSON profile.
    pub fn from_json(text: &str) -> Result<Self, StorageFwError> {
        let profile: Profile =
            serde_json::from_str(text).map_err(|e| StorageFwError::InvalidProfile {
                name: "<json>".to_owned(),
                reason: e.to_string(),
            })?;
        profile.validate()?;
        Ok(profile)
    }

    /// Checks methods, paths and the pointer.
    pub fn validate(&self) -> Result<(), StorageFwError> {
        let bad = |reason: String| StorageFwError::InvalidProfile {
            name: self.name.clone(),
            reason,
        };
        for (what, t) in [
            ("block", &self.block),
            ("unblock", &self.unblock),
            ("status", &self.status),
        ] {
            if !METHODS.contains(&t.method.as_str()) {
                return Err(bad(format!("{what}: unsupported method {:?}", t.method)));
            }
            if !t.path.starts_with('/') {
                return Err(bad(format!("{what}: path must start with '/'")));
            }
        }
        if !self.blocked_pointer.is_empty() && !self.blocked_pointer.starts_with('/') {
            return Err(bad("blocked_pointer must be empty or start with '/'".into()));
        }
        Ok(())
    }

    /// Reads "blocked?" out of a status response.
    pub fn is_blocked(&self, node: &str, status: &Value) -> Result<bool, StorageFwError> {
        let value =
            status
                .pointer(&self.blocked_pointer)
                .ok_or_else(|| StorageFwError::BadStatus {
                    node: node.to_owned(),
                    pointer: self.blocked_pointer.clone(),
                    reason: "pointer not present in the response".to_owned(),
                })?;
        Ok(*value == self.blocked_value)
    }
}

impl RequestTemplate {
    /// Substitutes `{node}` and `{addresses}`.
    pub fn render(&self, node: &NodeRef) -> RenderedRequest {
        let joined = node
            .addresses
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let subst = |s: &str| {
            s.replace("{node}", &node.name)
                .replace("{addresses}", &joined)
                .replace("{hold}", node.hold.as_deref().unwrap_or(""))
        };
        RenderedRequest {
            method: self.method.clone(),
            path: subst(&self.path),
            body: self.body.as_ref().map(|b| render_value(b, node, &subst)),
        }
    }
}

fn render_value(v: &Value, node: &NodeRef, subst: &dyn Fn(&str) -> String) -> Value {
    match v {
        Value::String(s) if s == "{addresses}" => Value::Array(
            node.addresses
                .iter()
                .map(|a| Value::String(a.to_string()))
                .collect(),
        ),
        Value::String(s) => Value::String(subst(s)),
        Value::Array(items) => {
            Value::Array(items.iter().map(|i| render_value(i, node, subst)).collect())
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), render_value(v, node, subst)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn m0() -> NodeRef {
        NodeRef::new(
            "m0",
            vec!["10.213.0.11".parse().unwrap(), "fd00::11".parse().unwrap()],
        )
        .unwrap()
    }

    #[test]
    fn lab_profile_renders_block_with_address_array() {
        let r = Profile::lab().block.render(&m0());
        assert_eq!(r.method, "POST");
        assert_eq!(r.path, "/v1/nodes/m0/block");
        assert_eq!(
            r.body,
            Some(json!({"addresses": ["10.213.0.11", "fd00::11"], "hold": ""}))
        );
    }

    #[test]
    fn lab_profile_scopes_block_and_unblock_to_the_fences_hold() {
        let node = m0().with_hold("palisade-0f8d3a52").unwrap();
        let b = Profile::lab().block.render(&node);
        assert_eq!(b.body.unwrap()["hold"], json!("palisade-0f8d3a52"));
        let u = Profile::lab().unblock.render(&node);
        assert_eq!(u.body, Some(json!({"hold": "palisade-0f8d3a52"})));
        for bad in ["", "Upper", "a/b", "a b", "x\"y"] {
            assert!(m0().with_hold(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn vendor_profile_substitutes_in_paths_and_nested_strings() {
        let p = Profile::from_json(
            r#"{"name":"acme",
                "block":{"method":"PUT","path":"/api/hosts/{node}/access","body":{"host":{"name":"{node}","initiators":"{addresses}","note":"fenced {node} ({addresses})"}}},
                "unblock":{"method":"DELETE","path":"/api/hosts/{node}/access?ips={addresses}"},
                "status":{"method":"GET","path":"/api/hosts/{node}"},
                "blocked_pointer":"/host/access","blocked_value":"denied"}"#,
        )
        .unwrap();
        let b = p.block.render(&m0());
        assert_eq!(
            b.body,
            Some(
                json!({"host": {"name": "m0", "initiators": ["10.213.0.11", "fd00::11"],
                                  "note": "fenced m0 (10.213.0.11,fd00::11)"}})
            )
        );
        let u = p.unblock.render(&m0());
        assert_eq!(u.path, "/api/hosts/m0/access?ips=10.213.0.11,fd00::11");
        assert_eq!(u.body, None);
        assert!(p
            .is_blocked("m0", &json!({"host": {"access": "denied"}}))
            .unwrap());
        assert!(!p
            .is_blocked("m0", &json!({"host": {"access": "allowed"}}))
            .unwrap());
        assert!(p.is_blocked("m0", &json!({"host": {}})).is_err());
    }

    #[test]
    fn invalid_profiles_are_refused() {
        let base = Profile::lab();
        let mut p = base.clone();
        p.block.method = "TRACE".into();
        assert!(p.validate().is_err());
        let mut p = base.clone();
        p.status.path = "v1/x".into();
        assert!(p.validate().is_err());
        let mut p = base;
        p.blocked_pointer = "blocked".into();
        assert!(p.validate().is_err());
        assert!(Profile::from_json("{}").is_err());
        assert!(Profile::from_json(r#"{"name":"x","extra":1}"#).is_err());
        assert!(Profile::builtin("acme").is_err());
    }

    #[test]
    fn node_names_are_validated() {
        assert!(NodeRef::new("m0", vec![]).is_ok());
        assert!(NodeRef::new("node-1.rack2", vec![]).is_ok());
        for bad in ["", "M0", "a/b", "-a", "a-", "a b", "../x", "a?b"] {
            assert!(NodeRef::new(bad, vec![]).is_err(), "{bad:?} accepted");
        }
    }
}
