//! The headline, exactly as `hack/demo.sh` shows it, on QEMU machines (virtual machines whose
//! BMCs are `ipmi_sim`, running `palisade-node` in the guest): a StatefulSet writer with a ReadWriteOnce
//! CSI volume on m0, m0 cut off, fenced through the firmware-bridge (power and storage,
//! verified), released (pod, VolumeAttachment and the node's stale `volumesInUse`), the volume
//! attached to another machine by Kubernetes' own attach-detach controller, the replacement
//! writing, and the at-most-one checker passing.
//!
//! Without step 4 of the release (clearing `volumesInUse`) the 1.20 attach-detach controller
//! would hold the volume on m0 for 6 minutes; the demo's deadline for the new attachment is 3.

use std::process::Command;

#[test]
fn the_demo_recovers_an_rwo_statefulset_through_the_bridge_with_a_clean_verdict() {
    let demo = palisade_lab::bin_path("palisade-demo")
        .expect("build the demo first: cargo build -p palisade-scenario --bins");
    let out = Command::new(demo).output().expect("run palisade-demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}");
    assert!(out.status.success(), "the demo failed:\n{stdout}\n{stderr}");
    for expected in [
        "m0 is a QEMU VM whose BMC is ipmi_sim",
        "Running on m0 with PVC data-db-0",
        "fenced, verified: PowerOff by bridge://",
        "StorageBlocked by bridge://",
        "released: 1 pod(s), ",
        "1 volumesInUse record(s)",
        "by the attach-detach controller",
        "replacement is writing",
        "VERDICT: PASS",
        "palisade-controller power.off m0 token 1 -> ok",
        "palisade-controller storage.block m0 token 1 -> ok",
        "at-most-one holds",
    ] {
        assert!(
            stdout.contains(expected),
            "the demo's output lacks {expected:?}:\n{stdout}"
        );
    }
    // m0's VolumeAttachment went after the fence: deleted by Palisade, or, on a release with
    // the out-of-service taint (1.26+), by Kubernetes' attach-detach controller first, which
    // the demo names from the API server's audit log.
    assert!(
        stdout.contains("1 VolumeAttachment(s)")
            || stdout.contains(
                "was deleted by system:serviceaccount:kube-system:attachdetach-controller"
            )
            || stdout.contains("was deleted by system:kube-controller-manager"),
        "m0's VolumeAttachment: released by Palisade or by the attach-detach controller:\n{stdout}"
    );
}

/// `hack/demo.sh --netns --in-cluster`: the same story with the controller running in the
/// cluster, installed from `controller/manifests` (its bridge client identity mounted from a
/// Secret by an overlay patch) and its image pulled from the lab registry; it reaches the
/// bridge over the hub.
#[test]
fn the_demo_with_the_controller_in_the_cluster_fences_through_the_bridge() {
    let demo = palisade_lab::bin_path("palisade-demo")
        .expect("build the demo first: cargo build -p palisade-scenario --bins");
    let out = Command::new(demo)
        .args(["--netns", "--in-cluster"])
        .output()
        .expect("run palisade-demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}");
    assert!(out.status.success(), "the demo failed:\n{stdout}\n{stderr}");
    for expected in [
        "palisade-controller installed in the cluster: kubectl apply -k",
        "pulled from the lab registry",
        "fenced, verified: PowerOff by bridge://10.213.0.1:",
        "StorageBlocked by bridge://10.213.0.1:",
        "replacement is writing",
        "VERDICT: PASS",
        "palisade-controller power.off m0 token 1 -> ok",
    ] {
        assert!(
            stdout.contains(expected),
            "the demo's output lacks {expected:?}:\n{stdout}"
        );
    }
}
