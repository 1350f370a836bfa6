//! `palisade-lab`: bring a lab up by hand, and the helper programs the lab runs inside itself
//! (the PDU's SNMP handler and each machine's init).

use std::io::Write;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use palisade_lab::{Lab, LabConfig, MachineKind, QemuConfig};

mod demo;
mod init;

#[derive(Parser)]
#[command(
    name = "palisade-lab",
    about = "Palisade's lab: a datacenter on one machine"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start a lab, print how to reach it, and keep it up until Ctrl-C.
    Up {
        /// How many machines.
        #[arg(long, default_value_t = 3)]
        machines: usize,
        /// Skip the Kubernetes control plane.
        #[arg(long)]
        no_control_plane: bool,
        /// The command each machine runs when it boots.
        #[arg(long, default_value = "exec sleep infinity")]
        machine_command: String,
        /// QEMU virtual machines (powered by their ipmi_sim BMC) instead of namespace machines.
        #[arg(long)]
        qemu: bool,
    },
    /// Run the demo: bring the lab up, show it, fence a machine by BMC and by PDU, tear down.
    Demo {
        /// Namespace machines instead of QEMU virtual machines.
        #[arg(long)]
        netns: bool,
    },
    /// (internal) The PDU's Net-SNMP pass_persist handler.
    PduAgent {
        /// The PDU state file.
        #[arg(long)]
        state: std::path::PathBuf,
    },
    /// (internal) PID 1 of a lab machine: sets the hostname, runs the command, reaps orphans.
    MachineInit {
        /// The machine's hostname.
        #[arg(long)]
        hostname: String,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// (internal) Boot a QEMU machine: open its tap inside its network namespace, then exec
    /// QEMU (the command) with the tap's fd.
    QemuExec {
        /// The machine's network namespace.
        #[arg(long)]
        netns: String,
        /// The tap's name in that namespace.
        #[arg(long)]
        tap: String,
        /// QEMU and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Cmd::PduAgent { state } => Ok(palisade_lab::pdu_agent::serve(&state)?),
        Cmd::MachineInit { hostname, command } => init::run(&hostname, &command),
        Cmd::QemuExec {
            netns,
            tap,
            command,
        } => Ok(palisade_lab::qemu::exec_with_tap(&netns, &tap, &command)?),
        Cmd::Demo { netns } => {
            init_tracing();
            demo::run(if netns {
                MachineKind::Namespace
            } else {
                MachineKind::Qemu
            })
        }
        Cmd::Up {
            machines,
            no_control_plane,
            machine_command,
            qemu,
        } => {
            init_tracing();
            if machines == 0 && no_control_plane {
                bail!("nothing to start: give --machines or keep the control plane");
            }
            let lab = Lab::start(LabConfig {
                machines,
                control_plane: !no_control_plane,
                machine_command,
                machine_kind: if qemu {
                    MachineKind::Qemu
                } else {
                    MachineKind::Namespace
                },
                qemu: QemuConfig::default(),
                ..Default::default()
            })
            .context("starting the lab")?;
            demo::print_status(&lab);
            println!("\nlab is up; Ctrl-C tears it down");
            std::io::stdout().flush().ok();
            wait_for_ctrl_c()?;
            drop(lab);
            println!("lab torn down");
            Ok(())
        }
    }
}

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
}

fn wait_for_ctrl_c() -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r,
            _ = term.recv() => Ok(()),
        }
    })?;
    // Give the terminal's Ctrl-C a moment to reach the lab's own children first.
    std::thread::sleep(Duration::from_millis(100));
    Ok(())
}
