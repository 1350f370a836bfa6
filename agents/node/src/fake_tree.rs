//! A throwaway directory tree standing in for `/sys` and `/proc` in unit tests (the watchdog's
//! expiry action and the virtual-machine detection read both).

/// A temporary directory; files are written under it by their path relative to it.
pub(crate) struct Tree(pub(crate) tempfile::TempDir);

impl Tree {
    pub(crate) fn new() -> Tree {
        Tree(tempfile::tempdir().unwrap())
    }

    /// Writes `content` to `rel` (creating its directories).
    pub(crate) fn put(&self, rel: &str, content: &str) -> &Tree {
        let p = self.0.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
        self
    }
}
