//! The companion's self-fence through the CRI: stop the containers and sandboxes of chosen
//! pods, then list again to confirm nothing of them is live.

use std::collections::BTreeSet;

use futures::future::join_all;

use super::inventory::{inventory, Inventory};
use super::wire;
use super::{CriClient, CriError};

/// What a stop did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopReport {
    /// The chosen pods that were live before the stop.
    pub targeted: BTreeSet<String>,
    /// The chosen pods still live when listed after the stop.
    pub still_live: BTreeSet<String>,
    /// Calls that failed (method, ID, error).
    pub errors: Vec<String>,
}

impl StopReport {
    /// Whether the runtime, listed after the stop, shows nothing of the chosen pods live.
    pub fn confirmed(&self) -> bool {
        self.still_live.is_empty()
    }
}

/// Stops every live container of the pods in `uids` at once (`StopContainer` with timeout 0:
/// `SIGKILL`, no grace; this is a fence), then their sandboxes, then lists the runtime again.
///
/// Guarantees: every stop is tried, whatever another one did; `Ok` carries the second
/// listing's verdict ([`StopReport::confirmed`]), never the stops' own answers. `Err` means
/// the runtime could not be listed: nothing is confirmed, and the caller must leave the
/// machine to its watchdog.
///
/// Assumptions: a stock kubelet beside the companion restarts stopped containers by their
/// restart policy, even while it cannot reach the API; the caller repeats the stop for as
/// long as the node is fenced, and the second listing counts a pod started again as live.
pub async fn stop_pods(cri: &CriClient, uids: &BTreeSet<String>) -> Result<StopReport, CriError> {
    let before = inventory(cri).await?;
    let chosen = |inv: &Inventory| -> BTreeSet<String> {
        inv.live_pods().intersection(uids).cloned().collect()
    };
    let mut report = StopReport {
        targeted: chosen(&before),
        ..StopReport::default()
    };
    let pods: Vec<_> = report
        .targeted
        .iter()
        .filter_map(|uid| before.pods.get(uid))
        .collect();
    let containers = pods
        .iter()
        .flat_map(|p| p.containers.iter().filter(|(_, live)| *live))
        .map(|(id, _)| async move {
            let req = wire::StopContainerRequest {
                container_id: id.clone(),
                timeout: 0,
            };
            cri.call::<_, wire::Empty>("StopContainer", &req)
                .await
                .map_err(|e| format!("StopContainer {id}: {e}"))
        });
    report.errors.extend(
        join_all(containers)
            .await
            .into_iter()
            .filter_map(Result::err),
    );
    let sandboxes = pods
        .iter()
        .flat_map(|p| p.sandboxes.iter().filter(|(_, live)| *live))
        .map(|(id, _)| async move {
            let req = wire::StopPodSandboxRequest {
                pod_sandbox_id: id.clone(),
            };
            cri.call::<_, wire::Empty>("StopPodSandbox", &req)
                .await
                .map_err(|e| format!("StopPodSandbox {id}: {e}"))
        });
    report.errors.extend(
        join_all(sandboxes)
            .await
            .into_iter()
            .filter_map(Result::err),
    );
    report.still_live = chosen(&inventory(cri).await?);
    Ok(report)
}
