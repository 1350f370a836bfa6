//! The firmware-bridge's reference page (`docs/reference/firmware-bridge.md`), rendered from
//! the flags' clap definition, the metrics registry and the config file's schema, and checked
//! against the page on disk.

use clap::CommandFactory;
use palisade_test_support::reference::{self, Page};

/// The bridge's reference page, and the test that writes it.
const PAGE: Page = Page {
    path: "docs/reference/firmware-bridge.md",
    test: "cargo test -p palisade-bridge --bin firmware-bridge reference",
};

/// Every flag, every metric, the shipped alerts that name those metrics, and every key of the
/// config file.
fn reference_markdown() -> String {
    let metrics = reference::metrics(&palisade_bridge::metrics::Metrics::default().render());
    format!(
        "# Reference: the firmware-bridge\n\n\
         Generated from the code by `{}`; do not edit. The flags come from the command line's \
         definition (`firmware-bridge/src/main.rs`), the metrics from the registry \
         (`firmware-bridge/src/metrics.rs`), the alerts from `{}` (those whose expression names \
         one of these metrics), the configuration keys from the config file's types \
         (`firmware-bridge/src/config.rs`).\n\n\
         {}\n\
         ## Metrics\n\n\
         Served at `/metrics` on the config's `listen` address (mutual TLS: a client certificate \
         is required), as OpenMetrics text.\n\n\
         {}\n\
         ## Alerts\n\n\
         {}\n\
         ## Configuration file\n\n\
         The TOML file that `--config` names (`firmware-bridge --check` validates it): every \
         key, with its type and default.\n\n\
         {}",
        PAGE.regenerate(),
        reference::RULES,
        reference::flags_tables(&super::Args::command()),
        reference::metrics_table(&metrics),
        reference::alerts_naming(&metrics, "the firmware-bridge"),
        config_markdown(),
    )
}

/// Every key of the config file (TOML), from [`FileConfig`]'s schema: path, type, default and
/// the documentation comment, in the resource reference's table.
///
/// [`FileConfig`]: palisade_bridge::config::FileConfig
fn config_markdown() -> String {
    let schema = schemars::generate::SchemaSettings::openapi3()
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .with_transform(schemars::transform::RecursiveTransform(as_toml))
        .into_generator()
        .into_root_schema_for::<palisade_bridge::config::FileConfig>();
    let schema = serde_json::to_value(schema).expect("a schema is JSON");
    let mut out = String::from(palisade_model::reference::FIELDS_HEAD);
    for (key, s) in schema["properties"].as_object().into_iter().flatten() {
        palisade_model::reference::field_rows(key, s, &mut out);
    }
    out
}

/// The schema of a TOML file rather than of a resource: TOML has no null, so an optional key
/// is shown with its default or none (not as nullable); a table that refuses unknown keys is
/// not a map; a key the file must have says so.
fn as_toml(schema: &mut schemars::Schema) {
    use serde_json::Value;
    schema.remove("nullable");
    if schema.get("default").is_some_and(Value::is_null) {
        schema.remove("default");
    }
    if schema.get("additionalProperties") == Some(&Value::Bool(false)) {
        schema.remove("additionalProperties");
    }
    let required: Vec<String> = schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|k| k.as_str().map(str::to_string))
        .collect();
    let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) else {
        return;
    };
    for key in required {
        if let Some(Value::Object(p)) = properties.get_mut(&key) {
            let doc = p.get("description").and_then(Value::as_str).unwrap_or("");
            let doc = format!("Required. {doc}");
            p.insert("description".into(), doc.trim_end().into());
        }
    }
}

#[test]
fn reference_page_is_current() {
    let page = reference_markdown();
    PAGE.check(&page);
    for want in [
        "`--config`",
        "`palisade_bridge_stale_token_rejections_total` | counter",
        "| `targets[].levels[].devices[].url` | string |",
    ] {
        assert!(page.contains(want), "{want}");
    }
}
