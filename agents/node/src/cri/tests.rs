use std::collections::HashMap;
use std::time::Duration;

use prost::Message;

use super::inventory::{Inventory, POD_UID_LABEL};
use super::wire::*;
use super::*;

fn sandbox(id: &str, uid: &str, state: i32) -> PodSandbox {
    PodSandbox {
        id: id.into(),
        metadata: Some(PodSandboxMetadata {
            name: format!("pod-{uid}"),
            uid: uid.into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        state,
        labels: HashMap::new(),
    }
}

fn container(id: &str, sandbox: &str, state: i32, uid_label: Option<&str>) -> Container {
    Container {
        id: id.into(),
        pod_sandbox_id: sandbox.into(),
        metadata: None,
        state,
        labels: uid_label
            .map(|u| HashMap::from([(POD_UID_LABEL.to_string(), u.to_string())]))
            .unwrap_or_default(),
    }
}

#[test]
fn endpoints_are_unix_sockets_with_absolute_paths() {
    assert_eq!(
        parse_endpoint("unix:///run/containerd/containerd.sock").unwrap(),
        PathBuf::from("/run/containerd/containerd.sock")
    );
    assert_eq!(parse_endpoint("/x.sock").unwrap(), PathBuf::from("/x.sock"));
    for bad in [
        "tcp://127.0.0.1:1",
        "unix://relative.sock",
        "x.sock",
        "unix:///a.sock?x=1",
        "",
    ] {
        assert!(
            matches!(parse_endpoint(bad), Err(CriError::Endpoint { .. })),
            "{bad}"
        );
    }
}

#[test]
fn only_an_exited_container_or_a_notready_sandbox_is_not_live() {
    let inv = Inventory::from_lists(
        &[
            sandbox("s1", "u1", SANDBOX_READY),
            sandbox("s2", "u2", SANDBOX_NOTREADY),
            sandbox("s3", "u3", SANDBOX_NOTREADY),
            sandbox("s4", "u4", 7),
        ],
        &[
            container("c1", "s1", CONTAINER_EXITED, None),
            container("c2", "s2", CONTAINER_CREATED, None),
            container("c3", "s3", CONTAINER_EXITED, None),
            container("c5", "gone", CONTAINER_UNKNOWN, Some("u5")),
            container("c6", "s3", 42, None),
        ],
    )
    .unwrap();
    // u1: a ready sandbox; u2: a created container; u3: a container in a state nobody knows;
    // u4: a sandbox state nobody knows; u5: a container whose sandbox was not listed.
    assert_eq!(
        inv.live_pods().into_iter().collect::<Vec<_>>(),
        ["u1", "u2", "u3", "u4", "u5"]
    );
    let dead = Inventory::from_lists(
        &[sandbox("s1", "u1", SANDBOX_NOTREADY)],
        &[container("c1", "s1", CONTAINER_EXITED, None)],
    )
    .unwrap();
    assert!(dead.live_pods().is_empty());
    assert_eq!(dead.pods["u1"].name, "default/pod-u1");
}

#[test]
fn something_live_that_names_no_pod_makes_the_inventory_an_error() {
    let err = Inventory::from_lists(&[], &[container("c9", "nowhere", CONTAINER_RUNNING, None)])
        .unwrap_err();
    assert!(err.contains("c9"), "{err}");
    let err = Inventory::from_lists(&[sandbox("s9", "", SANDBOX_READY)], &[]).unwrap_err();
    assert!(err.contains("s9"), "{err}");
    // Dead and unattributed is harmless.
    Inventory::from_lists(
        &[sandbox("s9", "", SANDBOX_NOTREADY)],
        &[container("c9", "nowhere", CONTAINER_EXITED, None)],
    )
    .unwrap();
}

const T: Duration = Duration::from_secs(2);

#[tokio::test]
async fn a_missing_socket_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("none.sock");
    let err = CriClient::connect(path.to_str().unwrap(), T)
        .await
        .unwrap_err();
    assert!(matches!(err, CriError::Missing { .. }), "{err}");
    assert!(err.to_string().contains("not found"), "{err}");
}

#[tokio::test]
async fn a_socket_that_never_answers_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hung.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((c, _)) = listener.accept().await {
            conns.push(c);
        }
    });
    let err = CriClient::connect(path.to_str().unwrap(), Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(err, CriError::Timeout { .. }), "{err}");
    held.abort();
}

#[tokio::test]
async fn a_socket_that_speaks_no_http2_is_refused() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("garbage.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let server = tokio::spawn(async move {
        while let Ok((mut c, _)) = listener.accept().await {
            let _ = c
                .write_all(b"HTTP/1.1 400 Bad Request\r\n\r\ngarbage")
                .await;
        }
    });
    let err = CriClient::connect(path.to_str().unwrap(), T)
        .await
        .unwrap_err();
    assert!(
        matches!(err, CriError::Connect { .. } | CriError::Garbage { .. }),
        "{err}"
    );
    server.abort();
}

/// A gRPC server on a Unix socket that answers every call with `answer(method)`: the framed
/// body (already a protobuf message) and the grpc-status.
fn serve(
    path: &std::path::Path,
    answer: impl Fn(&str) -> (Vec<u8>, u32) + Send + Sync + Clone + 'static,
) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::UnixListener::bind(path).unwrap();
    tokio::spawn(async move {
        while let Ok((c, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(c).await else {
                    return;
                };
                while let Some(Ok((req, mut respond))) = conn.accept().await {
                    let method = req
                        .uri()
                        .path()
                        .rsplit('/')
                        .next()
                        .unwrap_or("")
                        .to_string();
                    let (body, status) = answer(&method);
                    let resp = http::Response::builder()
                        .status(200)
                        .header("content-type", "application/grpc")
                        .body(())
                        .unwrap();
                    let mut send = respond.send_response(resp, false).unwrap();
                    let _ = send.send_data(crate::grpc::frame(&body), false);
                    let mut trailers = http::HeaderMap::new();
                    trailers.insert("grpc-status", status.to_string().parse().unwrap());
                    let _ = send.send_trailers(trailers);
                }
            });
        }
    })
}

fn version(api: &str) -> Vec<u8> {
    VersionResponse {
        version: "0.1.0".into(),
        runtime_name: "liar".into(),
        runtime_version: "1".into(),
        runtime_api_version: api.into(),
    }
    .encode_to_vec()
}

#[tokio::test]
async fn a_runtime_that_is_not_cri_v1_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v1alpha2.sock");
    let server = serve(&path, |_| (version("v1alpha2"), 0));
    let err = CriClient::connect(path.to_str().unwrap(), T)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not v1"), "{err}");
    server.abort();
}

#[tokio::test]
async fn garbage_lists_and_grpc_errors_are_errors_never_an_empty_inventory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("liar.sock");
    let server = serve(&path, |method| match method {
        "Version" => (version("v1"), 0),
        // A length-delimited field whose length runs past the end.
        "ListPodSandbox" => (vec![0x0a, 0x40, 1, 2, 3], 0),
        _ => (Vec::new(), 14),
    });
    let cri = CriClient::connect(path.to_str().unwrap(), T).await.unwrap();
    assert_eq!(cri.runtime(), "liar 1");
    let err = inventory::inventory(&cri).await.unwrap_err();
    assert!(matches!(err, CriError::Garbage { .. }), "{err}");
    let err = cri
        .call::<_, Empty>("StopContainer", &StopContainerRequest::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, CriError::Status { code: 14, .. }) && err.to_string().contains("Unavailable"),
        "{err}"
    );
    server.abort();
}

#[tokio::test]
async fn a_runtime_that_says_it_paginated_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("paged.sock");
    let server = serve(&path, |method| match method {
        "Version" => (version("v1"), 0),
        "ListContainers" => (Vec::new(), 0),
        _ => (
            ListPodSandboxResponse {
                items: vec![sandbox("s1", "u1", SANDBOX_NOTREADY)],
                next_page_token: "more".into(),
            }
            .encode_to_vec(),
            0,
        ),
    });
    let cri = CriClient::connect(path.to_str().unwrap(), T).await.unwrap();
    let err = inventory::inventory(&cri).await.unwrap_err();
    assert!(err.to_string().contains("one page"), "{err}");
    server.abort();
}
