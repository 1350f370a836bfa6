//! The real control plane: the controller-manager acts on what we create.

mod common;

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use palisade_lab::{Lab, LabConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statefulset_controller_creates_the_first_pod_and_it_stays_pending_without_nodes() {
    let lab = tokio::task::spawn_blocking(|| {
        Lab::start(LabConfig {
            machines: 0,
            pdu: false,
            ..Default::default()
        })
    })
    .await
    .unwrap()
    .expect("control plane starts");
    let client = lab
        .control_plane()
        .unwrap()
        .client()
        .await
        .expect("admin client");

    let sts: StatefulSet = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {
            "serviceName": "web", "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "host", "command": ["sleep", "infinity"]}]}
            }
        }
    }))
    .unwrap();
    Api::<StatefulSet>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &sts)
        .await
        .expect("create statefulset");

    let pods: Api<Pod> = Api::namespaced(client, "default");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let pod = loop {
        if let Some(p) = pods.get_opt("web-0").await.expect("get pod") {
            break p;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the statefulset controller never created web-0"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let owner = &pod.metadata.owner_references.as_ref().expect("owned")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("StatefulSet", "web")
    );
    assert_eq!(pod.status.and_then(|s| s.phase).as_deref(), Some("Pending"));
    assert!(
        pod.spec.and_then(|s| s.node_name).is_none(),
        "no node exists to schedule on"
    );
    tokio::task::spawn_blocking(move || drop(lab))
        .await
        .unwrap();
}
