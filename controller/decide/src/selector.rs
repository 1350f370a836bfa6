//! Label selector matching (`matchLabels` and `matchExpressions`), as the API server does it.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Whether `selector` selects an object with `labels`. The empty selector selects everything.
/// An unknown operator selects nothing (fail closed: a malformed policy covers no node).
pub fn matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_ok = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let exprs_ok = selector.match_expressions.iter().flatten().all(|req| {
        let values = req.values.as_deref().unwrap_or_default();
        let value = labels.get(&req.key);
        match req.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    labels_ok && exprs_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelector {
        LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.into(),
                operator: op.into(),
                values: Some(values.iter().map(|v| v.to_string()).collect()),
            }]),
            match_labels: None,
        }
    }

    #[test]
    fn selector_table() {
        let node = labels(&[("role", "db"), ("zone", "a")]);
        let ml = |pairs: &[(&str, &str)]| LabelSelector {
            match_labels: Some(labels(pairs)),
            match_expressions: None,
        };
        let cases = [
            (LabelSelector::default(), true),
            (ml(&[("role", "db")]), true),
            (ml(&[("role", "web")]), false),
            (ml(&[("role", "db"), ("zone", "b")]), false),
            (expr("zone", "In", &["a", "b"]), true),
            (expr("zone", "In", &["c"]), false),
            (expr("zone", "NotIn", &["c"]), true),
            (expr("rack", "NotIn", &["c"]), true),
            (expr("zone", "NotIn", &["a"]), false),
            (expr("role", "Exists", &[]), true),
            (expr("rack", "Exists", &[]), false),
            (expr("rack", "DoesNotExist", &[]), true),
            (expr("role", "DoesNotExist", &[]), false),
            (expr("role", "Gt", &["1"]), false),
        ];
        for (i, (sel, want)) in cases.iter().enumerate() {
            assert_eq!(matches(sel, &node), *want, "case {i}: {sel:?}");
        }
    }
}
