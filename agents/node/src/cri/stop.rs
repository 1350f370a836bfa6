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

/// Stops every live container of the live pods whose UID `stop` chooses, all at once
/// (`StopContainer` with timeout 0: `SIGKILL`, no grace; this is a fence), then their
/// sandboxes, then lists the runtime again. The runtime is listed twice in all: the choice is
/// made on the first listing.
///
/// Guarantees: every stop is tried, whatever another one did; `Ok` carries the second
/// listing's verdict ([`StopReport::confirmed`]), never the stops' own answers, with `stop`
/// applied to it alike (a chosen pod started again in between counts as live). `Err` means
/// the runtime could not be listed: nothing is confirmed, and the caller must leave the
/// machine to its watchdog.
///
/// Assumptions: a stock kubelet beside the companion restarts stopped containers by their
/// restart policy, even while it cannot reach the API; the caller repeats the stop for as
/// long as the node is fenced, and the second listing counts a pod started again as live.
pub async fn stop_pods(
    cri: &CriClient,
    stop: impl Fn(&str) -> bool,
) -> Result<StopReport, CriError> {
    let before = inventory(cri).await?;
    let chosen = |inv: &Inventory| -> BTreeSet<String> {
        inv.live_pods()
            .into_iter()
            .filter(|uid| stop(uid))
            .collect()
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
    let live = |ids: &[(String, bool)]| -> Vec<String> {
        ids.iter()
            .filter(|(_, live)| *live)
            .map(|(id, _)| id.clone())
            .collect()
    };
    let containers: Vec<String> = pods.iter().flat_map(|p| live(&p.containers)).collect();
    report.errors.extend(
        stop_each(cri, "StopContainer", &containers, |id| {
            wire::StopContainerRequest {
                container_id: id.to_string(),
                timeout: 0,
            }
        })
        .await,
    );
    let sandboxes: Vec<String> = pods.iter().flat_map(|p| live(&p.sandboxes)).collect();
    report.errors.extend(
        stop_each(cri, "StopPodSandbox", &sandboxes, |id| {
            wire::StopPodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            }
        })
        .await,
    );
    report.still_live = chosen(&inventory(cri).await?);
    Ok(report)
}

/// Calls `method` for every ID at once (the request `req` builds); returns the failures, each
/// naming its method and ID.
async fn stop_each<Q: prost::Message>(
    cri: &CriClient,
    method: &'static str,
    ids: &[String],
    req: impl Fn(&str) -> Q,
) -> Vec<String> {
    let calls = ids.iter().map(|id| {
        let req = req(id);
        async move {
            cri.call::<_, wire::Empty>(method, &req)
                .await
                .map_err(|e| format!("{method} {id}: {e}"))
        }
    });
    join_all(calls)
        .await
        .into_iter()
        .filter_map(Result::err)
        .collect()
}
