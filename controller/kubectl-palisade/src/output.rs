//! `-o json|yaml`: the read commands' machine-readable output.
//!
//! Each read command builds one serializable report (camelCase field names, stable across
//! releases) and either prints it with `-o` or renders the same report as text without it, so
//! the two never disagree.

use serde::Serialize;

/// A machine-readable output format.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One JSON document.
    Json,
    /// One YAML document.
    Yaml,
}

/// The `-o/--output` flag of a read command.
#[derive(clap::Args, Debug, Clone, Copy, Default)]
pub struct OutputArg {
    /// Print the report as JSON or YAML instead of text.
    #[arg(short = 'o', long = "output", value_enum, value_name = "FORMAT")]
    pub format: Option<Format>,
}

/// The report as text in `format`, ending with a newline.
pub fn render<T: Serialize>(format: Format, report: &T) -> anyhow::Result<String> {
    Ok(match format {
        Format::Json => {
            let mut s = serde_json::to_string_pretty(report)?;
            s.push('\n');
            s
        }
        Format::Yaml => serde_saphyr::to_string(report)?,
    })
}

/// Prints the report in `format`, or `text()` without `-o`.
pub fn print<T: Serialize>(
    arg: OutputArg,
    report: &T,
    text: impl FnOnce(&T) -> String,
) -> anyhow::Result<()> {
    let out = match arg.format {
        Some(format) => render(format, report)?,
        None => text(report),
    };
    print!("{out}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Sample {
        node_name: String,
        heartbeat_age_seconds: Option<f64>,
    }

    #[test]
    fn json_and_yaml_carry_the_same_camel_case_fields() {
        let s = Sample {
            node_name: "m1".into(),
            heartbeat_age_seconds: None,
        };
        let json: serde_json::Value =
            serde_json::from_str(&render(Format::Json, &s).unwrap()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"nodeName": "m1", "heartbeatAgeSeconds": null})
        );
        let yaml: serde_json::Value =
            serde_saphyr::from_str(&render(Format::Yaml, &s).unwrap()).unwrap();
        assert_eq!(yaml, json);
    }
}
