//! The generated reference pages in `docs/reference/` are current.

const PAGE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../docs/reference/resources.md"
);

#[test]
fn the_resource_reference_matches_the_schemas() {
    let generated = palisade_model::reference::resources_markdown();
    let on_disk = std::fs::read_to_string(PAGE).unwrap_or_default();
    assert!(
        on_disk == generated,
        "docs/reference/resources.md is out of date; run `{} > docs/reference/resources.md`",
        palisade_model::reference::COMMAND
    );
}
