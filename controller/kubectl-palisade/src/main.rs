//! `kubectl palisade`: what Palisade sees and does, for the person on call.
//!
//! - `status`: nodes with their heartbeat and health, fence readiness, NodeFences, held
//!   decisions and pods on silent nodes;
//! - `explain NODE`: why Palisade did or did not fence a node, guard by guard;
//! - `fence NODE --reason ...` (and `--wait`), `cancel NODEFENCE`;
//! - `confirm-clean NODEFENCE --note ...`: a person's confirmation, bound to that fence's UID,
//!   that none of the pods it released runs on the machine any more;
//! - `timeline NODEFENCE [--svg FILE] [--png FILE]`: a fence's story, to the millisecond;
//! - `delete-pod NAMESPACE/POD` (or `delete pod POD -n NAMESPACE --force`): the safe force deletion: only when the pod's node is fenced
//!   (verified, and the fence covers the pod), or with `--confirm` after a warning that says what
//!   may run twice; who forced it is recorded;
//! - `check`: a preflight of the whole configuration.
//!
//! Exit codes: 0 done; 1 an error (unknown object, no permission, API unreachable); 2 bad usage;
//! 3 refused (an unsafe action without `--confirm`, a cancel too late); 4 `check` found problems.

mod check;
mod explain;
mod fence;
mod force;
mod status;
mod timeline;
mod world;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit code of a refused action.
pub const REFUSED: u8 = 3;
/// Exit code of a `check` that found problems.
pub const PROBLEMS: u8 = 4;

#[derive(Parser, Debug)]
#[command(
    name = "kubectl-palisade",
    version,
    about = "Palisade: status, explain, fence, timeline, safe force deletion"
)]
struct Cli {
    /// Kubeconfig to use (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, global = true, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Namespace of the controller (its leader Lease and credential Secrets).
    #[arg(long, global = true, default_value = "palisade-system")]
    controller_namespace: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Nodes, fences, held decisions and pods on silent nodes.
    Status,
    /// Why Palisade did or did not fence NODE.
    Explain {
        /// The node.
        node: String,
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
        /// Follow the fence until it ends (at most --timeout).
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
    },
    /// Force-delete a pod only when its node is fenced (or with --confirm).
    DeletePod {
        /// NAMESPACE/NAME of the pod.
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
    Check,
}

/// What `delete` deletes.
#[derive(Subcommand, Debug)]
enum Delete {
    /// Force-delete a pod only when its node is fenced (or with --confirm).
    Pod {
        /// The pod.
        pod: String,
        /// Its namespace.
        #[arg(short, long, default_value = "default")]
        namespace: String,
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
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = palisade_controller::client(cli.kubeconfig.as_deref()).await?;
    let ns = cli.controller_namespace.as_str();
    match cli.command {
        Command::Status => status::run(&client, ns).await,
        Command::Explain { node } => explain::run(&client, ns, &node).await,
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
        } => timeline::run(&client, &nodefence, svg.as_deref(), png.as_deref()).await,
        Command::DeletePod { pod, confirm } => force::run(&client, &pod, confirm).await,
        Command::Delete {
            what:
                Delete::Pod {
                    pod,
                    namespace,
                    force: _,
                    confirm,
                },
        } => force::run(&client, &format!("{namespace}/{pod}"), confirm).await,
        Command::Check => check::run(&client, ns).await,
    }
}
