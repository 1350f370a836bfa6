//! Network probe actions against real local servers: httpGet over HTTPS with a self-signed
//! certificate, named ports for httpGet and tcpSocket, bad probe specs, and gRPC health checks
//! against an in-test `grpc.health.v1` server built on the same `h2` crate.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerPort, Probe};
use palisade_node::grpc_health::{self, ServingStatus};
use palisade_node::probe::{self, ProbeOutcome};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LOCAL: &str = "127.0.0.1";
const T: Duration = Duration::from_secs(5);

fn ip() -> IpAddr {
    LOCAL.parse().unwrap()
}

fn probe(v: serde_json::Value) -> Probe {
    serde_json::from_value(v).unwrap()
}

fn ports(named: &[(&str, u16)]) -> Vec<ContainerPort> {
    named
        .iter()
        .map(|(n, p)| ContainerPort {
            name: Some((*n).into()),
            container_port: i32::from(*p),
            ..Default::default()
        })
        .collect()
}

/// An HTTPS server with a fresh self-signed certificate that answers every request with
/// `status`; returns its port.
async fn https_server(status: &'static str) -> u16 {
    let key = rcgen::generate_simple_self_signed(vec!["not-the-pod-ip.example".into()]).unwrap();
    let cert = key.cert.der().clone();
    let pk = rustls::pki_types::PrivateKeyDer::Pkcs8(key.key_pair.serialize_der().into());
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![cert], pk)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let l = tokio::net::TcpListener::bind((LOCAL, 0)).await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut t) = acceptor.accept(s).await else {
                    return;
                };
                let mut buf = [0u8; 1024];
                let _ = t.read(&mut buf).await;
                let _ = t
                    .write_all(format!("HTTP/1.0 {status}\r\n\r\n").as_bytes())
                    .await;
                let _ = t.shutdown().await;
            });
        }
    });
    port
}

#[tokio::test]
async fn https_probe_accepts_a_self_signed_certificate_and_reads_the_status() {
    let ok = https_server("200 OK").await;
    let bad = https_server("503 Unavailable").await;
    let p = probe(json!({"httpGet": {"scheme": "HTTPS", "port": ok, "path": "/healthz"}}));
    assert_eq!(
        probe::run_network(&p, ip(), &[], T).await,
        Some(ProbeOutcome::Success)
    );
    let p = probe(json!({"httpGet": {"scheme": "HTTPS", "port": bad}}));
    let got = probe::run_network(&p, ip(), &[], T).await.unwrap();
    assert_eq!(
        got,
        ProbeOutcome::Failure("HTTP probe failed with statuscode: 503".into())
    );
    // Plain HTTP against the TLS port fails rather than succeeding by accident.
    let p = probe(json!({"httpGet": {"scheme": "HTTP", "port": ok}}));
    assert!(matches!(
        probe::run_network(&p, ip(), &[], T).await,
        Some(ProbeOutcome::Failure(_))
    ));
}

#[tokio::test]
async fn named_ports_resolve_against_container_ports() {
    let https = https_server("204 No Content").await;
    let l = tokio::net::TcpListener::bind((LOCAL, 0)).await.unwrap();
    let tcp_port = l.local_addr().unwrap().port();
    let named = ports(&[("https", https), ("db", tcp_port)]);
    let p = probe(json!({"httpGet": {"scheme": "HTTPS", "port": "https"}}));
    assert_eq!(
        probe::run_network(&p, ip(), &named, T).await,
        Some(ProbeOutcome::Success)
    );
    let p = probe(json!({"tcpSocket": {"port": "db"}}));
    assert_eq!(
        probe::run_network(&p, ip(), &named, T).await,
        Some(ProbeOutcome::Success)
    );
    // A number written as a string still works, as in the kubelet.
    let p = probe(json!({"tcpSocket": {"port": tcp_port.to_string()}}));
    assert_eq!(
        probe::run_network(&p, ip(), &[], T).await,
        Some(ProbeOutcome::Success)
    );
    drop(l);
}

#[tokio::test]
async fn bad_probe_specs_are_errors_not_panics() {
    let named = ports(&[("http", 8080)]);
    let cases = [
        (
            json!({"httpGet": {"port": "nope"}}),
            "couldn't find port \"nope\"",
        ),
        (json!({"tcpSocket": {"port": "nope"}}), "couldn't find port"),
        (json!({"tcpSocket": {"port": 0}}), "invalid port number: 0"),
        (
            json!({"httpGet": {"port": 70000}}),
            "invalid port number: 70000",
        ),
        (
            json!({"httpGet": {"port": 80, "scheme": "FTP"}}),
            "unsupported scheme",
        ),
        (
            json!({"httpGet": {"port": 80, "host": "not an ip"}}),
            "is not an IP address",
        ),
        (json!({"grpc": {"port": -1}}), "invalid port number: -1"),
    ];
    for (spec, want) in cases {
        let got = probe::run_network(&probe(spec.clone()), ip(), &named, T)
            .await
            .unwrap();
        match got {
            ProbeOutcome::Error(m) => assert!(m.contains(want), "{spec}: {m}"),
            other => panic!("{spec}: want an error, got {other:?}"),
        }
    }
    assert_eq!(
        probe::run_network(&probe(json!({"exec": {"command": ["true"]}})), ip(), &[], T).await,
        None,
        "exec probes are not network probes"
    );
}

/// A `grpc.health.v1.Health` server on h2: known services answer with their status, unknown
/// ones get a trailers-only NOT_FOUND, as grpc-go's health server does.
async fn grpc_health_server(statuses: HashMap<String, ServingStatus>) -> u16 {
    let l = tokio::net::TcpListener::bind((LOCAL, 0)).await.unwrap();
    let port = l.local_addr().unwrap().port();
    let statuses = Arc::new(statuses);
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            let statuses = statuses.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(s).await else {
                    return;
                };
                while let Some(Ok((req, mut respond))) = conn.accept().await {
                    assert_eq!(req.uri().path(), grpc_health::CHECK_PATH);
                    assert_eq!(
                        req.headers().get("content-type").unwrap(),
                        "application/grpc"
                    );
                    let mut body = req.into_body();
                    let mut buf = Vec::new();
                    while let Some(Ok(chunk)) = body.data().await {
                        let _ = body.flow_control().release_capacity(chunk.len());
                        buf.extend_from_slice(&chunk);
                    }
                    let (msg, _) = grpc_health::unframe(&buf).unwrap();
                    let service = grpc_health::decode_request(msg).unwrap();
                    let head = http::Response::builder()
                        .status(200)
                        .header("content-type", "application/grpc");
                    match statuses.get(&service) {
                        Some(st) => {
                            let mut send = respond
                                .send_response(head.body(()).unwrap(), false)
                                .unwrap();
                            send.send_data(grpc_health::encode_response(*st), false)
                                .unwrap();
                            let mut trailers = http::HeaderMap::new();
                            trailers.insert("grpc-status", "0".parse().unwrap());
                            send.send_trailers(trailers).unwrap();
                        }
                        None => {
                            let resp = head
                                .header("grpc-status", "5")
                                .header("grpc-message", "unknown service")
                                .body(())
                                .unwrap();
                            respond.send_response(resp, true).unwrap();
                        }
                    }
                }
            });
        }
    });
    port
}

#[tokio::test]
async fn grpc_probe_reports_serving_not_serving_unknown_and_refused() {
    let port = grpc_health_server(HashMap::from([
        (String::new(), ServingStatus::Serving),
        ("db".to_string(), ServingStatus::NotServing),
    ]))
    .await;
    let run = |service: Option<&str>| {
        let mut v = json!({"grpc": {"port": port}});
        if let Some(s) = service {
            v["grpc"]["service"] = json!(s);
        }
        let p = probe(v);
        async move { probe::run_network(&p, ip(), &[], T).await.unwrap() }
    };
    assert_eq!(run(None).await, ProbeOutcome::Success);
    assert_eq!(
        run(Some("db")).await,
        ProbeOutcome::Failure("service unhealthy (responded with \"NOT_SERVING\")".into())
    );
    assert_eq!(
        run(Some("other")).await,
        ProbeOutcome::Failure("rpc error: code = NotFound desc = unknown service".into())
    );
    // A closed port: the connection is refused.
    let closed = {
        let l = tokio::net::TcpListener::bind((LOCAL, 0)).await.unwrap();
        l.local_addr().unwrap().port()
    };
    let got = grpc_health::check(ip(), closed, None, T).await;
    match got {
        ProbeOutcome::Failure(m) => {
            assert!(m.contains("failed to connect service"), "{m}");
            assert!(m.to_lowercase().contains("refused"), "{m}");
        }
        other => panic!("want a failure, got {other:?}"),
    }
}

#[tokio::test]
async fn grpc_probe_fails_against_a_server_that_does_not_speak_http2() {
    // An HTTP/1 server: the HTTP/2 handshake fails, which must be a failure, not a hang.
    let l = tokio::net::TcpListener::bind((LOCAL, 0)).await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let mut buf = [0u8; 256];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        }
    });
    assert!(matches!(
        grpc_health::check(ip(), port, None, T).await,
        ProbeOutcome::Failure(_)
    ));
}
