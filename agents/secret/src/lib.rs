//! [`Secret`]: Palisade's one type for a credential (a BMC password, an SNMP community or key,
//! a storage API token), used by the fence agents, the storage firewall agent, the
//! firmware-bridge and the controller alike.
//!
//! Guarantees:
//! - `Debug` prints `Secret(<redacted>)` and `Display` prints `<redacted>`; the value is read
//!   only through [`Secret::expose`], so every use can be found with one search;
//! - the value is overwritten with zeros when the last copy is dropped ([`zeroize`]);
//! - one rule for stored values, wherever they come from (a file, a Kubernetes Secret, a
//!   literal): exactly one trailing line ending (`\n` or `\r\n`) is dropped, so a value written
//!   by `echo` and one written by `printf` are the same credential; nothing else is trimmed
//!   (leading or trailing spaces are part of a password).

use std::fmt;

use zeroize::Zeroizing;

/// A credential that never prints itself and is zeroed on drop.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Zeroizing<String>);

impl Secret {
    /// Wraps a value, dropping one trailing line ending.
    pub fn new(value: impl Into<String>) -> Self {
        let mut s = value.into();
        if s.ends_with('\n') {
            s.pop();
            if s.ends_with('\r') {
                s.pop();
            }
        }
        Secret(Zeroizing::new(s))
    }

    /// Reads a value from a file (a `0600` credential file, a mounted Secret), dropping one
    /// trailing line ending.
    pub fn from_file(path: &std::path::Path) -> std::io::Result<Self> {
        Ok(Secret::new(std::fs::read_to_string(path)?))
    }

    /// The value. Call only where it leaves the process (a protocol field, a header).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// True when the value is empty (a misconfiguration worth refusing).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_redact() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s:?} {s}"), "Secret(<redacted>) <redacted>");
        assert_eq!(s.expose(), "hunter2");
    }

    #[test]
    fn one_trailing_line_ending_is_dropped_and_nothing_else() {
        assert_eq!(Secret::new("abc\n").expose(), "abc");
        assert_eq!(Secret::new("abc\r\n").expose(), "abc");
        assert_eq!(Secret::new("abc\n\n").expose(), "abc\n");
        assert_eq!(Secret::new(" abc ").expose(), " abc ");
        assert_eq!(Secret::new("abc"), Secret::new("abc\n"));
        assert!(Secret::new("\n").is_empty());
    }

    #[test]
    fn a_file_follows_the_same_rule() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pw");
        std::fs::write(&p, "abc\n").unwrap();
        assert_eq!(Secret::from_file(&p).unwrap().expose(), "abc");
        std::fs::write(&p, "abc").unwrap();
        assert_eq!(Secret::from_file(&p).unwrap().expose(), "abc");
    }
}
