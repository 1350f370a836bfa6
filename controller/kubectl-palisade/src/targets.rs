//! `targets generate`: one `FenceTarget` per row of a CSV inventory, from a template, ready for
//! `kubectl apply -f -` or a GitOps repository. Needs no cluster.
//!
//! Every generated object is checked as the controller will check it before anything is
//! printed: the template's fields against the CRD's schema ([`palisade_model::crds`]), the
//! spec with [`palisade_model::FenceTargetSpec::validate`] (what the webhook and the
//! controller run), and every device URL with the parser that will drive the device
//! ([`palisade_fence::Target::parse`], [`palisade_storagefw::Target::parse`]: an unknown query
//! key is refused there). Every direct BMC URL (`ipmi://`, `redfish+https://`) must carry the
//! identity pin of its row's `system_uuid`. One bad row refuses the whole inventory: every
//! problem is reported on stderr, naming its line and column, and nothing goes to stdout.
//!
//! Credentials never pass through here: the inventory and the template name Secrets only, and
//! a column named like a credential is refused.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;

use palisade_model::identity::{normalize_uuid, same_machine};
use palisade_model::target::{redact_url, DeviceScheme, TargetError};
use palisade_model::{FenceTarget, FenceTargetSpec};
use serde_json::{json, Value};

use crate::output::Format;

/// The inventory and template formats, as `targets generate --help` shows them.
pub const FORMAT_HELP: &str = "\
Inventory: a CSV file (RFC 4180: a field in double quotes may hold commas; \"\" is a quote),
a header row first, one node a row. Blank lines are skipped; spaces around a value are not part
of it. Columns:
  node         the Node's name, which is the FenceTarget's name (required, once per file)
  bmc          the BMC: USER@HOST[:PORT] (an IPMI BMC, ipmi://USER@HOST[:PORT]), or a whole
               ipmi:// or redfish+https:// device URL (docs/reference/device-urls.md)
  system_uuid  the machine's SMBIOS UUID (the Node's status.nodeInfo.systemUUID): written into
               the BMC's URL as its identity pin (guid= for ipmi://, uuid= for redfish+https://)
  pdu          optional: a PDU outlet, HOST[:PORT]/OUTLET[,OUTLET...] (SNMP v2c); empty: no PDU
  secret       optional: the Secret (in the controller's namespace) with this node's device
               credentials (password, community, ...); default fence-<node>
  pdu_secret   optional: the Secret with the PDU's community; default: the row's secret
  any other    a column that the template names as {column}
A column that the template does not use is an error (a misspelt sytem_uuid must not drop a
pin), and so is a column named like a credential: credentials live in Secrets only.

Template (--template): a FenceTarget spec in YAML (levels: ...) whose strings may hold
placeholders: {node}, {bmc} (the BMC's device URL, identity pin included), {system_uuid},
{pdu_host}, {pdu_outlet}, {secret}, {pdu_secret}, and {column} for any other column. Without
it: a level `bmc` with the BMC, then, on rows with a pdu, a level `pdu` with its outlet.

Every object is validated as the controller validates it (schema fields, validate(), the device
URL parsers, the identity pin of every direct BMC URL) before anything is printed: a bad row
prints every problem with its line and column on stderr, nothing on stdout, and exits 1.

Example:
  node,bmc,system_uuid,pdu
  m1,admin@10.0.20.11,4c4c4544-0037-3010-8052-b4c04f4d3231,pdu-a.mgmt/7
  m2,admin@10.0.20.12,4c4c4544-0037-3010-8052-b4c04f4d3232,
  $ kubectl palisade targets generate --inventory nodes.csv | kubectl apply -f -";

/// Flags of `targets generate`.
#[derive(clap::Args, Debug, Clone)]
pub struct GenerateArgs {
    /// The inventory: a CSV file with a header row (see below).
    #[arg(long, value_name = "FILE")]
    pub inventory: PathBuf,
    /// A FenceTarget spec in YAML with {placeholders}; default: a BMC level, then a PDU level.
    #[arg(long, value_name = "FILE")]
    pub template: Option<PathBuf>,
    /// A YAML stream of FenceTargets, or a JSON List.
    #[arg(
        short = 'o',
        long = "output",
        value_enum,
        value_name = "FORMAT",
        default_value = "yaml"
    )]
    pub format: Format,
}

/// `targets generate`: prints the FenceTargets, or every problem and nothing on stdout.
pub fn run(args: &GenerateArgs, secret_namespace: &str) -> anyhow::Result<u8> {
    let read = |p: &PathBuf| {
        std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("reading {}: {e}", p.display()))
    };
    let inventory = read(&args.inventory)?;
    let template = args.template.as_ref().map(read).transpose()?;
    let options = Options {
        template: template.as_deref(),
        secret_namespace,
        format: args.format,
    };
    match generate(&inventory, &options) {
        Ok(out) => {
            print!("{out}");
            Ok(0)
        }
        Err(problems) => {
            for p in &problems {
                eprintln!("{}: {p}", args.inventory.display());
            }
            anyhow::bail!(
                "{} problem(s) in {}; nothing was generated",
                problems.len(),
                args.inventory.display()
            )
        }
    }
}

/// What `generate` needs besides the inventory.
#[derive(Debug, Clone, Copy)]
pub struct Options<'a> {
    /// The template's YAML text; `None`: the built-in one.
    pub template: Option<&'a str>,
    /// The namespace of the built-in template's Secrets (the controller's).
    pub secret_namespace: &'a str,
    /// The output format.
    pub format: Format,
}

/// One problem of an inventory or template: where, which column, what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// `template`, `header`, or `line N (node X)`.
    pub at: String,
    /// The inventory column concerned, if one is.
    pub column: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.at)?;
        if let Some(c) = &self.column {
            write!(f, ", column {c}")?;
        }
        write!(f, ": {}", self.message)
    }
}

fn problem(at: &str, column: Option<&str>, message: impl Into<String>) -> Problem {
    Problem {
        at: at.to_string(),
        column: column.map(str::to_string),
        message: message.into(),
    }
}

/// The placeholders computed from a row rather than copied from one column, with the columns
/// each is made of (`secret` and `pdu_secret` have defaults, so their columns are optional).
const DERIVED: &[(&str, &[&str])] = &[
    ("bmc", &["bmc", "system_uuid"]),
    ("pdu_host", &["pdu"]),
    ("pdu_outlet", &["pdu"]),
    ("secret", &[]),
    ("pdu_secret", &[]),
];

/// Column names that would carry a credential: refused, whatever the template says.
const CREDENTIAL_COLUMNS: &[&str] = &[
    "password",
    "passwd",
    "pass",
    "community",
    "token",
    "auth_password",
    "priv_password",
    "authpassword",
    "privpassword",
    "secret_key",
];

/// The FenceTargets for `inventory`, rendered in `options.format`; or every problem found.
///
/// Guarantees: `Ok` only when every row gave a FenceTarget that passes the schema's fields,
/// `FenceTargetSpec::validate`, the device URL parsers and the identity-pin check; otherwise
/// nothing is rendered at all.
pub fn generate(inventory: &str, options: &Options) -> Result<String, Vec<Problem>> {
    let template = match options.template {
        Some(text) => Some(Template::parse(text)?),
        None => None,
    };
    let records = parse_csv(inventory).map_err(|p| vec![p])?;
    let Some(((_, header), rows)) = records.split_first() else {
        return Err(vec![problem(
            "header",
            None,
            "the inventory is empty: a header row (node,bmc,system_uuid,...) is required",
        )]);
    };
    let columns = check_header(header, template.as_ref())?;
    let mut problems = Vec::new();
    let mut targets = Vec::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut machines: BTreeMap<String, (usize, String)> = BTreeMap::new();
    for (line, cells) in rows {
        if cells.len() != header.len() {
            problems.push(problem(
                &format!("line {line}"),
                None,
                format!(
                    "{} fields, but the header has {}",
                    cells.len(),
                    header.len()
                ),
            ));
            continue;
        }
        let row: BTreeMap<&str, &str> = columns
            .iter()
            .map(String::as_str)
            .zip(cells.iter().map(String::as_str))
            .collect();
        let node = row.get("node").copied().unwrap_or_default();
        let at = if node.is_empty() {
            format!("line {line}")
        } else {
            format!("line {line} (node {node})")
        };
        if !node.is_empty() {
            if let Some(first) = seen.get(node) {
                problems.push(problem(
                    &at,
                    Some("node"),
                    format!("node {node} is listed twice (first on line {first}): one FenceTarget per node"),
                ));
                continue;
            }
            seen.insert(node.to_string(), *line);
        }
        // Two nodes cannot be one machine: a copied UUID would pin a BMC to another node.
        if let Some(uuid) = row.get("system_uuid").and_then(|u| normalize_uuid(u)) {
            if let Some((first, other)) = machines.get(&uuid) {
                problems.push(problem(
                    &at,
                    Some("system_uuid"),
                    format!("{uuid} is also node {other}'s (line {first}): two nodes cannot be one machine"),
                ));
                continue;
            }
            machines.insert(uuid, (*line, node.to_string()));
        }
        match target_of(&row, &at, template.as_ref(), options.secret_namespace) {
            Ok(t) => targets.push(t),
            Err(mut p) => problems.append(&mut p),
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    render(&targets, options.format).map_err(|e| vec![problem("output", None, e)])
}

/// The header's column names, once each, every one used and every one needed present.
fn check_header(
    header: &[String],
    template: Option<&Template>,
) -> Result<Vec<String>, Vec<Problem>> {
    let mut problems = Vec::new();
    let mut names = Vec::new();
    for name in header {
        if names.contains(name) {
            problems.push(problem("header", Some(name), "given twice"));
        }
        names.push(name.clone());
    }
    let (used, required): (BTreeSet<String>, BTreeSet<String>) = match template {
        None => (
            ["node", "bmc", "system_uuid", "pdu", "secret", "pdu_secret"]
                .map(String::from)
                .into(),
            ["node", "bmc", "system_uuid"].map(String::from).into(),
        ),
        Some(t) => {
            let mut used = BTreeSet::from(["node".to_string()]);
            let mut required = used.clone();
            for p in &t.placeholders {
                match DERIVED.iter().find(|(d, _)| d == p) {
                    Some((_, cols)) => {
                        required.extend(cols.iter().map(|c| c.to_string()));
                        used.extend(cols.iter().map(|c| c.to_string()));
                        // `secret` and `pdu_secret` are optional columns of their own; the
                        // PDU's Secret defaults to the row's.
                        if cols.is_empty() {
                            used.insert(p.clone());
                        }
                        if p == "pdu_secret" {
                            used.insert("secret".into());
                        }
                    }
                    None => {
                        required.insert(p.clone());
                        used.insert(p.clone());
                    }
                }
            }
            (used, required)
        }
    };
    for name in &names {
        let lower = name.to_ascii_lowercase();
        if CREDENTIAL_COLUMNS.contains(&lower.as_str()) {
            problems.push(problem(
                "header",
                Some(name),
                "credentials never go in the inventory: put them in the Secret that the secret column names",
            ));
        } else if !used.contains(name) {
            let hint = closest(name, used.iter().map(String::as_str))
                .map(|c| format!(" (did you mean {c}?)"))
                .unwrap_or_default();
            problems.push(problem(
                "header",
                Some(name),
                format!(
                    "not a column the template uses{hint}; used: {}",
                    used.iter().cloned().collect::<Vec<_>>().join(", ")
                ),
            ));
        }
    }
    for needed in &required {
        if !names.contains(needed) {
            let why = if template.is_some() && needed != "node" {
                "the template refers to it"
            } else {
                "required"
            };
            problems.push(problem("header", Some(needed), format!("missing: {why}")));
        }
    }
    if problems.is_empty() {
        Ok(names)
    } else {
        Err(problems)
    }
}

/// A user template: the spec as JSON, and the placeholders it refers to.
struct Template {
    spec: Value,
    placeholders: BTreeSet<String>,
}

impl Template {
    fn parse(text: &str) -> Result<Self, Vec<Problem>> {
        let spec: Value = serde_saphyr::from_str(text)
            .map_err(|e| vec![problem("template", None, format!("not YAML: {e}"))])?;
        if !spec.is_object() {
            return Err(vec![problem(
                "template",
                None,
                "must be a FenceTarget spec: a mapping with levels",
            )]);
        }
        let mut unknown = Vec::new();
        unknown_fields(&spec, &spec_schema(), "spec", &mut unknown);
        if !unknown.is_empty() {
            return Err(unknown
                .into_iter()
                .map(|path| {
                    problem(
                        "template",
                        None,
                        format!(
                            "{path} is not a field of a FenceTarget spec (it would be dropped)"
                        ),
                    )
                })
                .collect());
        }
        let mut placeholders = BTreeSet::new();
        strings(&spec, &mut |s| {
            placeholders.extend(placeholders_in(s).into_iter().map(String::from))
        });
        Ok(Template { spec, placeholders })
    }
}

/// The built-in template: the BMC, then the PDU outlet when the row has one.
fn default_template(with_pdu: bool, namespace: &str) -> Value {
    let mut levels = vec![json!({
        "name": "bmc",
        "devices": [{
            "url": "{bmc}",
            "kind": "Power",
            "credentialsSecretRef": {"name": "{secret}", "namespace": namespace},
        }],
    })];
    if with_pdu {
        levels.push(json!({
            "name": "pdu",
            "devices": [{
                "url": "snmp+pdu://{pdu_host}/outlet/{pdu_outlet}",
                "kind": "Power",
                "credentialsSecretRef": {"name": "{pdu_secret}", "namespace": namespace},
            }],
        }));
    }
    json!({ "levels": levels })
}

/// The OpenAPI schema of `FenceTarget.spec`, as the CRD gives it to the API server.
fn spec_schema() -> Value {
    palisade_model::crds()
        .into_iter()
        .find(|c| c.spec.names.kind == "FenceTarget")
        .and_then(|c| c.spec.versions.into_iter().next())
        .and_then(|v| v.schema)
        .and_then(|s| s.open_api_v3_schema)
        .and_then(|s| serde_json::to_value(s).ok())
        .and_then(|s| s.pointer("/properties/spec").cloned())
        .unwrap_or(Value::Null)
}

/// The paths in `value` of fields that `schema` does not have (the API server would prune or
/// refuse them, serde would drop them).
fn unknown_fields(value: &Value, schema: &Value, path: &str, out: &mut Vec<String>) {
    match value {
        Value::Object(m) => {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (k, v) in m {
                    match props.get(k) {
                        Some(s) => unknown_fields(v, s, &format!("{path}.{k}"), out),
                        None => out.push(format!("{path}.{k}")),
                    }
                }
            } else if let Some(ap) = schema.get("additionalProperties") {
                for (k, v) in m {
                    unknown_fields(v, ap, &format!("{path}.{k}"), out);
                }
            }
        }
        Value::Array(a) => {
            if let Some(items) = schema.get("items") {
                for (i, v) in a.iter().enumerate() {
                    unknown_fields(v, items, &format!("{path}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

/// Calls `f` on every string in `v`.
fn strings(v: &Value, f: &mut dyn FnMut(&str)) {
    match v {
        Value::String(s) => f(s),
        Value::Array(a) => a.iter().for_each(|v| strings(v, f)),
        Value::Object(m) => m.values().for_each(|v| strings(v, f)),
        _ => {}
    }
}

/// The names of the `{name}` placeholders in `s` (letters, digits, `_`, `-`); other braces are
/// left alone.
fn placeholders_in(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(open) = rest.find('{') {
        rest = &rest[open + 1..];
        if let Some(close) = rest.find('}') {
            let name = &rest[..close];
            if is_placeholder_name(name) {
                out.push(name);
                rest = &rest[close + 1..];
            }
        }
    }
    out
}

fn is_placeholder_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// `s` with every placeholder replaced by `value(name)` (which has checked it).
fn substitute(s: &str, value: &dyn Fn(&str) -> Option<String>) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after.find('}') {
            Some(close) if is_placeholder_name(&after[..close]) => {
                out.push_str(&value(&after[..close]).unwrap_or_default());
                rest = &after[close + 1..];
            }
            _ => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// `v` with every string's placeholders replaced.
fn render_value(v: &Value, value: &dyn Fn(&str) -> Option<String>) -> Value {
    match v {
        Value::String(s) => Value::String(substitute(s, value)),
        Value::Array(a) => Value::Array(a.iter().map(|v| render_value(v, value)).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| (k.clone(), render_value(v, value)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The FenceTarget of one row, checked.
fn target_of(
    row: &BTreeMap<&str, &str>,
    at: &str,
    template: Option<&Template>,
    namespace: &str,
) -> Result<FenceTarget, Vec<Problem>> {
    let node = row.get("node").copied().unwrap_or_default();
    if node.is_empty() {
        return Err(vec![problem(at, Some("node"), "missing value")]);
    }
    if !is_dns_subdomain(node) {
        return Err(vec![problem(
            at,
            Some("node"),
            format!("{node:?} is not a Node name (lower-case letters, digits, '-' and '.', at most 253)"),
        )]);
    }
    let has_pdu = row.get("pdu").is_some_and(|p| !p.is_empty());
    let spec_template = match template {
        Some(t) => t.spec.clone(),
        None => default_template(has_pdu, namespace),
    };
    let mut wanted = BTreeSet::new();
    strings(&spec_template, &mut |s| {
        wanted.extend(placeholders_in(s).into_iter().map(String::from))
    });
    let mut problems = Vec::new();
    let mut values: BTreeMap<String, String> = BTreeMap::new();
    for name in &wanted {
        match placeholder_value(name, row, node) {
            Ok(v) => {
                values.insert(name.clone(), v);
            }
            Err(p) => problems.push(problem(at, Some(&p.0), p.1)),
        }
    }
    if !problems.is_empty() {
        problems.dedup();
        return Err(problems);
    }
    let rendered = render_value(&spec_template, &|name| values.get(name).cloned());
    let spec: FenceTargetSpec = serde_json::from_value(rendered).map_err(|e| {
        vec![problem(
            at,
            None,
            format!("the template does not give a FenceTarget spec: {e}"),
        )]
    })?;
    // Which columns went into a device's URL: the column a device's problem is charged to.
    let url_columns = |level: usize, device: usize| -> Option<String> {
        let url = spec_template
            .pointer(&format!("/levels/{level}/devices/{device}/url"))
            .and_then(Value::as_str)?;
        let cols: BTreeSet<&str> = placeholders_in(url)
            .into_iter()
            .flat_map(|p| match DERIVED.iter().find(|(d, _)| *d == p) {
                Some(("bmc", _)) => vec!["bmc"],
                Some((_, cols)) if !cols.is_empty() => cols.to_vec(),
                _ => vec![p],
            })
            .collect();
        (!cols.is_empty()).then(|| cols.into_iter().collect::<Vec<_>>().join("+"))
    };
    if let Err(errors) = spec.validate() {
        return Err(errors
            .iter()
            .map(|e| {
                let column = target_error_device(e).and_then(|(l, d)| url_columns(l, d));
                problem(at, column.as_deref(), e.to_string())
            })
            .collect());
    }
    let expected = values
        .get("system_uuid")
        .cloned()
        .or_else(|| row.get("system_uuid").and_then(|u| normalize_uuid(u)));
    for (l, level) in spec.levels.iter().enumerate() {
        for (d, device) in level.devices.iter().enumerate() {
            let column = url_columns(l, d);
            let url = redact_url(&device.url);
            let here = format!("levels[{l}].devices[{d}].url {url:?}");
            if let Err(message) = check_device_url(&device.url, expected.as_deref()) {
                problems.push(problem(at, column.as_deref(), format!("{here}: {message}")));
            }
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(FenceTarget::new(node, spec))
}

/// The device a model error is about, if it is about one.
fn target_error_device(e: &TargetError) -> Option<(usize, usize)> {
    match *e {
        TargetError::UnknownScheme { level, device, .. }
        | TargetError::KindMismatch { level, device, .. }
        | TargetError::BridgeUrl { level, device, .. }
        | TargetError::Credentials { level, device, .. }
        | TargetError::StorageScope { level, device, .. }
        | TargetError::CredentialsInUrl { level, device, .. }
        | TargetError::CannotReset { level, device }
        | TargetError::Timeout { level, device, .. } => Some((level, device)),
        _ => None,
    }
}

/// Parses `url` as the agent that will drive it does; a direct BMC must carry a pin naming
/// `expected` (the row's machine).
fn check_device_url(url: &str, expected: Option<&str>) -> Result<(), String> {
    let pin = match DeviceScheme::of(url) {
        Some(DeviceScheme::StorageFirewall) => {
            palisade_storagefw::Target::parse(url).map_err(|e| e.to_string())?;
            return Ok(());
        }
        Some(_) => match palisade_fence::Target::parse(url).map_err(|e| e.to_string())? {
            palisade_fence::Target::Ipmi(t) => ("guid", t.system_guid),
            palisade_fence::Target::Redfish(t) => ("uuid", t.system_uuid),
            palisade_fence::Target::Pdu(_) | palisade_fence::Target::Bridge(_) => return Ok(()),
        },
        // validate() has refused it already.
        None => return Ok(()),
    };
    match (pin, expected) {
        ((key, None), _) => Err(format!(
            "a direct BMC needs its identity pin: {key}={{system_uuid}} (or {{bmc}}, which has it)"
        )),
        ((_, Some(p)), Some(e)) if !same_machine(&p, e) => Err(format!(
            "pins {p}, another machine than the row's system_uuid {e}"
        )),
        _ => Ok(()),
    }
}

/// The value of placeholder `name` for `row`, or (column, problem).
fn placeholder_value(
    name: &str,
    row: &BTreeMap<&str, &str>,
    node: &str,
) -> Result<String, (String, String)> {
    let cell = |column: &str| -> Result<String, (String, String)> {
        match row.get(column) {
            Some(v) if !v.is_empty() => Ok(v.to_string()),
            _ => Err((column.to_string(), "missing value".to_string())),
        }
    };
    let secret = || -> Result<String, (String, String)> {
        let name = match row.get("secret") {
            Some(s) if !s.is_empty() => s.to_string(),
            _ => format!("fence-{node}"),
        };
        if is_dns_subdomain(&name) {
            Ok(name)
        } else {
            Err(("secret".into(), format!("{name:?} is not a Secret name")))
        }
    };
    match name {
        "system_uuid" => system_uuid(&cell("system_uuid")?),
        "bmc" => bmc_url(&cell("bmc")?, &system_uuid(&cell("system_uuid")?)?),
        "pdu_host" | "pdu_outlet" => {
            let pdu = cell("pdu")?;
            let bad = || {
                (
                    "pdu".to_string(),
                    "write HOST[:PORT]/OUTLET[,OUTLET...], for example pdu-a.mgmt/7".to_string(),
                )
            };
            let (host, outlets) = pdu.split_once('/').ok_or_else(bad)?;
            let outlets_ok = !outlets.is_empty()
                && outlets
                    .split(',')
                    .all(|o| !o.is_empty() && o.bytes().all(|b| b.is_ascii_digit()));
            if host.is_empty() || !outlets_ok {
                return Err(bad());
            }
            Ok(if name == "pdu_host" { host } else { outlets }.to_string())
        }
        "secret" => secret(),
        "pdu_secret" => match row.get("pdu_secret") {
            Some(s) if !s.is_empty() => {
                if is_dns_subdomain(s) {
                    Ok(s.to_string())
                } else {
                    Err(("pdu_secret".into(), format!("{s:?} is not a Secret name")))
                }
            }
            _ => secret(),
        },
        other => cell(other),
    }
}

/// The canonical form of a system UUID cell.
fn system_uuid(cell: &str) -> Result<String, (String, String)> {
    normalize_uuid(cell).ok_or_else(|| {
        (
            "system_uuid".to_string(),
            format!("{cell:?} is not a machine's UUID (32 hex digits, dashes allowed, not all zeros or all f)"),
        )
    })
}

/// The BMC's device URL from its cell, with the identity pin of `uuid` (canonical).
fn bmc_url(cell: &str, uuid: &str) -> Result<String, (String, String)> {
    let err = |m: String| ("bmc".to_string(), m);
    let (url, key) = if cell.contains("://") {
        match DeviceScheme::of(cell) {
            Some(DeviceScheme::Ipmi) => (cell.to_string(), "guid"),
            Some(DeviceScheme::Redfish) => (cell.to_string(), "uuid"),
            _ => {
                return Err(err(format!(
                    "{:?}: a whole URL here is an ipmi:// or redfish+https:// BMC (other devices go in a template)",
                    redact_url(cell)
                )))
            }
        }
    } else {
        if cell.contains(['/', '?', '#', ' ']) {
            return Err(err(
                "write USER@HOST[:PORT] (an IPMI BMC) or a whole device URL".into(),
            ));
        }
        (format!("ipmi://{cell}"), "guid")
    };
    let query = url.split_once('?').map(|(_, q)| q).unwrap_or_default();
    let pinned = query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v);
    match pinned {
        Some(p) if same_machine(p, uuid) => Ok(url),
        Some(p) => Err(err(format!(
            "the URL pins {key}={p}, another machine than system_uuid {uuid}"
        ))),
        None => {
            let sep = if url.contains('?') { '&' } else { '?' };
            Ok(format!("{url}{sep}{key}={uuid}"))
        }
    }
}

/// Whether `s` is a DNS-1123 subdomain (a Node or Secret name).
fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// The candidate closest to `name` (at most two edits away), for "did you mean".
fn closest<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .map(|c| (edit_distance(name, c), c))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, c)| c)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The FenceTargets as a YAML stream (one document each) or a JSON `List`.
fn render(targets: &[FenceTarget], format: Format) -> Result<String, String> {
    match format {
        Format::Json => {
            let list = json!({"apiVersion": "v1", "kind": "List", "items": targets});
            let mut s = serde_json::to_string_pretty(&list).map_err(|e| e.to_string())?;
            s.push('\n');
            Ok(s)
        }
        Format::Yaml => targets.iter().try_fold(String::new(), |mut out, t| {
            out.push_str("---\n");
            out.push_str(&serde_saphyr::to_string(t).map_err(|e| e.to_string())?);
            Ok(out)
        }),
    }
}

/// The records of RFC 4180 CSV text, each with the line it starts on: fields separated by
/// commas; a field in double quotes may hold commas, line breaks and `""` for a quote. Values
/// are trimmed; blank lines and a leading byte-order mark are skipped.
fn parse_csv(text: &str) -> Result<Vec<(usize, Vec<String>)>, Problem> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut records = Vec::new();
    let mut fields: Vec<String> = Vec::new();
    let mut field = String::new();
    let mut line = 1;
    let mut start = 1;
    let mut quoted = false; // inside quotes
    let mut was_quoted = false; // this field was quoted (only blanks may follow the close)
    let mut chars = text.chars().peekable();
    let bad = |line: usize, m: &str| problem(&format!("line {line}"), None, m);
    let mut end_record = |fields: &mut Vec<String>, field: &mut String, start: usize| {
        fields.push(std::mem::take(field).trim().to_string());
        let record = std::mem::take(fields);
        if !(record.len() == 1 && record[0].is_empty()) {
            records.push((start, record));
        }
    };
    while let Some(c) = chars.next() {
        if quoted {
            match c {
                '"' if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                '"' => quoted = false,
                '\n' => {
                    line += 1;
                    field.push(c);
                }
                _ => field.push(c),
            }
            continue;
        }
        match c {
            ',' => {
                fields.push(std::mem::take(&mut field).trim().to_string());
                was_quoted = false;
            }
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' => {
                end_record(&mut fields, &mut field, start);
                was_quoted = false;
                line += 1;
                start = line;
            }
            '"' if !was_quoted && field.trim().is_empty() => {
                field.clear();
                quoted = true;
                was_quoted = true;
            }
            '"' => return Err(bad(line, "a quote inside an unquoted field (quote the whole field, and write \"\" for a quote)")),
            c if was_quoted && !c.is_whitespace() => {
                return Err(bad(line, "text after a closing quote"))
            }
            _ => field.push(c),
        }
    }
    if quoted {
        return Err(bad(start, "a quote that is never closed"));
    }
    end_record(&mut fields, &mut field, start);
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    const M1: &str = "4c4c4544-0037-3010-8052-b4c04f4d3231";
    const M2: &str = "4C4C4544003730108052B4C04F4D3232";
    const M3: &str = "4c4c4544-0037-3010-8052-b4c04f4d3233";
    const M4: &str = "4c4c4544-0037-3010-8052-b4c04f4d3234";

    /// A distinct machine UUID for row `i`.
    fn uuid(i: usize) -> String {
        format!("4c4c4544-0037-3010-8052-b4c04f4d{i:04}")
    }

    fn opts(template: Option<&str>) -> Options<'_> {
        Options {
            template,
            secret_namespace: "palisade-system",
            format: Format::Yaml,
        }
    }

    fn targets(yaml: &str) -> Vec<FenceTarget> {
        serde_saphyr::from_multiple(yaml).unwrap()
    }

    fn errors(inventory: &str, template: Option<&str>) -> Vec<String> {
        generate(inventory, &opts(template))
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    fn has(errors: &[String], needles: &[&str]) {
        assert!(
            errors.iter().any(|e| needles.iter().all(|n| e.contains(n))),
            "no problem with {needles:?} in {errors:#?}"
        );
    }

    #[test]
    fn the_default_template_gives_a_pinned_bmc_level_and_a_pdu_level_where_there_is_a_pdu() {
        let inv = format!(
            "node,bmc,system_uuid,pdu,secret\n\
             m1,admin@10.0.20.11,{M1},pdu-a.mgmt/7,\n\
             m2,admin@10.0.20.12:6230,{M2},,bmc-m2\n"
        );
        let out = generate(&inv, &opts(None)).unwrap();
        let t = targets(&out);
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].metadata.name.as_deref(), Some("m1"));
        assert_eq!(t[0].spec.levels.len(), 2);
        let bmc = &t[0].spec.levels[0].devices[0];
        assert_eq!(bmc.url, format!("ipmi://admin@10.0.20.11?guid={M1}"));
        let secret = bmc.credentials_secret_ref.as_ref().unwrap();
        assert_eq!(
            (secret.name.as_str(), secret.namespace.as_str()),
            ("fence-m1", "palisade-system")
        );
        let pdu = &t[0].spec.levels[1].devices[0];
        assert_eq!(pdu.url, "snmp+pdu://pdu-a.mgmt/outlet/7");
        assert_eq!(
            pdu.credentials_secret_ref.as_ref().unwrap().name,
            "fence-m1"
        );
        // No PDU: one level; the UUID is written in canonical form.
        assert_eq!(t[1].spec.levels.len(), 1);
        assert_eq!(
            t[1].spec.levels[0].devices[0].url,
            "ipmi://admin@10.0.20.12:6230?guid=4c4c4544-0037-3010-8052-b4c04f4d3232"
        );
        assert_eq!(
            t[1].spec.levels[0].devices[0]
                .credentials_secret_ref
                .as_ref()
                .unwrap()
                .name,
            "bmc-m2"
        );
        assert!(out.contains("apiVersion: palisade.dev/v1alpha1"), "{out}");
        assert!(out.contains("kind: FenceTarget"), "{out}");
        assert!(!out.contains("status"), "{out}");
    }

    #[test]
    fn every_generated_bmc_url_carries_the_identity_pin_of_its_row() {
        let inv = format!(
            "node,bmc,system_uuid\n\
             m1,admin@bmc1,{M1}\n\
             m2,redfish+https://fence@bmc2/redfish/v1/Systems/1?ca=secret,{M2}\n\
             m3,ipmi://admin@bmc3?cipher=17,{M3}\n\
             m4,ipmi://admin@bmc4?guid={M4},{M4}\n"
        );
        let machine = BTreeMap::from([("m1", M1), ("m2", M2), ("m3", M3), ("m4", M4)]);
        let generated = targets(&generate(&inv, &opts(None)).unwrap());
        assert_eq!(generated.len(), 4);
        for t in generated {
            let node = t.metadata.name.as_deref().unwrap();
            for d in t.spec.levels.iter().flat_map(|l| &l.devices) {
                let pin = match palisade_fence::Target::parse(&d.url).unwrap() {
                    palisade_fence::Target::Ipmi(i) => i.system_guid,
                    palisade_fence::Target::Redfish(r) => r.system_uuid,
                    other => panic!("{other:?}"),
                };
                let pin = pin.unwrap_or_else(|| panic!("{node}: {} has no pin", d.url));
                assert!(same_machine(&pin, machine[node]), "{node}: {}", d.url);
            }
        }
        let out = generate(&inv, &opts(None)).unwrap();
        assert!(
            out.contains(&format!("ipmi://admin@bmc3?cipher=17&guid={M3}")),
            "{out}"
        );
        assert!(
            out.contains("Systems/1?ca=secret&uuid=4c4c4544-0037-3010-8052-b4c04f4d3232"),
            "{out}"
        );
        // A pin written in the URL is kept, not repeated.
        assert!(
            out.contains(&format!("ipmi://admin@bmc4?guid={M4}\n")),
            "{out}"
        );
    }

    #[test]
    fn a_template_with_other_columns_and_a_storage_level_is_filled_in() {
        let template = r#"
levels:
  - name: bmc
    devices:
      - url: "{bmc}"
        kind: Power
        credentialsSecretRef: {name: "bmc-{node}", namespace: palisade-system}
  - name: storage
    powerOff: Allowed
    devices:
      - url: "storagefw+https://{array}:8443/?profile=lab"
        kind: Storage
        timeoutSeconds: 30
        credentialsSecretRef: {name: array, namespace: palisade-system, keys: {caBundle: ca.crt}}
        fences: {storageClasses: ["{class}"]}
"#;
        let inv = format!(
            "node,bmc,system_uuid,array,class\n\
             m1,admin@bmc1,{M1},\"array.mgmt\",\"gold\"\n"
        );
        let out = generate(&inv, &opts(Some(template))).unwrap();
        let t = &targets(&out)[0];
        let storage = &t.spec.levels[1].devices[0];
        assert_eq!(
            storage.url,
            "storagefw+https://array.mgmt:8443/?profile=lab"
        );
        assert_eq!(
            storage.fences.as_ref().unwrap().storage_classes,
            vec!["gold"]
        );
        assert_eq!(storage.timeout_seconds, 30);
        assert_eq!(
            t.spec.levels[0].devices[0]
                .credentials_secret_ref
                .as_ref()
                .unwrap()
                .name,
            "bmc-m1"
        );
        // JSON: one List.
        let json = generate(
            &inv,
            &Options {
                format: Format::Json,
                ..opts(Some(template))
            },
        )
        .unwrap();
        let list: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(list["kind"], "List");
        assert_eq!(list["items"][0]["kind"], "FenceTarget");
        assert_eq!(list["items"][0]["metadata"]["name"], "m1");
    }

    #[test]
    fn bad_rows_are_named_by_line_and_column() {
        let e = errors(
            &format!(
                "node,bmc,system_uuid,pdu\n\
                 m1,admin@bmc1,not-a-uuid,\n\
                 m2,,{u2},\n\
                 m3,admin@bmc3,{u3},pdu-a\n\
                 m1,admin@bmc4,{u4},\n\
                 m5,admin@bmc5,00000000-0000-0000-0000-000000000000,\n\
                 M6,admin@bmc6,{u6},\n\
                 m7,admin@bmc7,{u3},\n",
                u2 = uuid(2),
                u3 = uuid(3),
                u4 = uuid(4),
                u6 = uuid(6),
            ),
            None,
        );
        has(
            &e,
            &[
                "line 2 (node m1)",
                "column system_uuid",
                "not-a-uuid",
                "not a machine's UUID",
            ],
        );
        has(&e, &["line 3 (node m2)", "column bmc", "missing value"]);
        has(
            &e,
            &["line 4 (node m3)", "column pdu", "HOST[:PORT]/OUTLET"],
        );
        has(
            &e,
            &[
                "line 5 (node m1)",
                "column node",
                "listed twice (first on line 2)",
            ],
        );
        has(&e, &["line 6 (node m5)", "column system_uuid"]);
        has(&e, &["line 7 (node M6)", "column node", "not a Node name"]);
        has(
            &e,
            &[
                "line 8 (node m7)",
                "column system_uuid",
                "also node m3's (line 4)",
                "cannot be one machine",
            ],
        );
        assert_eq!(e.len(), 7, "{e:#?}");
    }

    #[test]
    fn urls_that_do_not_parse_or_have_unknown_keys_are_refused_by_the_agents_parsers() {
        let e = errors(
            &format!(
                "node,bmc,system_uuid\n\
                 m1,ipmi://admin@bmc1?giud=x,{u1}\n\
                 m2,10.0.20.12,{u2}\n\
                 m3,ipmi://admin@[::1,{u3}\n\
                 m4,bridge://fw:9443/m4,{u4}\n\
                 m5,ipmi://admin@bmc5?guid={M2},{u5}\n\
                 m6,admin@bmc/x,{u6}\n",
                u1 = uuid(1),
                u2 = uuid(2),
                u3 = uuid(3),
                u4 = uuid(4),
                u5 = uuid(5),
                u6 = uuid(6),
            ),
            None,
        );
        has(
            &e,
            &[
                "line 2 (node m1)",
                "column bmc",
                "giud",
                "did you mean guid?",
            ],
        );
        has(&e, &["line 3 (node m2)", "column bmc", "missing user"]);
        has(
            &e,
            &["line 4 (node m3)", "column bmc", "levels[0].devices[0].url"],
        );
        has(
            &e,
            &[
                "line 5 (node m4)",
                "column bmc",
                "ipmi:// or redfish+https://",
            ],
        );
        has(&e, &["line 6 (node m5)", "column bmc", "another machine"]);
        has(&e, &["line 7 (node m6)", "column bmc", "USER@HOST[:PORT]"]);
    }

    #[test]
    fn unknown_and_missing_columns_are_refused_before_any_row() {
        // A misspelt system_uuid would otherwise drop the pin.
        let e = errors("node,bmc,sytem_uuid\nm1,admin@bmc1,x\n", None);
        has(
            &e,
            &["header", "column sytem_uuid", "did you mean system_uuid?"],
        );
        has(&e, &["header", "column system_uuid", "missing"]);
        // Credentials never go in the inventory, and their values are never shown.
        let e = errors(
            &format!("node,bmc,system_uuid,password\nm1,admin@bmc1,{M1},hunter2\n"),
            None,
        );
        has(
            &e,
            &["column password", "credentials never go in the inventory"],
        );
        assert!(e.iter().all(|e| !e.contains("hunter2")), "{e:?}");
        let e = errors(
            &format!("node,node,bmc,system_uuid\nm1,m1,a@b,{M1}\n"),
            None,
        );
        has(&e, &["header", "column node", "given twice"]);
        let e = errors("", None);
        has(&e, &["header row", "required"]);
    }

    #[test]
    fn a_template_naming_a_column_the_inventory_lacks_or_a_field_the_crd_lacks_is_refused() {
        let template = r#"
levels:
  - devices:
      - url: "{bmc}"
        kind: Power
        credentialSecretRef: {name: "{secert}", namespace: palisade-system}
"#;
        let e = errors(
            &format!("node,bmc,system_uuid\nm1,a@b,{M1}\n"),
            Some(template),
        );
        has(
            &e,
            &[
                "template",
                "spec.levels[0].devices[0].credentialSecretRef",
                "not a field",
            ],
        );
        let template = template.replace("credentialSecretRef", "credentialsSecretRef");
        let e = errors(
            &format!("node,bmc,system_uuid\nm1,a@b,{M1}\n"),
            Some(&template),
        );
        has(
            &e,
            &[
                "header",
                "column secert",
                "missing",
                "the template refers to it",
            ],
        );
        // The default template's optional columns are not used by this one.
        let e = errors(
            &format!("node,bmc,system_uuid,secert,pdu\nm1,a@b,{M1},s,p/1\n"),
            Some(&template),
        );
        has(
            &e,
            &["header", "column pdu", "not a column the template uses"],
        );
        assert_eq!(e.len(), 1, "{e:#?}");
    }

    #[test]
    fn model_validation_applies_and_a_direct_bmc_without_a_pin_is_refused() {
        let template = r#"
levels:
  - name: l
    devices:
      - url: "ipmi://admin@{host}"
        kind: Power
        credentialsSecretRef: {name: "{secret}", namespace: palisade-system}
      - url: "storagefw+https://{host}:8443/?profile=lab&x=1"
        kind: Storage
        credentialsSecretRef: {name: a, namespace: palisade-system}
        fences: {csiDrivers: [csi.example]}
"#;
        let e = errors("node,host\nm1,bmc1\n", Some(template));
        has(
            &e,
            &[
                "line 2 (node m1)",
                "column host",
                "levels[0].devices[0]",
                "identity pin",
            ],
        );
        has(
            &e,
            &[
                "line 2 (node m1)",
                "column host",
                "levels[0].devices[1]",
                "unknown query parameter \"x\"",
            ],
        );
        // validate(): a Storage device with a Power kind, and credentials in a URL (redacted).
        let template = r#"
levels:
  - devices:
      - url: "snmp+pdu://{pdu_host}/outlet/{pdu_outlet}"
        kind: Storage
        credentialsSecretRef: {name: "{secret}", namespace: palisade-system}
"#;
        let e = errors("node,pdu\nm1,public@pdu-a/3\n", Some(template));
        has(
            &e,
            &[
                "line 2 (node m1)",
                "column pdu",
                "carries credentials",
                "REDACTED",
            ],
        );
        assert!(e.iter().all(|e| !e.contains("public")), "{e:?}");
        let e = errors("node,pdu\nm1,pdu-a/3\n", Some(template));
        has(
            &e,
            &[
                "line 2 (node m1)",
                "column pdu",
                "contradicts the URL scheme",
            ],
        );
    }

    #[test]
    fn a_bad_row_means_no_output_at_all() {
        // Nine good rows and one bad: nothing is rendered.
        let mut inv = String::from("node,bmc,system_uuid\n");
        for i in 0..9 {
            inv.push_str(&format!("m{i},admin@bmc{i},{}\n", uuid(i)));
        }
        assert_eq!(targets(&generate(&inv, &opts(None)).unwrap()).len(), 9);
        inv.push_str("m9,admin@bmc9,nope\n");
        let e = generate(&inv, &opts(None)).unwrap_err();
        assert_eq!(e.len(), 1, "{e:?}");
    }

    #[test]
    fn csv_quoting_follows_rfc_4180() {
        let text = "\u{feff}a,b,c\r\n\"x, y\",\"say \"\"hi\"\"\", z \r\n\n\"multi\nline\",,\"\"\n";
        let records = parse_csv(text).unwrap();
        assert_eq!(
            records,
            vec![
                (1, vec!["a".into(), "b".into(), "c".into()]),
                (2, vec!["x, y".into(), "say \"hi\"".into(), "z".into()]),
                (4, vec!["multi\nline".into(), "".into(), "".into()]),
            ]
        );
        assert!(parse_csv("a,b\"c\n")
            .unwrap_err()
            .message
            .contains("quote inside"));
        assert!(parse_csv("a,\"b\"c\n")
            .unwrap_err()
            .message
            .contains("after a closing quote"));
        let e = parse_csv("a\n\"open\n\n").unwrap_err();
        assert_eq!(e.at, "line 2");
        assert!(e.message.contains("never closed"));
        // A field count that differs from the header's is a row problem.
        let e = errors(
            &format!("node,bmc,system_uuid\nm1,a@b\nm2,a@b,{M1},x\n"),
            None,
        );
        has(&e, &["line 2", "2 fields, but the header has 3"]);
        has(&e, &["line 3", "4 fields"]);
    }
}
