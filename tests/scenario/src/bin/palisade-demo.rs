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
//! the VM); `--netns` runs the same story on namespace machines.

use anyhow::{bail, Context, Result};
use palisade_lab::MachineKind;
use palisade_scenario::headline::{self, Options, Timeline};
use palisade_scenario::*;

fn main() -> Result<()> {
    let kind = match std::env::args().nth(1).as_deref() {
        None => MachineKind::Qemu,
        Some("--netns") => MachineKind::Namespace,
        Some(other) => bail!("unknown argument {other:?}; usage: palisade-demo [--netns]"),
    };
    let t = Timeline::new(false);
    t.say(format!(
        "starting the lab: Kubernetes 1.20.2 control plane, 3 machines running palisade-node (each {}), a PDU",
        kind_phrase(kind)
    ));
    let lab = lab_of_kind(kind, 3, true, &AgentOptions::default()).context("starting the lab")?;
    let c = Cluster::connect(&lab)?;
    c.wait_nodes_ready(&lab)?;
    t.say(format!(
        "lab {} up; nodes m0, m1, m2 Ready; m0 is {} (lab dir {})",
        lab.id(),
        kind_phrase(kind),
        lab.dir().display()
    ));
    let opts = Options::default();
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
