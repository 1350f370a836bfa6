//! The campaign report in `docs/` is generated from its history file and kept current. Starts
//! no lab.

#[test]
fn the_campaign_report_is_current_with_its_history() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let history = std::fs::read_to_string(format!("{root}/docs/data/campaigns.jsonl"))
        .expect("docs/data/campaigns.jsonl");
    let page = palisade_nemesis::report::render(&history).unwrap();
    let path = format!("{root}/docs/campaign-report.md");
    if std::env::var("PALISADE_WRITE_REPORTS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &page).unwrap();
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == page,
        "docs/campaign-report.md is out of date; run `PALISADE_WRITE_REPORTS=1 cargo test -p palisade-nemesis --test report`"
    );
    assert!(
        !page.contains("not caught"),
        "a planted control was not caught"
    );
}
