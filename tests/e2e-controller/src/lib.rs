//! End-to-end tests of `palisade-controller` (tests only; see `tests/`). They start a lab
//! (real kube-apiserver 1.20, `ipmi_sim` BMCs, an SNMP PDU, `palisade-node` on every machine),
//! run the controller as a child process with the admin kubeconfig, cut machines off and check
//! what the controller fences and releases:
//!
//! - `headline`: a cut machine is power-fenced through IPMI (verified; every process on it
//!   dead), its StatefulSet pod and VolumeAttachment are released, the replacement runs on
//!   another machine;
//! - `quorum_guard`: two of three machines silent → nothing fenced, a `FenceHeldQuorumLost` Event;
//! - `all_levels_fail`: a wrong BMC password → `Failed`, a Warning Event, nothing released;
//! - `pdu_fallthrough`: a wrong BMC password falls through to the PDU level (SNMP v2c);
//! - `leader_election`: a standby takes over with a higher fencing token and fences with it;
//! - `recovery`: `recovery.powerOn` powers the machine back on; once its agent renews the Lease,
//!   the taint is removed and the `NodeFence` is Done.
//!
//! Run: `cargo build -p palisade-node -p palisade-controller --bins` then
//! `cargo test -p palisade-e2e-controller`.
