//! `bin_path` gives absolute paths: they are written into machines' boot scripts, which run
//! with another working directory. A relative `PALISADE_BIN_DIR` (as `hack/chaos.sh` passes)
//! once left every namespace machine unable to boot.

use std::path::Path;

#[test]
fn a_relative_bin_dir_gives_an_absolute_binary_path() {
    // This test binary's own directory, written relative to the working directory.
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap();
    let cwd = std::env::current_dir().unwrap();
    let relative = pathdiff(dir, &cwd);
    assert!(relative.is_relative(), "{}", relative.display());
    std::env::set_var("PALISADE_BIN_DIR", &relative);
    let name = exe.file_name().unwrap().to_str().unwrap();
    let found = palisade_lab::bin_path(name).unwrap();
    assert!(found.is_absolute(), "{}", found.display());
    assert_eq!(found.canonicalize().unwrap(), exe.canonicalize().unwrap());
}

/// `to` written relative to `from` (both absolute), with `..` steps.
fn pathdiff(to: &Path, from: &Path) -> std::path::PathBuf {
    let to: Vec<_> = to.components().collect();
    let from: Vec<_> = from.components().collect();
    let common = to.iter().zip(&from).take_while(|(a, b)| a == b).count();
    let mut out = std::path::PathBuf::new();
    for _ in common..from.len() {
        out.push("..");
    }
    for c in &to[common..] {
        out.push(c);
    }
    out
}
