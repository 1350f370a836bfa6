//! Messages for unknown option names and URL query keys.
//!
//! A misspelt key must never be dropped: `?giud=` would silently remove an identity pin and
//! `--power-timout 60` would silently keep the default. Both the CLI ([`crate::cli`]) and the
//! URL parser ([`crate::target`]) refuse what they do not know, with a message that names the
//! key, suggests the closest valid one and lists them all.

/// "unknown {what} "{key}" (did you mean {closest}?); valid: a, b, c".
pub(crate) fn unknown(what: &str, key: &str, valid: &[&str]) -> String {
    unknown_as(what, key, key, valid)
}

/// Like [`unknown`], but names the key as the user `wrote` it (`--power-timout`) and looks
/// for the closest valid name to its normalised form `key` (`power_timout`).
pub(crate) fn unknown_as(what: &str, wrote: &str, key: &str, valid: &[&str]) -> String {
    let mut sorted: Vec<&str> = valid.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let hint = closest(key, &sorted)
        .map(|c| format!(" (did you mean {c}?)"))
        .unwrap_or_default();
    if sorted.is_empty() {
        return format!("unknown {what} {wrote:?}: none are accepted here");
    }
    format!(
        "unknown {what} {wrote:?}{hint}; valid: {}",
        sorted.join(", ")
    )
}

/// The valid name closest to `key` when it is a plausible misspelling (edit distance at most
/// 2, and less than half the name).
fn closest<'a>(key: &str, valid: &[&'a str]) -> Option<&'a str> {
    let key = key.to_ascii_lowercase();
    valid
        .iter()
        .map(|v| (edit_distance(&key, &v.to_ascii_lowercase()), *v))
        .filter(|(d, v)| *d <= 2 && *d * 2 < v.len().max(2))
        .min_by_key(|(d, _)| *d)
        .map(|(_, v)| v)
}

/// Optimal string alignment distance (Levenshtein plus adjacent transpositions, so that
/// `giud` is one edit from `guid`).
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misspelt_key_is_named_with_the_closest_valid_one_and_the_list() {
        let m = unknown("query key", "giud", &["guid", "cipher"]);
        assert_eq!(
            m,
            "unknown query key \"giud\" (did you mean guid?); valid: cipher, guid"
        );
        let m = unknown("option", "power_timout", &["power_timeout", "plug"]);
        assert!(m.contains("did you mean power_timeout?"), "{m}");
    }

    #[test]
    fn an_unrelated_key_gets_the_list_without_a_guess() {
        let m = unknown("query key", "colour", &["guid", "cipher"]);
        assert_eq!(m, "unknown query key \"colour\"; valid: cipher, guid");
        assert_eq!(
            unknown("query key", "x", &[]),
            "unknown query key \"x\": none are accepted here"
        );
    }

    #[test]
    fn edit_distance_counts_transpositions_as_one() {
        assert_eq!(edit_distance("giud", "guid"), 1);
        assert_eq!(edit_distance("power_timout", "power_timeout"), 1);
        assert_eq!(edit_distance("abc", "abc"), 0);
        assert_eq!(edit_distance("", "abc"), 3);
    }
}
