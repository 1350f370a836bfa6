//! The runtime inventory the agent advertises with every Lease renewal: the UIDs of the pods
//! that still have a live process in its runtime.
//!
//! It comes from the runtime (processes, and the containers adopted from durable state after a
//! restart), never from the API: after a release the API lists no pod on the node whatever
//! still runs there, so only this inventory can prove the released pods' containers are gone.

use std::collections::BTreeSet;

use crate::runtime::Runtime;

/// Pod UIDs with at least one container that has a live process.
///
/// Guarantees: a container is left out only when the runtime reports none of its processes
/// alive; a container the runtime still lists is counted while any process of it runs.
pub fn live_pods(runtime: &dyn Runtime) -> BTreeSet<String> {
    runtime
        .list()
        .into_iter()
        .filter(|c| runtime.any_alive(&c.id))
        .map(|c| c.pod_uid)
        .collect()
}
