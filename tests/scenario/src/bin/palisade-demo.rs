//! `palisade-demo`: the whole story on the lab, with a printed timeline.
//!
//! A StatefulSet's writer runs on machine m0 with a ReadWriteOnce CSI volume on the lab storage
//! server. m0 is cut off the network. Palisade detects the silence, fences m0 through the
//! firmware-bridge (IPMI power off, or the PDU outlet if IPMI fails, and a storage block, all
//! verified), releases the pod and the volume, and the StatefulSet's replacement writes from
//! another machine. The at-most-one checker then reads the volume and the writers'
//! acknowledgements and gives its verdict, and the bridge's audit log shows who did what.
//!
//! The machines are QEMU virtual machines whose BMCs are `ipmi_sim` (the power off really stops
//! the VM); `--netns` runs the same story on namespace machines. `--in-cluster` runs the
//! controller in the cluster, installed from `controller/manifests` with `kubectl apply -k`
//! and its image pulled from the lab's registry by `palisade-node`.

use anyhow::{bail, Context, Result};
use palisade_lab::MachineKind;
use palisade_scenario::headline::{self, Options, Timeline};
use palisade_scenario::*;

fn main() -> Result<()> {
    let mut kind = MachineKind::Qemu;
    let mut opts = Options::default();
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--netns" => kind = MachineKind::Namespace,
            "--in-cluster" => opts.in_cluster = true,
            other => {
                bail!("unknown argument {other:?}; usage: palisade-demo [--netns] [--in-cluster]")
            }
        }
    }
    let t = Timeline::new(false);
    let kube = palisade_lab::KubeVersion::from_env()?;
    t.say(format!(
        "starting the lab: Kubernetes {kube} control plane, 3 machines running palisade-node (each {}), a PDU{}",
        kind_phrase(kind),
        if opts.in_cluster { ", an OCI registry" } else { "" }
    ));
    let agents = AgentOptions {
        kube: Some(kube),
        ..AgentOptions::default()
    };
    let lab = if opts.in_cluster {
        palisade_lab::Lab::start(in_cluster::lab_config(kind, 3, true, &agents)?)
            .context("starting the lab")?
    } else {
        lab_of_kind(kind, 3, true, &agents).context("starting the lab")?
    };
    let c = Cluster::connect(&lab)?;
    c.wait_nodes_ready(&lab)?;
    t.say(format!(
        "lab {} up; nodes m0, m1, m2 Ready; m0 is {} (lab dir {})",
        lab.id(),
        kind_phrase(kind),
        lab.dir().display()
    ));
    let result = headline::run(&lab, &c, &t, opts);
    if let Err(e) = &result {
        println!("\nthe demo failed: {e:#}\nlogs: {}", lab.dir().display());
        println!("(set PALISADE_KEEP_LAB=1 to keep the lab directory)");
    }
    drop(c);
    drop(lab);
    t.say("lab torn down");
    result.map(|_| ())
}
