//! `docs/benchmarks.md` is generated from the benchmarks' data in `docs/data/` and kept current.

use palisade_test_support::bench::page;
use palisade_test_support::reference::repo_path;

/// `PALISADE_WRITE_REPORTS=1` rewrites the page from the data.
#[test]
fn the_benchmark_page_is_current_with_its_data() {
    let rendered = page::render(&repo_path("docs/data")).unwrap();
    let path = repo_path(page::PATH);
    if std::env::var("PALISADE_WRITE_REPORTS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &rendered).unwrap();
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == rendered,
        "{} is out of date; run `PALISADE_WRITE_REPORTS=1 {}`",
        page::PATH,
        page::TEST
    );
}
