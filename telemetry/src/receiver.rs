//! An OTLP/HTTP trace receiver for tests: it accepts `POST /v1/traces` (protobuf), decodes
//! each request with the OpenTelemetry protocol's own message types, and keeps the spans.
//!
//! No OpenTelemetry Collector can be installed on the test machines (it is not packaged by
//! Debian, PyPI or npm); this receiver decodes exactly what a collector would and answers as
//! one does (`200` with an empty `ExportTraceServiceResponse`; `400` for a body that is not
//! one).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use parking_lot::Mutex;
use prost::Message as _;

/// One span as received.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedSpan {
    /// `service.name` of the resource that sent it.
    pub service: String,
    /// The span's name.
    pub name: String,
    /// Its attributes, every value as text.
    pub attributes: BTreeMap<String, String>,
    /// Trace ID (16 bytes).
    pub trace_id: Vec<u8>,
    /// Span ID (8 bytes).
    pub span_id: Vec<u8>,
    /// The parent's span ID; empty for a root span.
    pub parent_span_id: Vec<u8>,
}

/// A running receiver on `127.0.0.1`; it stops with the test process.
pub struct Receiver {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    rejected: Arc<Mutex<u64>>,
}

impl Receiver {
    /// Starts a receiver on an ephemeral loopback port, on its own thread and runtime.
    pub fn start() -> std::io::Result<Receiver> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let spans = Arc::new(Mutex::new(Vec::new()));
        let rejected = Arc::new(Mutex::new(0));
        let state = (spans.clone(), rejected.clone());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name("otlp-receiver".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener)
                        .expect("a bound std listener converts");
                    let app = axum::Router::new()
                        .route("/v1/traces", post(traces))
                        .with_state(state);
                    let _ = axum::serve(listener, app).await;
                })
            })?;
        Ok(Receiver {
            addr,
            spans,
            rejected,
        })
    }

    /// The loopback address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL to give an exporter (`--otlp-endpoint`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The set-up of a test binary named `service` that exports every span at `info` and
    /// above to this receiver (text logs).
    pub fn setup(&self, service: &'static str) -> crate::Setup {
        crate::Setup {
            service,
            default_filter: "info",
            json: false,
            otlp: crate::OtlpArgs {
                otlp_endpoint: Some(self.endpoint()),
                otlp_ca: None,
            },
        }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().clone()
    }

    /// How many requests were not OTLP trace exports.
    pub fn rejected(&self) -> u64 {
        *self.rejected.lock()
    }
}

type Shared = (Arc<Mutex<Vec<ReceivedSpan>>>, Arc<Mutex<u64>>);

async fn traces(State((spans, rejected)): State<Shared>, body: Bytes) -> (StatusCode, Vec<u8>) {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        *rejected.lock() += 1;
        return (StatusCode::BAD_REQUEST, Vec::new());
    };
    let mut got = Vec::new();
    for resource in request.resource_spans {
        let service = resource
            .resource
            .iter()
            .flat_map(|r| r.attributes.iter())
            .find(|kv| kv.key == "service.name")
            .map(text_of)
            .unwrap_or_default();
        for scope in resource.scope_spans {
            for span in scope.spans {
                got.push(ReceivedSpan {
                    service: service.clone(),
                    name: span.name,
                    attributes: span
                        .attributes
                        .iter()
                        .map(|kv| (kv.key.clone(), text_of(kv)))
                        .collect(),
                    trace_id: span.trace_id,
                    span_id: span.span_id,
                    parent_span_id: span.parent_span_id,
                });
            }
        }
    }
    spans.lock().extend(got);
    // An empty ExportTraceServiceResponse encodes to no bytes.
    (StatusCode::OK, Vec::new())
}

fn text_of(kv: &KeyValue) -> String {
    match kv
        .value
        .as_ref()
        .and_then(|AnyValue { value }| value.as_ref())
    {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}
