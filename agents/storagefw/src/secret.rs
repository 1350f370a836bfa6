//! A credential that never prints itself.

use std::fmt;

/// A secret string (bearer token, password). `Debug` and `Display` print `<redacted>`; the only
/// way to read the value is [`Secret::expose`], which makes every use greppable.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value. Surrounding whitespace (a trailing newline in a file) is removed.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into().trim().to_owned())
    }

    /// Reads a secret from a file (for example a mounted Secret or a `0600` token file).
    pub fn from_file(path: &std::path::Path) -> std::io::Result<Self> {
        Ok(Secret::new(std::fs::read_to_string(path)?))
    }

    /// Returns the secret value. Call only where the value leaves the process (an HTTP header).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// True when the secret is empty (a misconfiguration worth refusing).
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
    fn secret_is_redacted_in_debug_and_display() {
        let s = Secret::new("hunter2\n");
        assert_eq!(s.expose(), "hunter2");
        assert!(!format!("{s:?}").contains("hunter2"));
        assert!(!format!("{s}").contains("hunter2"));
    }
}
