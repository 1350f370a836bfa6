//! The resource reference (`docs/reference/resources.md`), generated from the CRDs' own
//! schemas: every field of every Palisade resource with its type, default, bounds and the
//! documentation comment it was generated from, so the book cannot drift from the code
//! (`controller/model/tests/reference.rs` checks the checked-in page is current).

use std::fmt::Write as _;

use serde_json::Value;

/// The command that regenerates the page.
pub const COMMAND: &str = "cargo run -p palisade-model --bin crdgen -- --reference";

/// The Markdown page: one section per resource, one table row per field (depth-first, in the
/// schema's order), `spec` before `status`.
pub fn resources_markdown() -> String {
    let mut out = format!(
        "# Reference: resources\n\n\
         Generated from the CRDs' schemas (`controller/model`) by `{COMMAND} > \
         docs/reference/resources.md`; do not edit. Every field, its type and default, and the \
         documentation it was generated from. All resources are cluster-scoped, in \
         `palisade.dev/v1alpha1`; the [concepts](../concepts.md) chapter explains them.\n"
    );
    for crd in crate::crds() {
        let version = &crd.spec.versions[0];
        let Some(schema) = version
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
        else {
            continue;
        };
        let schema = serde_json::to_value(schema).unwrap_or_default();
        let names = &crd.spec.names;
        let _ = write!(
            out,
            "\n## {} (`{}`{})\n\n",
            names.kind,
            names.plural,
            names
                .short_names
                .as_ref()
                .map(|s| format!(", short `{}`", s.join("`, `")))
                .unwrap_or_default()
        );
        if let Some(d) = schema
            .get("description")
            .and_then(Value::as_str)
            .filter(|d| !d.starts_with("Auto-generated"))
        {
            let _ = writeln!(out, "{}\n", one_line(d));
        }
        out.push_str(FIELDS_HEAD);
        for top in ["spec", "status"] {
            if let Some(s) = schema.pointer(&format!("/properties/{top}")) {
                field_rows(top, s, &mut out);
            }
        }
    }
    out
}

/// The head of a table of [`field_rows`].
pub const FIELDS_HEAD: &str = "| Field | Type | Default | Description |\n|---|---|---|---|\n";

/// Appends the table row of the field at `path` with `schema`, then those of every field
/// inside it (depth-first, in the schema's order; `path[].name` inside an array's items,
/// `path.*.name` inside a map's values). `schema` is in the CRDs' dialect: OpenAPI 3 with
/// every subschema inlined, as schemars' `SchemaSettings::openapi3()` with
/// `inline_subschemas` makes it. The firmware-bridge's config reference uses it too.
pub fn field_rows(path: &str, schema: &Value, out: &mut String) {
    let _ = writeln!(
        out,
        "| `{path}` | {} | {} | {} |",
        type_of(schema),
        schema
            .get("default")
            .map(|d| format!("`{d}`"))
            .unwrap_or_default(),
        cell(schema)
    );
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, s) in props {
            field_rows(&format!("{path}.{name}"), s, out);
        }
    }
    if let Some(items) = schema.get("items") {
        if items.get("properties").is_some() {
            if let Some(props) = items.get("properties").and_then(Value::as_object) {
                for (name, s) in props {
                    field_rows(&format!("{path}[].{name}"), s, out);
                }
            }
        }
    }
    if let Some(values) = schema
        .get("additionalProperties")
        .filter(|v| v.get("properties").is_some())
    {
        if let Some(props) = values.get("properties").and_then(Value::as_object) {
            for (name, s) in props {
                field_rows(&format!("{path}.*.{name}"), s, out);
            }
        }
    }
}

fn type_of(s: &Value) -> String {
    if let Some(e) = s.get("enum").and_then(Value::as_array) {
        let names: Vec<String> = e
            .iter()
            .map(|v| v.as_str().map_or(v.to_string(), str::to_string))
            .collect();
        return format!("one of `{}`", names.join("`, `"));
    }
    if s.get("x-kubernetes-int-or-string").and_then(Value::as_bool) == Some(true) {
        return "integer or string".into();
    }
    let base = s.get("type").and_then(Value::as_str).unwrap_or("object");
    match base {
        "array" => format!(
            "array of {}",
            s.get("items").map_or("any".into(), |i| {
                if i.get("properties").is_some() {
                    "object".to_string()
                } else {
                    type_of(i)
                }
            })
        ),
        "object" if s.get("additionalProperties").is_some() => "map".into(),
        other => other.to_string(),
    }
}

/// The description, with the schema's bounds and format, as one table cell.
fn cell(s: &Value) -> String {
    let mut parts = Vec::new();
    if let Some(d) = s.get("description").and_then(Value::as_str) {
        parts.push(one_line(d));
    }
    let mut bounds = Vec::new();
    for (key, say) in [
        ("minimum", "at least"),
        ("maximum", "at most"),
        ("minLength", "length at least"),
        ("maxLength", "length at most"),
        ("minItems", "items at least"),
        ("maxItems", "items at most"),
        ("pattern", "matches"),
        ("format", "format"),
    ] {
        if let Some(v) = s.get(key) {
            let v = match v {
                Value::String(t) => t.clone(),
                Value::Number(n) if n.as_f64().is_some_and(|f| f.fract() == 0.0) => {
                    format!("{}", n.as_f64().unwrap_or_default() as i64)
                }
                other => other.to_string(),
            };
            bounds.push(format!("{say} `{v}`"));
        }
    }
    if s.get("nullable").and_then(Value::as_bool) == Some(true) {
        bounds.push("may be null".into());
    }
    if !bounds.is_empty() {
        parts.push(format!("({})", bounds.join("; ")));
    }
    parts.join(" ")
}

/// Markdown-safe on one line: paragraphs joined, pipes escaped.
fn one_line(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_policy_field_is_listed_with_its_default() {
        let page = resources_markdown();
        for want in [
            "## FencingPolicy",
            "## FenceTarget",
            "## NodeFence",
            "| `spec.detection.powerOffAfterSeconds` | integer | `5` |",
            "| `spec.levels[].devices[].url` | string |",
        ] {
            assert!(page.contains(want), "missing {want:?}");
        }
        assert!(!page.contains("\n\n\n"));
    }
}
