//! The OTLP exporter end to end: spans with their fields reach a receiver that decodes them
//! with the OpenTelemetry protocol's message types, as children of their parents, with the
//! binary's service name; what the filter drops is not exported.

use palisade_telemetry::init;
use palisade_telemetry::receiver::Receiver;

#[test]
fn spans_and_their_fields_reach_the_collector() {
    let receiver = Receiver::start().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let guard = init(receiver.setup("palisade-test")).unwrap();
        {
            let fence = tracing::info_span!(
                "nodefence",
                node = "m0",
                nodefence = "m0-abc",
                phase = "Fencing",
                token = 7u64
            );
            let _in = fence.enter();
            let device =
                tracing::info_span!("device", device = "ipmi://10.0.0.1:623", action = "off");
            let _in = device.enter();
            tracing::info!("powered off");
            let hidden = tracing::debug_span!("below-the-filter");
            let _in = hidden.enter();
        }
        drop(guard);
    });
    let spans = receiver.spans();
    assert_eq!(receiver.rejected(), 0);
    let fence = spans
        .iter()
        .find(|s| s.name == "nodefence")
        .unwrap_or_else(|| panic!("no nodefence span in {spans:?}"));
    let device = spans
        .iter()
        .find(|s| s.name == "device")
        .unwrap_or_else(|| panic!("no device span in {spans:?}"));
    assert_eq!(fence.service, "palisade-test");
    for (key, value) in [
        ("node", "m0"),
        ("nodefence", "m0-abc"),
        ("phase", "Fencing"),
        ("token", "7"),
    ] {
        assert_eq!(
            fence.attributes.get(key).map(String::as_str),
            Some(value),
            "{key}: {fence:?}"
        );
    }
    assert_eq!(
        device.attributes.get("device").map(String::as_str),
        Some("ipmi://10.0.0.1:623")
    );
    assert_eq!(device.trace_id, fence.trace_id, "one trace");
    assert_eq!(
        device.parent_span_id, fence.span_id,
        "the device step is a child of the fence"
    );
    assert!(fence.parent_span_id.is_empty());
    assert!(
        spans.iter().all(|s| s.name != "below-the-filter"),
        "a span the filter drops is not exported: {spans:?}"
    );
}
