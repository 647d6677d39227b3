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

/// `budgetctl` as the ignored scale tests run it: `FLEET_BUDGET_BUDGETCTL`, else the binary
/// beside the test's own (same profile), which `script` builds before running the test.
pub(crate) fn budgetctl_beside(script: &str) -> PathBuf {
    if let Ok(p) = std::env::var("FLEET_BUDGET_BUDGETCTL")
        && !p.is_empty()
    {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("the test's own path");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary lies in target/<profile>/deps")
        .join(format!("budgetctl{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.exists(),
        "{} is not built: run `cargo build -p budgetctl` with this test's profile ({script} does)",
        bin.display()
    );
    bin
}
