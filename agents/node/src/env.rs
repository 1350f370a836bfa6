//! Container environment: `env` (literal values with `$(VAR)` expansion, `fieldRef`,
//! `configMapKeyRef`, `secretKeyRef`) and `envFrom` (`configMapRef`, `secretRef`), resolved the
//! way the kubelet's `makeEnvironmentVariables` does.
//!
//! Resolution is split in two so the rules stay pure and testable:
//! - [`fetch`] reads every ConfigMap and Secret the container refers to (I/O, once per
//!   container start), recording a missing object as `None`;
//! - [`resolve`] turns the container spec plus those [`Sources`] into the final variables, or
//!   an [`EnvError`] that the worker reports as `CreateContainerConfigError` without starting
//!   the container.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{ConfigMap, Container, Secret};
use kube::{Api, Client};

/// Where containers reach the API server: what the kubelet exports to every container as the
/// `kubernetes` Service's environment (`KUBERNETES_SERVICE_HOST` and `_PORT`, read by every
/// in-cluster client, and the Docker-link style `KUBERNETES_PORT*`).
///
/// Assumptions: the address is reachable from the machine's network (the lab has no
/// kube-proxy, so the Service's ClusterIP is not); the API server's certificate names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiService {
    host: String,
    port: u16,
}

/// Why an API service address is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiServiceError {
    /// Not `HOST:PORT` (an IPv6 host in brackets).
    #[error("{0:?} is not HOST:PORT")]
    Malformed(String),
    /// The URL has no host.
    #[error("the URL {0} has no host")]
    NoHost(String),
}

impl ApiService {
    /// Parses `HOST:PORT` (`[v6]:PORT` for IPv6).
    pub fn parse(s: &str) -> Result<ApiService, ApiServiceError> {
        let bad = || ApiServiceError::Malformed(s.to_string());
        let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
        let port: u16 = port.parse().map_err(|_| bad())?;
        let host = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            // An IPv6 host only in brackets: `fd00::1:443` is ambiguous.
            Some(v6) if v6.parse::<std::net::Ipv6Addr>().is_ok() => v6,
            Some(_) => return Err(bad()),
            None if host.contains(':') => return Err(bad()),
            None => host,
        };
        if host.is_empty() || port == 0 || host.contains(['/', ' ', '@']) {
            return Err(bad());
        }
        Ok(ApiService {
            host: host.to_string(),
            port,
        })
    }

    /// The host and port of a kubeconfig's server URL (443 when it names none).
    pub fn of_url(url: &http::Uri) -> Result<ApiService, ApiServiceError> {
        let host = url
            .host()
            .ok_or_else(|| ApiServiceError::NoHost(url.to_string()))?;
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        Ok(ApiService {
            host: host.to_string(),
            port: url.port_u16().unwrap_or(443),
        })
    }

    /// The variables, as the kubelet names them for the `kubernetes` Service.
    pub fn env(&self) -> Vec<(String, String)> {
        let (h, p) = (&self.host, self.port);
        let url_host = if h.contains(':') {
            format!("[{h}]")
        } else {
            h.clone()
        };
        let link = format!("KUBERNETES_PORT_{p}_TCP");
        vec![
            ("KUBERNETES_SERVICE_HOST".into(), h.clone()),
            ("KUBERNETES_SERVICE_PORT".into(), p.to_string()),
            ("KUBERNETES_SERVICE_PORT_HTTPS".into(), p.to_string()),
            ("KUBERNETES_PORT".into(), format!("tcp://{url_host}:{p}")),
            (link.clone(), format!("tcp://{url_host}:{p}")),
            (format!("{link}_PROTO"), "tcp".into()),
            (format!("{link}_PORT"), p.to_string()),
            (format!("{link}_ADDR"), h.clone()),
        ]
    }
}

/// Why a container's environment cannot be built. Every variant means "do not start the
/// container"; the worker retries later, since the referenced object may appear.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    /// A required ConfigMap does not exist.
    #[error("configmap \"{name}\" not found")]
    ConfigMapNotFound {
        /// The ConfigMap.
        name: String,
    },
    /// A required Secret does not exist.
    #[error("secret \"{name}\" not found")]
    SecretNotFound {
        /// The Secret.
        name: String,
    },
    /// A required key is missing from a ConfigMap.
    #[error("couldn't find key {key} in ConfigMap {namespace}/{name}")]
    ConfigMapKeyNotFound {
        /// Namespace.
        namespace: String,
        /// The ConfigMap.
        name: String,
        /// The key.
        key: String,
    },
    /// A required key is missing from a Secret.
    #[error("couldn't find key {key} in Secret {namespace}/{name}")]
    SecretKeyNotFound {
        /// Namespace.
        namespace: String,
        /// The Secret.
        name: String,
        /// The key.
        key: String,
    },
    /// A `fieldRef` or other source this agent cannot resolve.
    #[error("env {var}: {message}")]
    Unsupported {
        /// The variable.
        var: String,
        /// Why.
        message: String,
    },
    /// Reading a referenced object from the API failed (other than "not found").
    #[error("reading {kind} {namespace}/{name}: {message}")]
    Api {
        /// `configmap` or `secret`.
        kind: &'static str,
        /// Namespace.
        namespace: String,
        /// The object.
        name: String,
        /// The API error.
        message: String,
    },
}

/// The ConfigMaps and Secrets a container refers to, as read from the API: `None` means the
/// object does not exist. Secret values are decoded as UTF-8 (lossily), as the kubelet does
/// with `string(bytes)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sources {
    /// ConfigMap name → its data (`data` and `binaryData`), or `None` if missing.
    pub config_maps: BTreeMap<String, Option<BTreeMap<String, String>>>,
    /// Secret name → its data, or `None` if missing.
    pub secrets: BTreeMap<String, Option<BTreeMap<String, String>>>,
}

/// The names of the ConfigMaps and Secrets that `c` refers to in `env` and `envFrom`.
pub fn referenced(c: &Container) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut cms = BTreeSet::new();
    let mut secrets = BTreeSet::new();
    for e in c.env.iter().flatten() {
        if let Some(f) = &e.value_from {
            if let Some(r) = &f.config_map_key_ref {
                cms.insert(r.name.clone());
            }
            if let Some(r) = &f.secret_key_ref {
                secrets.insert(r.name.clone());
            }
        }
    }
    for f in c.env_from.iter().flatten() {
        if let Some(r) = &f.config_map_ref {
            cms.insert(r.name.clone());
        }
        if let Some(r) = &f.secret_ref {
            secrets.insert(r.name.clone());
        }
    }
    (cms, secrets)
}

/// Reads every object `c` refers to. A missing object is recorded as `None` (whether that is
/// an error depends on `optional`, decided by [`resolve`]); any other API failure is an error.
pub async fn fetch(client: &Client, namespace: &str, c: &Container) -> Result<Sources, EnvError> {
    let (cms, secrets) = referenced(c);
    let mut out = Sources::default();
    let timeout = crate::reporter::API_TIMEOUT;
    let cm_api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    for name in cms {
        let api_err = |message: String| EnvError::Api {
            kind: "configmap",
            namespace: namespace.to_string(),
            name: name.clone(),
            message,
        };
        let got = tokio::time::timeout(timeout, cm_api.get_opt(&name))
            .await
            .map_err(|_| api_err("timed out".into()))?
            .map_err(|e| api_err(e.to_string()))?;
        let data = got.map(|cm| {
            let mut d = cm.data.unwrap_or_default();
            for (k, v) in cm.binary_data.unwrap_or_default() {
                d.insert(k, String::from_utf8_lossy(&v.0).into_owned());
            }
            d
        });
        out.config_maps.insert(name, data);
    }
    let s_api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    for name in secrets {
        let api_err = |message: String| EnvError::Api {
            kind: "secret",
            namespace: namespace.to_string(),
            name: name.clone(),
            message,
        };
        let got = tokio::time::timeout(timeout, s_api.get_opt(&name))
            .await
            .map_err(|_| api_err("timed out".into()))?
            .map_err(|e| api_err(e.to_string()))?;
        let data = got.map(|s| {
            let mut d: BTreeMap<String, String> = s
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                .collect();
            d.extend(s.string_data.unwrap_or_default());
            d
        });
        out.secrets.insert(name, data);
    }
    Ok(out)
}

/// Expands `$(VAR)` references as the kubelet does (`$$` escapes).
pub fn expand(s: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'$' && i + 1 < b.len() {
            if b[i + 1] == b'$' {
                out.push('$');
                i += 2;
                continue;
            }
            if b[i + 1] == b'(' {
                if let Some(end) = s[i + 2..].find(')') {
                    let name = &s[i + 2..i + 2 + end];
                    if let Some((_, v)) = env.iter().rev().find(|(k, _)| k == name) {
                        out.push_str(v);
                        i += 3 + end;
                        continue;
                    }
                }
            }
        }
        let ch = s[i..].chars().next().unwrap_or(' ');
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// Whether `name` is a valid environment variable name (`[-._a-zA-Z][-._a-zA-Z0-9]*`, the
/// kubelet's `IsEnvVarName`). `envFrom` skips keys that are not.
pub fn is_env_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    let ok = |c: char, digits: bool| {
        c.is_ascii_alphabetic() || matches!(c, '-' | '.' | '_') || (digits && c.is_ascii_digit())
    };
    ok(first, false) && chars.all(|c| ok(c, true))
}

/// The result of [`resolve`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolved {
    /// The variables, in order (later entries win over earlier ones with the same name).
    pub vars: Vec<(String, String)>,
    /// Keys skipped by `envFrom` because they are not valid variable names, with the source
    /// (for the `InvalidEnvironmentVariableNames` Event).
    pub skipped: Vec<String>,
}

/// Where an `env`/`envFrom` reference points: a ConfigMap or a Secret.
#[derive(Clone, Copy)]
enum Kind {
    ConfigMap,
    Secret,
}

impl Kind {
    fn objects(self, sources: &Sources) -> &BTreeMap<String, Option<BTreeMap<String, String>>> {
        match self {
            Kind::ConfigMap => &sources.config_maps,
            Kind::Secret => &sources.secrets,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Kind::ConfigMap => "configMap",
            Kind::Secret => "secret",
        }
    }

    fn not_found(self, name: &str) -> EnvError {
        let name = name.to_string();
        match self {
            Kind::ConfigMap => EnvError::ConfigMapNotFound { name },
            Kind::Secret => EnvError::SecretNotFound { name },
        }
    }

    fn key_not_found(self, namespace: &str, name: &str, key: &str) -> EnvError {
        let (namespace, name, key) = (namespace.into(), name.into(), key.into());
        match self {
            Kind::ConfigMap => EnvError::ConfigMapKeyNotFound {
                namespace,
                name,
                key,
            },
            Kind::Secret => EnvError::SecretKeyNotFound {
                namespace,
                name,
                key,
            },
        }
    }
}

/// Looks up `name`/`key` of `kind` in the fetched objects: `Ok(None)` when it is missing but
/// optional, the kubelet's error when it is missing and required.
fn lookup(
    kind: Kind,
    sources: &Sources,
    namespace: &str,
    name: &str,
    key: &str,
    optional: Option<bool>,
) -> Result<Option<String>, EnvError> {
    let optional = optional == Some(true);
    match kind.objects(sources).get(name).and_then(Option::as_ref) {
        None if optional => Ok(None),
        None => Err(kind.not_found(name)),
        Some(d) => match d.get(key) {
            Some(v) => Ok(Some(v.clone())),
            None if optional => Ok(None),
            None => Err(kind.key_not_found(namespace, name, key)),
        },
    }
}

fn set(vars: &mut Vec<(String, String)>, k: String, v: String) {
    vars.retain(|(ek, _)| *ek != k);
    vars.push((k, v));
}

/// Builds the container's environment on top of `base` (the agent's own variables), as the
/// kubelet does: first every `envFrom` source in order (prefix applied, invalid names
/// skipped), then every `env` entry in order, each literal value expanded against what came
/// before. `field` resolves a `fieldRef` path.
///
/// Guarantees: returns an error, and so the container is not started, when a non-optional
/// ConfigMap/Secret or key is missing; an optional one is skipped (the variable is unset).
pub fn resolve(
    namespace: &str,
    c: &Container,
    base: Vec<(String, String)>,
    sources: &Sources,
    field: impl Fn(&str) -> Result<String, String>,
) -> Result<Resolved, EnvError> {
    let mut out = Resolved {
        vars: base,
        skipped: Vec::new(),
    };
    for f in c.env_from.iter().flatten() {
        let prefix = f.prefix.clone().unwrap_or_default();
        let (kind, name, optional) = if let Some(r) = &f.config_map_ref {
            (Kind::ConfigMap, &r.name, r.optional)
        } else if let Some(r) = &f.secret_ref {
            (Kind::Secret, &r.name, r.optional)
        } else {
            continue;
        };
        let (data, label) = match kind.objects(sources).get(name).cloned().flatten() {
            Some(d) => (d, format!("{} {namespace}/{name}", kind.label())),
            None if optional == Some(true) => continue,
            None => return Err(kind.not_found(name)),
        };
        for (k, v) in data {
            let name = format!("{prefix}{k}");
            if !is_env_var_name(&name) {
                out.skipped.push(format!("{name} (from {label})"));
                continue;
            }
            set(&mut out.vars, name, v);
        }
    }
    for e in c.env.iter().flatten() {
        let value = if let Some(v) = &e.value {
            expand(v, &out.vars)
        } else if let Some(from) = &e.value_from {
            if let Some(f) = &from.field_ref {
                field(&f.field_path).map_err(|message| EnvError::Unsupported {
                    var: e.name.clone(),
                    message,
                })?
            } else if let Some(r) = &from.config_map_key_ref {
                let found = lookup(
                    Kind::ConfigMap,
                    sources,
                    namespace,
                    &r.name,
                    &r.key,
                    r.optional,
                )?;
                match found {
                    Some(v) => v,
                    None => continue,
                }
            } else if let Some(r) = &from.secret_key_ref {
                let found = lookup(
                    Kind::Secret,
                    sources,
                    namespace,
                    &r.name,
                    &r.key,
                    r.optional,
                )?;
                match found {
                    Some(v) => v,
                    None => continue,
                }
            } else {
                return Err(EnvError::Unsupported {
                    var: e.name.clone(),
                    message: "only value, fieldRef, configMapKeyRef and secretKeyRef are supported"
                        .into(),
                });
            }
        } else {
            String::new()
        };
        set(&mut out.vars, e.name.clone(), value);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_service_is_exported_the_kubelet_way_and_bad_addresses_refused() {
        let a = ApiService::parse("10.213.0.1:6443").unwrap();
        let env: BTreeMap<String, String> = a.env().into_iter().collect();
        assert_eq!(env["KUBERNETES_SERVICE_HOST"], "10.213.0.1");
        assert_eq!(env["KUBERNETES_SERVICE_PORT"], "6443");
        assert_eq!(env["KUBERNETES_PORT"], "tcp://10.213.0.1:6443");
        assert_eq!(env["KUBERNETES_PORT_6443_TCP_ADDR"], "10.213.0.1");
        let v6 = ApiService::parse("[fd00::1]:443").unwrap();
        let env: BTreeMap<String, String> = v6.env().into_iter().collect();
        assert_eq!(env["KUBERNETES_SERVICE_HOST"], "fd00::1");
        assert_eq!(env["KUBERNETES_PORT"], "tcp://[fd00::1]:443");
        let from_url = ApiService::of_url(&"https://10.213.0.1:6443".parse().unwrap()).unwrap();
        assert_eq!(from_url, a);
        let default_port = ApiService::of_url(&"https://api.example".parse().unwrap()).unwrap();
        assert_eq!(default_port.env()[1].1, "443");
        for bad in [
            "10.0.0.1",
            "10.0.0.1:0",
            ":443",
            "h:port",
            "fd00::1:443",
            "u@h:1",
        ] {
            assert!(ApiService::parse(bad).is_err(), "{bad} refused");
        }
    }

    #[test]
    fn expand_follows_kubelet_rules() {
        let env = vec![("A".to_string(), "x".to_string())];
        assert_eq!(expand("$(A)/$(B)/$$(A)/$", &env), "x/$(B)/$(A)/$");
        assert_eq!(expand("plain é", &env), "plain é");
    }
    use serde_json::json;

    fn ctr(v: serde_json::Value) -> Container {
        serde_json::from_value(v).unwrap()
    }

    fn sources() -> Sources {
        let mut s = Sources::default();
        s.config_maps.insert(
            "cfg".into(),
            Some(BTreeMap::from([
                ("mode".into(), "fast".into()),
                ("LEVEL".into(), "3".into()),
                ("bad key".into(), "x".into()),
            ])),
        );
        s.config_maps.insert("gone".into(), None);
        s.secrets.insert(
            "creds".into(),
            Some(BTreeMap::from([("password".into(), "hunter2".into())])),
        );
        s.secrets.insert("nosecret".into(), None);
        s
    }

    fn no_fields(p: &str) -> Result<String, String> {
        Err(format!("unsupported fieldRef {p:?}"))
    }

    fn get<'a>(r: &'a Resolved, k: &str) -> Option<&'a str> {
        r.vars
            .iter()
            .rev()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn key_refs_resolve_and_feed_later_expansions() {
        let c = ctr(json!({"name": "m", "env": [
            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode"}}},
            {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
            {"name": "BOTH", "value": "$(MODE)-$(PW)"},
        ]}));
        let r = resolve("ns", &c, vec![], &sources(), no_fields).unwrap();
        assert_eq!(get(&r, "MODE"), Some("fast"));
        assert_eq!(get(&r, "PW"), Some("hunter2"));
        assert_eq!(get(&r, "BOTH"), Some("fast-hunter2"));
    }

    #[test]
    fn missing_required_keys_and_objects_are_errors() {
        let cases = [
            (
                json!({"configMapKeyRef": {"name": "cfg", "key": "nope"}}),
                EnvError::ConfigMapKeyNotFound {
                    namespace: "ns".into(),
                    name: "cfg".into(),
                    key: "nope".into(),
                },
            ),
            (
                json!({"configMapKeyRef": {"name": "gone", "key": "k"}}),
                EnvError::ConfigMapNotFound {
                    name: "gone".into(),
                },
            ),
            (
                json!({"secretKeyRef": {"name": "creds", "key": "user"}}),
                EnvError::SecretKeyNotFound {
                    namespace: "ns".into(),
                    name: "creds".into(),
                    key: "user".into(),
                },
            ),
            (
                json!({"secretKeyRef": {"name": "nosecret", "key": "k"}}),
                EnvError::SecretNotFound {
                    name: "nosecret".into(),
                },
            ),
        ];
        for (from, want) in cases {
            let c = ctr(json!({"name": "m", "env": [{"name": "X", "valueFrom": from}]}));
            assert_eq!(
                resolve("ns", &c, vec![], &sources(), no_fields),
                Err(want.clone())
            );
            assert!(
                want.to_string().contains("couldn't find key")
                    || want.to_string().contains("not found")
            );
        }
    }

    #[test]
    fn optional_refs_leave_the_variable_unset() {
        let c = ctr(json!({"name": "m", "env": [
            {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "nope", "optional": true}}},
            {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "k", "optional": true}}},
            {"name": "C", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "nope", "optional": true}}},
            {"name": "D", "valueFrom": {"secretKeyRef": {"name": "nosecret", "key": "k", "optional": true}}},
        ], "envFrom": [
            {"configMapRef": {"name": "gone", "optional": true}},
            {"secretRef": {"name": "nosecret", "optional": true}},
        ]}));
        let r = resolve(
            "ns",
            &c,
            vec![("KEEP".into(), "1".into())],
            &sources(),
            no_fields,
        )
        .unwrap();
        assert_eq!(r.vars, vec![("KEEP".to_string(), "1".to_string())]);
    }

    #[test]
    fn env_from_applies_prefix_skips_invalid_names_and_env_wins() {
        let c = ctr(json!({"name": "m",
            "envFrom": [
                {"configMapRef": {"name": "cfg"}, "prefix": "CFG_"},
                {"secretRef": {"name": "creds"}},
            ],
            "env": [{"name": "password", "value": "override"}],
        }));
        let r = resolve("ns", &c, vec![], &sources(), no_fields).unwrap();
        assert_eq!(get(&r, "CFG_mode"), Some("fast"));
        assert_eq!(get(&r, "CFG_LEVEL"), Some("3"));
        assert_eq!(get(&r, "password"), Some("override"));
        assert_eq!(
            r.skipped,
            vec!["CFG_bad key (from configMap ns/cfg)".to_string()]
        );
        let missing = ctr(json!({"name": "m", "envFrom": [{"configMapRef": {"name": "gone"}}]}));
        assert_eq!(
            resolve("ns", &missing, vec![], &sources(), no_fields),
            Err(EnvError::ConfigMapNotFound {
                name: "gone".into()
            })
        );
    }

    #[test]
    fn field_refs_go_through_the_resolver() {
        let c = ctr(json!({"name": "m", "env": [
            {"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ]}));
        let r = resolve("ns", &c, vec![], &sources(), |p| {
            (p == "metadata.name")
                .then(|| "pod-0".to_string())
                .ok_or_else(|| "no".to_string())
        })
        .unwrap();
        assert_eq!(get(&r, "N"), Some("pod-0"));
        let bad = ctr(json!({"name": "m", "env": [
            {"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "status.nope"}}},
        ]}));
        assert!(matches!(
            resolve("ns", &bad, vec![], &sources(), no_fields),
            Err(EnvError::Unsupported { .. })
        ));
    }

    #[test]
    fn env_var_names_follow_the_kubelet() {
        for ok in ["A", "a_b", "-x", ".y", "A1", "my.var-2"] {
            assert!(is_env_var_name(ok), "{ok}");
        }
        for bad in ["", "1A", "a b", "a=b", "é"] {
            assert!(!is_env_var_name(bad), "{bad}");
        }
    }

    #[test]
    fn referenced_lists_every_source() {
        let c = ctr(json!({"name": "m",
            "env": [
                {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "c1", "key": "k"}}},
                {"name": "B", "valueFrom": {"secretKeyRef": {"name": "s1", "key": "k"}}},
            ],
            "envFrom": [{"configMapRef": {"name": "c2"}}, {"secretRef": {"name": "s2"}}],
        }));
        let (cms, secrets) = referenced(&c);
        assert_eq!(cms.into_iter().collect::<Vec<_>>(), vec!["c1", "c2"]);
        assert_eq!(secrets.into_iter().collect::<Vec<_>>(), vec!["s1", "s2"]);
    }
}
