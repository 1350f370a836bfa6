//! Credential references and the [`Secret`] type that carries a loaded credential.
//!
//! Credentials live in separate files with strict permissions or in environment variables,
//! never in the inventory itself, never in argv, and never in logs: [`Secret`] has no
//! `Serialize` and its `Debug`/`Display` print `<redacted>`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::Deserialize;

/// Errors loading a credential.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The credentials file is readable (or writable) by group or others.
    #[error(
        "credentials file {path} has mode {mode:04o}: it must not be group- or world-accessible \
         (run `chmod 600 {path}`); refusing to start"
    )]
    LoosePermissions {
        /// The offending file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The credentials file could not be read.
    #[error("cannot read credentials file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The environment variable is not set (or not unicode).
    #[error("credentials environment variable {var} is not set")]
    MissingEnv {
        /// The variable name.
        var: String,
    },
    /// The credential is empty.
    #[error("credential from {origin} is empty")]
    Empty {
        /// Where it came from (a path or `env:VAR`).
        origin: String,
    },
}

/// Where a credential comes from, as written in the inventory.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretRef {
    /// Read the credential from this file (one trailing line ending dropped). The file must have no
    /// group or other permission bits.
    #[serde(default)]
    pub file: Option<PathBuf>,
    /// Read the credential from this environment variable.
    #[serde(default)]
    pub env: Option<String>,
}

impl SecretRef {
    /// A reference to a file.
    pub fn file(path: impl Into<PathBuf>) -> Self {
        Self {
            file: Some(path.into()),
            env: None,
        }
    }

    /// A reference to an environment variable.
    pub fn env(var: impl Into<String>) -> Self {
        Self {
            file: None,
            env: Some(var.into()),
        }
    }

    /// Loads the credential.
    ///
    /// # Guarantees
    /// A file is refused if its mode has any group or other bits (`mode & 0o077 != 0`): the
    /// error names the file and its mode. When both `file` and `env` are given, the file wins.
    pub fn load(&self) -> Result<Secret, SecretError> {
        if let Some(path) = &self.file {
            check_permissions(path)?;
            let raw = std::fs::read_to_string(path).map_err(|source| SecretError::Read {
                path: path.clone(),
                source,
            })?;
            let value = Secret::new(raw);
            if value.is_empty() {
                return Err(SecretError::Empty {
                    origin: path.display().to_string(),
                });
            }
            return Ok(value);
        }
        let var = self.env.clone().unwrap_or_default();
        let value = Secret::new(
            std::env::var(&var).map_err(|_| SecretError::MissingEnv { var: var.clone() })?,
        );
        if value.is_empty() {
            return Err(SecretError::Empty {
                origin: format!("env:{var}"),
            });
        }
        Ok(value)
    }
}

/// Refuses a credentials file that is group- or world-accessible.
pub fn check_permissions(path: &Path) -> Result<(), SecretError> {
    let meta = std::fs::metadata(path).map_err(|source| SecretError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(SecretError::LoosePermissions {
            path: path.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

/// A loaded credential: Palisade's one credential type (never printed, zeroed on drop, one
/// trailing line ending dropped from stored values). It has no `Serialize`.
pub use palisade_secret::Secret;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loose_file_is_refused_with_path_and_mode() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pw");
        std::fs::write(&p, "hunter2\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        let err = SecretRef::file(&p).load().unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(&p.display().to_string()), "{msg}");
        assert!(msg.contains("0640"), "{msg}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let s = SecretRef::file(&p).load().unwrap();
        assert_eq!(s.expose(), "hunter2");
        assert_eq!(format!("{s:?} {s}"), "Secret(<redacted>) <redacted>");
    }

    #[test]
    fn missing_env_is_named() {
        let err = SecretRef::env("PALISADE_TEST_SURELY_UNSET_VAR")
            .load()
            .unwrap_err();
        assert!(err.to_string().contains("PALISADE_TEST_SURELY_UNSET_VAR"));
    }
}
