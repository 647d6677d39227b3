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

/// Runs `test` to its end on a runtime of two worker threads (the machine's share), as the
/// tests that drive processes and brokers do.
pub(crate) fn block_on<F: Future>(test: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(test)
}
