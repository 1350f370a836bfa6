//! Logs and traces for every long-running Palisade binary (the controller, the
//! firmware-bridge, the node agent): one `tracing` subscriber set-up, and an optional OTLP/HTTP
//! trace exporter behind a flag.
//!
//! - Logs go to stderr, as text or JSON lines, filtered by `RUST_LOG` (else the binary's
//!   default filter).
//! - With `--otlp-endpoint URL` (or `PALISADE_OTLP_ENDPOINT`), every span that passes the
//!   same filter is also exported as OpenTelemetry spans (OTLP over HTTP, protobuf) to
//!   `URL/v1/traces`: the spans carry their fields (node, NodeFence, phase, token, device, …)
//!   as attributes and the binary's name as `service.name`.
//!
//! *Guarantees:* tracing never holds a fence back: spans are exported in batches from a
//! background thread (bounded queue, dropped when full), an unreachable collector only costs
//! a warning, and the exporter is never on a fencing path's critical section. An `https://`
//! collector is verified against `--otlp-ca` only (no built-in roots, no way to skip
//! verification); a URL with credentials is refused.
//!
//! *Assumptions:* `init` with an OTLP endpoint runs inside a multi-threaded tokio runtime
//! (its HTTP client runs there); the [`Guard`] is dropped before that runtime ends, so the
//! last batch is flushed.

pub mod metrics;
#[cfg(feature = "receiver")]
pub mod receiver;
pub mod tls;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _, Registry};

/// The W3C `traceparent` header that names the current span, when its trace is exported
/// (`--otlp-endpoint` set and the span passed the filter); `None` otherwise. The controller
/// sends it with every firmware-bridge request, so the bridge's spans join the fence's trace.
///
/// Guarantees: the header carries trace and span IDs and the sampled flag only: no field,
/// no baggage, nothing of the span's attributes.
pub fn traceparent() -> Option<String> {
    use opentelemetry::propagation::TextMapPropagator as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let mut carrier = std::collections::HashMap::new();
    opentelemetry_sdk::propagation::TraceContextPropagator::new()
        .inject_context(&tracing::Span::current().context(), &mut carrier);
    carrier.remove("traceparent")
}

/// Makes `span` a child of the remote span a W3C `traceparent` header names (a request's, from
/// the controller). A malformed or invalid header is ignored: the span stays a root, and the
/// request is served as without one.
pub fn set_remote_parent(span: &tracing::Span, traceparent: &str) {
    use opentelemetry::propagation::TextMapPropagator as _;
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let carrier =
        std::collections::HashMap::from([("traceparent".to_string(), traceparent.to_string())]);
    let cx = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&carrier);
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}

/// Crates whose spans stay out of the export: the transport's own (the exporter's HTTP
/// requests would otherwise be traced and exported in turn) and the runtime's.
const TRANSPORT: &[&str] = &[
    "h2",
    "hyper",
    "mio",
    "opentelemetry",
    "reqwest",
    "rustls",
    "tokio",
    "tower",
    "want",
];

/// How long one export may take (connect, send, answer) before the batch is dropped.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// The command-line flags of the OTLP exporter, shared by every binary (`#[command(flatten)]`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct OtlpArgs {
    /// Export traces over OTLP/HTTP (protobuf) to this collector base URL, for example
    /// `http://127.0.0.1:4318` (`/v1/traces` is appended). Off when unset.
    #[arg(long, env = "PALISADE_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// PEM CA bundle an `https://` collector is verified against (only these roots).
    #[arg(long, value_name = "FILE", requires = "otlp_endpoint")]
    pub otlp_ca: Option<PathBuf>,
}

/// What a binary asks of [`init`].
#[derive(Debug, Clone)]
pub struct Setup {
    /// The binary's name: `service.name` of its spans.
    pub service: &'static str,
    /// The filter used when `RUST_LOG` is unset, for example `"info,kube=warn"`.
    pub default_filter: &'static str,
    /// Logs as JSON lines instead of text.
    pub json: bool,
    /// The OTLP exporter, if any.
    pub otlp: OtlpArgs,
}

/// Keeps the exporter alive; dropping it flushes the spans not yet sent (bounded by the
/// export timeout).
#[must_use = "dropping the guard at once stops the trace exporter"]
pub struct Guard {
    provider: Option<SdkTracerProvider>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            // The flush's HTTP request runs on the tokio runtime; shutting down from another
            // OS thread leaves this worker's siblings free to run it.
            let flushed = std::thread::spawn(move || provider.shutdown()).join();
            if !matches!(flushed, Ok(Ok(()))) {
                eprintln!("palisade: the last traces could not be exported: {flushed:?}");
            }
        }
    }
}

/// Installs the global subscriber: logs to stderr (coloured only when stderr is a terminal)
/// and, with an OTLP endpoint, the exporter.
///
/// Errors: a malformed endpoint, an `https://` endpoint without `--otlp-ca`, an unreadable
/// CA, credentials in the URL, or an OTLP endpoint outside a tokio runtime. Nothing is
/// installed then.
pub fn init(setup: Setup) -> anyhow::Result<Guard> {
    let provider = match &setup.otlp.otlp_endpoint {
        Some(endpoint) => Some(provider(
            setup.service,
            endpoint,
            setup.otlp.otlp_ca.as_ref(),
        )?),
        None => None,
    };
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(setup.default_filter));
    // Colours only for a person at a terminal: a log file or a collector gets plain text.
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let fmt = if setup.json {
        fmt.json().boxed()
    } else {
        fmt.boxed()
    };
    let otel = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer(setup.service))
            .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
                !TRANSPORT.iter().any(|t| meta.target().starts_with(t))
            }))
    });
    Registry::default()
        .with(fmt)
        .with(otel)
        .with(filter)
        .try_init()
        .context("installing the tracing subscriber")?;
    if let Some(endpoint) = &setup.otlp.otlp_endpoint {
        tracing::info!(endpoint = %endpoint, "exporting traces over OTLP/HTTP");
    }
    Ok(Guard { provider })
}

/// The `…/v1/traces` URL for a collector base URL, after the checks [`init`] documents.
pub fn traces_url(endpoint: &str, ca: Option<&PathBuf>) -> anyhow::Result<String> {
    let uri: http::Uri = endpoint
        .parse()
        .with_context(|| format!("--otlp-endpoint {endpoint:?} is not a URL"))?;
    let Some(authority) = uri.authority() else {
        bail!("--otlp-endpoint {endpoint:?} has no host");
    };
    if authority.as_str().contains('@') {
        bail!("--otlp-endpoint must not carry credentials");
    }
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") if ca.is_some() => {}
        Some("https") => bail!("--otlp-endpoint https:// needs --otlp-ca (the collector's CA)"),
        _ => bail!("--otlp-endpoint {endpoint:?}: the scheme must be http or https"),
    }
    Ok(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
}

fn provider(
    service: &'static str,
    endpoint: &str,
    ca: Option<&PathBuf>,
) -> anyhow::Result<SdkTracerProvider> {
    let url = traces_url(endpoint, ca)?;
    let runtime = tokio::runtime::Handle::try_current().context(
        "the OTLP exporter needs a tokio runtime (a bug: init runs inside main's runtime)",
    )?;
    let roots = match ca {
        Some(ca) => {
            let pem =
                std::fs::read(ca).with_context(|| format!("reading --otlp-ca {}", ca.display()))?;
            tls::roots_from_pem(&pem).map_err(|e| anyhow!("--otlp-ca {}: {e}", ca.display()))?
        }
        // No CA: an https:// collector is refused by `traces_url`, and nothing is trusted.
        None => rustls::RootCertStore::empty(),
    };
    let tls = tls::verified_by(roots)
        .map_err(|e| anyhow!("the OTLP HTTP client: {e}"))?
        .with_no_client_auth();
    let client = reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .timeout(EXPORT_TIMEOUT)
        .build()
        .context("building the OTLP HTTP client")?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(OnRuntime { client, runtime })
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(url)
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .context("building the OTLP span exporter")?;
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name(service).build())
        .build())
}

/// The exporter's HTTP client: the workspace's `reqwest`, run as a task on the binary's tokio
/// runtime (the SDK's batch processor exports from its own OS thread, outside any runtime).
#[derive(Debug)]
struct OnRuntime {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for OnRuntime {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let request = reqwest::Request::try_from(request)?;
        let client = self.client.clone();
        let task = self.runtime.spawn(async move {
            let response = client.execute(request).await?;
            let status = response.status();
            let headers = response.headers().clone();
            let body = response.bytes().await?;
            Ok::<_, reqwest::Error>((status, headers, body))
        });
        let (status, headers, body) = task.await??;
        let mut response = http::Response::new(body);
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_checked_before_anything_is_installed() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318", None).unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://collector:4318/", None).unwrap(),
            "http://collector:4318/v1/traces"
        );
        let ca = PathBuf::from("/ca.pem");
        assert!(traces_url("https://collector:4318", Some(&ca)).is_ok());
        for (bad, why) in [
            ("https://collector:4318", "needs --otlp-ca"),
            ("ftp://collector", "scheme must be http or https"),
            (
                "http://user:pw@collector:4318",
                "must not carry credentials",
            ),
            ("not a url", "is not a URL"),
            ("/v1/traces", "has no host"),
        ] {
            let e = traces_url(bad, None).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
