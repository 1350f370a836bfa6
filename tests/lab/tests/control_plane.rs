//! The real control plane: the controller-manager acts on what we create.

mod common;

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use palisade_lab::{Lab, LabConfig};

/// A lab with a control plane and nothing else, and its admin client.
async fn control_plane_only() -> (Lab, kube::Client) {
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
    (lab, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statefulset_controller_creates_the_first_pod_and_it_stays_pending_without_nodes() {
    let (lab, client) = control_plane_only().await;

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

/// Guards the reflect2 fix in `hack/install-deps.sh`: the 1.20 API server built with Go 1.19
/// and the vendored reflect2 1.0.1 crashes on the first custom-resource write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_resources_can_be_created_and_read_back() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};

    let (lab, client) = control_plane_only().await;
    let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.lab.palisade.dev"},
        "spec": {
            "group": "lab.palisade.dev", "scope": "Cluster",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"size": {"type": "integer"}}}}}}}]
        }
    }))
    .unwrap();
    Api::<CustomResourceDefinition>::all(client.clone())
        .create(&PostParams::default(), &crd)
        .await
        .expect("create CRD");
    let gvk = GroupVersionKind::gvk("lab.palisade.dev", "v1", "Widget");
    let widgets: Api<DynamicObject> = Api::all_with(client, &ApiResource::from_gvk(&gvk));
    let mut obj = DynamicObject::new("w1", &ApiResource::from_gvk(&gvk));
    obj.data = serde_json::json!({"spec": {"size": 3}});
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        // The CRD takes a moment to be established.
        match widgets.create(&PostParams::default(), &obj).await {
            Ok(_) => break,
            Err(e) => assert!(
                tokio::time::Instant::now() < deadline,
                "custom resource create failed: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let back = widgets
        .get("w1")
        .await
        .expect("read back (the API server is still up)");
    assert_eq!(back.data["spec"]["size"], 3);
    tokio::task::spawn_blocking(move || drop(lab))
        .await
        .unwrap();
}

/// The etcd relay (`LabConfig::etcd_relay`): a slowed etcd makes a write late by at least one
/// round trip through the relay, and loses nothing; healed, writes go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_etcd_makes_writes_late_and_loses_none() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let lab = tokio::task::spawn_blocking(|| {
        Lab::start(LabConfig {
            machines: 0,
            pdu: false,
            etcd_relay: true,
            ..Default::default()
        })
    })
    .await
    .unwrap()
    .expect("control plane starts");
    let cp = lab.control_plane().unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(cp.client().await.expect("admin client"), "default");
    let map = |name: &str| -> ConfigMap {
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap()
    };
    maps.create(&PostParams::default(), &map("before"))
        .await
        .expect("a write before");
    let delay = Duration::from_millis(400);
    cp.slow_etcd(Some(delay)).expect("the relay is there");
    let sent = tokio::time::Instant::now();
    maps.create(&PostParams::default(), &map("during"))
        .await
        .expect("a write while etcd is slow");
    assert!(
        sent.elapsed() >= 2 * delay,
        "a write reached etcd and came back in {:?}, sooner than the relay allows",
        sent.elapsed()
    );
    cp.slow_etcd(None).expect("healed");
    maps.create(&PostParams::default(), &map("after"))
        .await
        .expect("a write after");
    for name in ["before", "during", "after"] {
        maps.get(name).await.expect("every write is there");
    }
    tokio::task::spawn_blocking(move || drop(lab))
        .await
        .unwrap();
}
