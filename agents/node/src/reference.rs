//! The node agent's reference page (`docs/reference/node-agent.md`), rendered from the flags'
//! clap definitions and the metrics registry, and checked against the page on disk.

use clap::CommandFactory;
use palisade_test_support::reference::{self, Page};

/// The node agent's reference page, and the test that writes it.
const PAGE: Page = Page {
    path: "docs/reference/node-agent.md",
    test: "cargo test -p palisade-node --bin palisade-node reference",
};

/// Every flag of the agent and of its `peer-key` commands, every metric, and the shipped
/// alerts that name those metrics.
fn reference_markdown() -> String {
    let metrics = reference::metrics(&palisade_node::metrics::Metrics::default().render());
    format!(
        "# Reference: the node agent\n\n\
         Generated from the code by `{}`; do not edit. The flags come from the command line's \
         definition (`agents/node/src/main.rs`), the metrics from the registry \
         (`agents/node/src/metrics.rs`), the alerts from `{}` (those whose expression names one \
         of these metrics).\n\n\
         {}\n\
         {}\n\
         ## Metrics\n\nServed on `--metrics-addr` at `/metrics` (OpenMetrics text).\n\n\
         {}\n\
         ## Alerts\n\n\
         {}",
        PAGE.regenerate(),
        reference::RULES,
        reference::flags_tables(&super::Args::command()),
        reference::flags_tables(&super::PeerKeyCommand::command()),
        reference::metrics_table(&metrics),
        reference::alerts_naming(&metrics, "the node agent"),
    )
}

#[test]
fn reference_page_is_current() {
    let page = reference_markdown();
    PAGE.check(&page);
    for want in [
        "`--self-fence-after`",
        "## Arguments of `palisade-node peer-key generate`",
        "`palisade_node_lease_renewals_total` | counter",
    ] {
        assert!(page.contains(want), "{want}");
    }
}
