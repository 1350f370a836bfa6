//! Trace context across a process boundary: the `traceparent` taken in one span makes a span
//! of another process (here, another root span) its child in the same trace, as the controller's
//! fence step and the firmware-bridge's action are; a malformed header leaves a root.

use palisade_telemetry::receiver::Receiver;
use palisade_telemetry::{init, set_remote_parent, traceparent};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traceparent_makes_the_remote_span_a_child_in_the_same_trace() {
    // Outside any exported span there is nothing to send.
    assert_eq!(traceparent(), None);
    let receiver = Receiver::start().unwrap();
    let sent = {
        let guard = init(receiver.setup("palisade-test")).unwrap();
        let sent = {
            let step = tracing::info_span!("fence_step");
            let _in = step.enter();
            traceparent().expect("a traceparent inside an exported span")
        };
        // The receiving side: a root span adopts the header's span as its parent.
        let action = tracing::info_span!("bridge_action");
        set_remote_parent(&action, &sent);
        drop(action.enter());
        // A malformed header leaves the span a root.
        let orphan = tracing::info_span!("orphan_action");
        set_remote_parent(&orphan, "00-not-a-trace-01");
        drop(orphan.enter());
        drop((action, orphan));
        drop(guard);
        sent
    };
    let parts: Vec<&str> = sent.split('-').collect();
    assert_eq!(parts.len(), 4, "{sent}");
    assert_eq!((parts[0], parts[3]), ("00", "01"), "{sent}");
    let spans = receiver.spans();
    let named = |n: &str| {
        spans
            .iter()
            .find(|s| s.name == n)
            .unwrap_or_else(|| panic!("no {n} span in {spans:?}"))
            .clone()
    };
    let (step, action, orphan) = (
        named("fence_step"),
        named("bridge_action"),
        named("orphan_action"),
    );
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    assert_eq!(hex(&step.trace_id), parts[1]);
    assert_eq!(hex(&step.span_id), parts[2]);
    assert_eq!(action.trace_id, step.trace_id);
    assert_eq!(action.parent_span_id, step.span_id);
    assert_ne!(orphan.trace_id, step.trace_id);
    assert!(orphan.parent_span_id.is_empty());
}
