//! What the tests of this package share (each test uses some of it).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The repository's root (this package lives in its `tests/` folder).
pub(crate) fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent folder")
        .to_path_buf()
}

/// A file of the repository, as text; the path is relative to the root.
pub(crate) fn read(relative: &str) -> String {
    let path = repo_root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}
