//! The lab's one error type.

use std::path::PathBuf;

/// Everything that can go wrong while bringing a lab up, driving it or tearing it down.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// A host tool the lab needs is not installed.
    #[error("{tool} is not installed (run hack/install-deps.sh): {hint}")]
    MissingTool {
        /// The program that was looked for.
        tool: String,
        /// Where it was expected or how to get it.
        hint: String,
    },
    /// A command the lab ran to set something up exited with an error.
    #[error("`{command}` failed: {stderr}")]
    Command {
        /// The command line (never holds secrets: they go through files).
        command: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// A component did not become healthy in time.
    #[error("{component} did not become ready within {seconds}s: {detail} (log: {log})")]
    NotReady {
        /// Which component.
        component: String,
        /// How long the lab waited.
        seconds: u64,
        /// The last thing the readiness probe saw.
        detail: String,
        /// The component's log file.
        log: String,
    },
    /// A component exited while the lab was starting it.
    #[error("{component} exited during start-up ({status}); last log lines:\n{tail}")]
    Exited {
        /// Which component.
        component: String,
        /// Its exit status.
        status: String,
        /// The end of its log.
        tail: String,
    },
    /// A file under the lab directory could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Generating the lab's certificates failed.
    #[error("certificate generation failed: {0}")]
    Pki(#[from] rcgen::Error),
    /// A QEMU machine's guest could not be built, started or booted.
    #[error("machine {machine}: {reason} (console: {})", console_log.display())]
    Guest {
        /// The machine.
        machine: String,
        /// Its serial console log.
        console_log: PathBuf,
        /// What went wrong, with what the lab last saw.
        reason: String,
    },
    /// A machine index or name that the lab does not have.
    #[error("no machine {0} in this lab")]
    NoSuchMachine(String),
    /// The caller asked for something the lab was not started with.
    #[error("this lab has no {0}")]
    NotConfigured(&'static str),
    /// Anything else, with a message that says what.
    #[error("{0}")]
    Other(String),
}

impl LabError {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> LabError {
        let path = path.into();
        move |source| LabError::Io { path, source }
    }
}

/// Result alias for the lab.
pub type Result<T, E = LabError> = std::result::Result<T, E>;
