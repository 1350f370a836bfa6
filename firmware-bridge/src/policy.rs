//! Authorization: which client identity may act on which targets. Deny by default.
//!
//! A client's identity comes from its verified certificate (see [`crate::tls`]): the subject
//! CN, DNS SANs and URI SANs. A rule's `client` matches one of them, either bare (any kind) or
//! with a kind prefix: `cn:`, `dns:` or `uri:`.

use std::collections::BTreeSet;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The identity of an authenticated client, taken from its verified certificate.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ClientIdentity {
    /// Subject common name.
    pub cn: Option<String>,
    /// DNS subject alternative names.
    pub dns: Vec<String>,
    /// URI subject alternative names.
    pub uris: Vec<String>,
}

impl ClientIdentity {
    /// A short name for logs, metrics and the audit log: the CN, else the first SAN.
    pub fn name(&self) -> String {
        self.cn
            .clone()
            .or_else(|| self.dns.first().cloned())
            .or_else(|| self.uris.first().cloned())
            .unwrap_or_else(|| "<anonymous>".into())
    }

    fn matches(&self, pattern: &str) -> bool {
        if let Some(cn) = pattern.strip_prefix("cn:") {
            return self.cn.as_deref() == Some(cn);
        }
        if let Some(d) = pattern.strip_prefix("dns:") {
            return self.dns.iter().any(|x| x == d);
        }
        if let Some(u) = pattern.strip_prefix("uri:") {
            return self.uris.iter().any(|x| x == u);
        }
        self.cn.as_deref() == Some(pattern)
            || self.dns.iter().any(|x| x == pattern)
            || self.uris.iter().any(|x| x == pattern)
    }
}

/// One rule of the policy, as written in the config file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyRule {
    /// Identity pattern: `name` (CN or any SAN), `cn:name`, `dns:name` or `uri:name`.
    pub client: String,
    /// Target ids this client may act on and see; `"*"` means all targets.
    #[serde(default)]
    pub targets: Vec<String>,
    /// Whether this client may read the audit log (restricted to its targets). Default false.
    #[serde(default)]
    pub read_audit: bool,
}

/// What a policy decided for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Allowed.
    Allow,
    /// Denied: no rule matches this client.
    UnknownClient,
    /// Denied: the client is known, but not for this target.
    TargetNotAllowed,
}

/// The compiled policy.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    rules: Vec<PolicyRule>,
}

impl Policy {
    /// Builds a policy from rules.
    pub fn new(rules: Vec<PolicyRule>) -> Self {
        Self { rules }
    }

    fn rules_for<'a>(&'a self, id: &'a ClientIdentity) -> impl Iterator<Item = &'a PolicyRule> {
        self.rules.iter().filter(move |r| id.matches(&r.client))
    }

    /// May `id` act on `target`?
    pub fn decide(&self, id: &ClientIdentity, target: &str) -> Decision {
        let mut known = false;
        for r in self.rules_for(id) {
            known = true;
            if r.targets.iter().any(|t| t == "*" || t == target) {
                return Decision::Allow;
            }
        }
        if known {
            Decision::TargetNotAllowed
        } else {
            Decision::UnknownClient
        }
    }

    /// The audit-log scope of `id`: `None` if it may not read the audit log, else the set of
    /// targets whose records it may see (`"*"` for all).
    pub fn audit_scope(&self, id: &ClientIdentity) -> Option<BTreeSet<String>> {
        let mut scope: Option<BTreeSet<String>> = None;
        for r in self.rules_for(id).filter(|r| r.read_audit) {
            scope
                .get_or_insert_with(BTreeSet::new)
                .extend(r.targets.iter().cloned());
        }
        scope
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(cn: &str, dns: &[&str]) -> ClientIdentity {
        ClientIdentity {
            cn: Some(cn.into()),
            dns: dns.iter().map(|s| s.to_string()).collect(),
            uris: vec![],
        }
    }

    #[test]
    fn deny_by_default_and_per_target() {
        let p = Policy::new(vec![
            PolicyRule {
                client: "cn:ctrl".into(),
                targets: vec!["m0".into()],
                read_audit: true,
            },
            PolicyRule {
                client: "dns:ops.example".into(),
                targets: vec!["*".into()],
                read_audit: false,
            },
        ]);
        assert_eq!(p.decide(&id("ctrl", &[]), "m0"), Decision::Allow);
        assert_eq!(p.decide(&id("ctrl", &[]), "m1"), Decision::TargetNotAllowed);
        assert_eq!(p.decide(&id("other", &[]), "m0"), Decision::UnknownClient);
        assert_eq!(p.decide(&id("x", &["ops.example"]), "m7"), Decision::Allow);
        // A CN equal to a dns: pattern does not match it.
        assert_eq!(
            p.decide(&id("ops.example", &[]), "m7"),
            Decision::UnknownClient
        );
        assert_eq!(
            p.audit_scope(&id("ctrl", &[])),
            Some(["m0".to_string()].into())
        );
        assert_eq!(p.audit_scope(&id("x", &["ops.example"])), None);
        assert_eq!(
            Policy::default().decide(&id("ctrl", &[]), "m0"),
            Decision::UnknownClient
        );
    }
}
