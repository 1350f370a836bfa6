//! The simulation report in `docs/` is generated from its history file and kept current.

#[test]
fn the_simulation_report_is_current_with_its_history() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let history = std::fs::read_to_string(format!("{root}/docs/data/simulation.jsonl"))
        .expect("docs/data/simulation.jsonl");
    let page = palisade_sim::report::render(&history).unwrap();
    let path = format!("{root}/docs/simulation-report.md");
    if std::env::var("PALISADE_WRITE_REPORTS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &page).unwrap();
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == page,
        "docs/simulation-report.md is out of date; run `PALISADE_WRITE_REPORTS=1 cargo test -p palisade-sim --test report`"
    );
    assert!(
        !page.contains("not caught"),
        "a planted control was not caught"
    );
}
