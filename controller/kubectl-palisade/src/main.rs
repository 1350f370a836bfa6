//! `kubectl palisade`: what Palisade sees and does, for the person on call.
//!
//! - `status`: nodes with their heartbeat and health, fence readiness, NodeFences, held
//!   decisions and pods on silent nodes;
//! - `explain NODE`: why Palisade did or did not fence a node, guard by guard;
//! - `fence NODE --reason ...` (and `--wait`), `cancel NODEFENCE`;
//! - `confirm-clean NODEFENCE --note ...`: a person's confirmation, bound to that fence's UID,
//!   that none of the pods it released runs on the machine any more;
//! - `timeline NODEFENCE [--svg FILE] [--png FILE]`: a fence's story, to the millisecond;
//! - `delete-pod NAMESPACE/POD` (or `delete pod POD -n NAMESPACE --force`): the safe force
//!   deletion: only when the pod's node is fenced (verified, and the fence covers the pod), or
//!   with `--confirm` after a warning that says what may run twice; who forced it (as the API
//!   server names them) is recorded;
//! - `check`: a preflight of the whole configuration;
//! - `targets generate --inventory FILE [--template FILE]`: one FenceTarget per row of a CSV
//!   inventory, validated as the controller validates it ([`targets`]; needs no cluster).
//!
//! Connection flags are kubectl's (`--kubeconfig`, `KUBECONFIG` as a list of files, `--context`,
//! `--cluster`, `--user`, `-n`: [`connect`]); the read commands (`status`, `explain`,
//! `timeline`, `check`) print `-o json|yaml` ([`output`]) of the same report as their text.
//!
//! Exit codes: see [`EXIT_CODES`].

mod check;
mod connect;
mod explain;
mod fence;
mod force;
mod identity;
mod output;
mod status;
mod targets;
mod timeline;
mod world;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::output::OutputArg;

/// Exit code of a refused action.
pub const REFUSED: u8 = 3;
/// Exit code of a `check` that found problems.
pub const PROBLEMS: u8 = 4;
/// Exit code of a `fence --wait` whose fence was still under way at `--timeout`.
pub const TIMED_OUT: u8 = 5;

/// The exit codes, as `--help` shows them.
pub const EXIT_CODES: &str = "\
Exit codes:
  0  done
  1  an error (unknown object, no permission, API server unreachable, a fence that failed)
  2  bad usage (unknown flag or output format)
  3  refused (an unsafe action without --confirm, a cancel too late, a forced deletion whose
     user the API server did not name)
  4  check found problems
  5  fence --wait timed out with the fence still under way";

#[derive(Parser, Debug)]
#[command(
    name = "kubectl-palisade",
    version,
    about = "Palisade: status, explain, fence, timeline, safe force deletion",
    after_help = EXIT_CODES
)]
struct Cli {
    #[command(flatten)]
    connection: connect::Connection,
    /// Namespace of a namespaced argument (the pod of `delete-pod`); default: the context's
    /// namespace, then `default`.
    #[arg(short = 'n', long, global = true, value_name = "NAMESPACE")]
    namespace: Option<String>,
    /// Namespace of the controller (its leader Lease and credential Secrets).
    #[arg(long, global = true, default_value = "palisade-system")]
    controller_namespace: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell); needs no
    /// cluster: `source <(kubectl-palisade completion bash)`.
    Completion {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Nodes, fences, held decisions and pods on silent nodes.
    Status {
        #[command(flatten)]
        output: OutputArg,
    },
    /// Why Palisade did or did not fence NODE.
    Explain {
        /// The node.
        node: String,
        #[command(flatten)]
        output: OutputArg,
    },
    /// Request a manual fence of NODE.
    Fence {
        /// The node.
        node: String,
        /// Why (shown in Events).
        #[arg(long)]
        reason: String,
        /// Skip the quorum guard.
        #[arg(long)]
        override_quorum_guard: bool,
        /// Skip pod forgiveness.
        #[arg(long)]
        override_forgiveness: bool,
        /// Fence even if Palisade sees the node healthy (hardware levels only; never earns
        /// self-fence trust).
        #[arg(long)]
        override_node_health: bool,
        /// Follow the fence until it ends (at most --timeout; exit 5 if it is still under way).
        #[arg(long)]
        wait: bool,
        /// How long --wait follows it, in seconds.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
    },
    /// Withdraw a NodeFence that has not started fencing yet.
    Cancel {
        /// The NodeFence.
        nodefence: String,
    },
    /// Confirm, after checking the machine, that none of the pods a NodeFence released runs
    /// there any more (binds the confirmation to that NodeFence's UID).
    ConfirmClean {
        /// The NodeFence.
        nodefence: String,
        /// Who checked what (for example "alice: host rebooted from its console").
        #[arg(long)]
        note: String,
    },
    /// A NodeFence's story: phases, device attempts, evidence, releases, recovery.
    Timeline {
        /// The NodeFence.
        nodefence: String,
        /// Also draw it as an SVG picture into FILE.
        #[arg(long)]
        svg: Option<PathBuf>,
        /// Also draw it as a PNG picture into FILE (rendered with `rsvg-convert`).
        #[arg(long)]
        png: Option<PathBuf>,
        #[command(flatten)]
        output: OutputArg,
    },
    /// Force-delete a pod only when its node is fenced (or with --confirm); records who did it
    /// (the user the API server names in a SelfSubjectReview; refused when it names nobody).
    DeletePod {
        /// NAMESPACE/NAME of the pod, or NAME with -n NAMESPACE.
        pod: String,
        /// Delete although the node is not fenced (after reading the warning).
        #[arg(long)]
        confirm: bool,
    },
    /// `delete pod POD -n NAMESPACE --force`: the same safe force deletion, spelled as kubectl
    /// spells a force deletion.
    Delete {
        #[command(subcommand)]
        what: Delete,
    },
    /// Preflight: policies, targets, the controller, trust settings.
    Check {
        #[command(flatten)]
        output: OutputArg,
    },
    /// FenceTargets for many nodes at once (needs no cluster).
    Targets {
        #[command(subcommand)]
        what: Targets,
    },
}

/// What `targets` does.
#[derive(Subcommand, Debug)]
enum Targets {
    /// Print one FenceTarget per row of a CSV inventory, each validated as the controller
    /// validates it; any bad row prints every problem on stderr and nothing on stdout.
    #[command(after_long_help = targets::FORMAT_HELP)]
    Generate(targets::GenerateArgs),
}

/// What `delete` deletes.
#[derive(Subcommand, Debug)]
enum Delete {
    /// Force-delete a pod only when its node is fenced (or with --confirm).
    Pod {
        /// The pod (in -n NAMESPACE; default: the context's namespace).
        pod: String,
        /// Required: this command only force-deletes (no grace period, no kubelet
        /// confirmation), and only what a verified fence covers unless --confirm.
        #[arg(long, required = true)]
        force: bool,
        /// Delete although the node is not fenced (after reading the warning).
        #[arg(long)]
        confirm: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<u8> {
    if let Command::Completion { shell } = cli.command {
        completion(shell, &mut std::io::stdout());
        return Ok(0);
    }
    if let Command::Targets {
        what: Targets::Generate(args),
    } = &cli.command
    {
        return targets::run(args, &cli.controller_namespace);
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = connect::client(&cli.connection).await?;
    let ns = cli.controller_namespace.as_str();
    let namespace = cli.namespace.as_deref();
    match cli.command {
        Command::Status { output } => status::run(&client, ns, output).await,
        Command::Explain { node, output } => explain::run(&client, ns, &node, output).await,
        Command::Fence {
            node,
            reason,
            override_quorum_guard,
            override_forgiveness,
            override_node_health,
            wait,
            timeout,
        } => {
            let overrides = palisade_model::nodefence::Overrides {
                quorum_guard: override_quorum_guard,
                forgiveness: override_forgiveness,
                node_health: override_node_health,
                ..Default::default()
            };
            fence::request(
                &client,
                &node,
                &reason,
                overrides,
                wait.then(|| std::time::Duration::from_secs(timeout)),
            )
            .await
        }
        Command::Cancel { nodefence } => fence::cancel(&client, &nodefence).await,
        Command::ConfirmClean { nodefence, note } => {
            fence::confirm_clean(&client, &nodefence, &note).await
        }
        Command::Timeline {
            nodefence,
            svg,
            png,
            output,
        } => timeline::run(&client, &nodefence, svg.as_deref(), png.as_deref(), output).await,
        Command::DeletePod { pod, confirm } => {
            let (pod_ns, name) = force::pod_ref(&pod, namespace, client.default_namespace())?;
            force::run(&client, pod_ns, name, confirm).await
        }
        Command::Delete {
            what:
                Delete::Pod {
                    pod,
                    force: _,
                    confirm,
                },
        } => {
            let (pod_ns, name) = force::pod_ref(&pod, namespace, client.default_namespace())?;
            force::run(&client, pod_ns, name, confirm).await
        }
        Command::Check { output } => check::run(&client, ns, output).await,
        Command::Completion { .. } | Command::Targets { .. } => {
            unreachable!("answered before connecting")
        }
    }
}

/// Writes the shell completion script for `shell` (as `kubectl-palisade`; kubectl 1.26+
/// completes plugins through a `kubectl_complete-palisade` executable on the PATH).
fn completion(shell: clap_complete::Shell, out: &mut dyn std::io::Write) {
    use clap::CommandFactory;
    clap_complete::generate(shell, &mut Cli::command(), "kubectl-palisade", out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_scripts_name_the_commands_and_need_no_cluster() {
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let mut out = Vec::new();
            completion(shell, &mut out);
            let script = String::from_utf8(out).unwrap();
            for word in ["kubectl-palisade", "timeline", "delete-pod", "context"] {
                assert!(script.contains(word), "{shell:?}: {word}");
            }
        }
        let cli = Cli::try_parse_from(["kubectl-palisade", "completion", "bash"]).unwrap();
        assert!(matches!(cli.command, Command::Completion { .. }));
        assert!(Cli::try_parse_from(["kubectl-palisade", "completion", "tcsh"]).is_err());
    }
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("kubectl-palisade").chain(args.iter().copied()))
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn connection_flags_are_global_like_kubectl() {
        let cli = parse(&[
            "status",
            "--context",
            "prod",
            "--cluster",
            "c",
            "--user",
            "u",
            "--kubeconfig",
            "/k",
            "-o",
            "json",
        ])
        .unwrap();
        assert_eq!(cli.connection.context.as_deref(), Some("prod"));
        assert_eq!(cli.connection.cluster.as_deref(), Some("c"));
        assert_eq!(cli.connection.user.as_deref(), Some("u"));
        assert_eq!(cli.connection.kubeconfig, Some(PathBuf::from("/k")));
        assert!(matches!(
            cli.command,
            Command::Status {
                output: OutputArg {
                    format: Some(output::Format::Json)
                }
            }
        ));
        let cli = parse(&["-n", "kp", "delete", "pod", "web-0", "--force"]).unwrap();
        assert_eq!(cli.namespace.as_deref(), Some("kp"));
        let cli = parse(&["delete", "pod", "web-0", "--force", "--namespace", "kp"]).unwrap();
        assert_eq!(cli.namespace.as_deref(), Some("kp"));
    }

    #[test]
    fn every_read_command_takes_an_output_format_and_rejects_unknown_ones() {
        for cmd in [
            &["status"][..],
            &["explain", "m1"],
            &["timeline", "f"],
            &["check"],
        ] {
            for format in ["json", "yaml"] {
                let args: Vec<&str> = cmd.iter().copied().chain(["-o", format]).collect();
                parse(&args).unwrap();
            }
            let args: Vec<&str> = cmd.iter().copied().chain(["-o", "xml"]).collect();
            let err = parse(&args).unwrap_err();
            assert_eq!(err.kind(), clap::error::ErrorKind::InvalidValue);
            assert!(
                err.to_string().contains("[possible values: json, yaml]"),
                "{err}"
            );
        }
        assert!(parse(&["fence", "m1", "--reason", "x", "-o", "json"]).is_err());
    }

    #[test]
    fn the_help_documents_every_exit_code() {
        let help = Cli::command().render_long_help().to_string();
        for code in [REFUSED, PROBLEMS, TIMED_OUT] {
            assert!(
                help.contains(&format!("\n  {code}  ")),
                "{code} in:\n{help}"
            );
        }
    }
}
