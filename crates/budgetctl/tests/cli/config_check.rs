//! `config check`: the resolved map and policies, or every error.

use serde_json::Value;

use crate::{assert_exit, has_fields, json, run, stderr, stdout, temp_file};

#[test]
fn config_check_prints_the_resolved_map_and_policies() {
    let path = temp_file(
        "good.toml",
        "[redis]\nurl = \"redis://admin:s3cret@127.0.0.1:6379\"\n[dependencies.search]\ntasks = [\"index_document\", \"reindex\"]\nratio = 0.1\n[tasks.index_document]\nclass = \"idempotent\"\n[tasks.thumbnail]\nmax_attempts = 2\n",
    );
    let o = run(&["config", "check", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("valid"), "{text}");
    assert!(
        text.contains("index_document")
            && text.contains("search")
            && text.contains("thumbnail (own)"),
        "{text}"
    );
    assert!(!text.contains("s3cret"), "password printed: {text}");
    let v = json(&run(&["config", "check", path.to_str().unwrap(), "--json"]));
    assert_eq!(v["valid"], true);
    has_fields(
        &v,
        &["file", "redis_url", "defaults", "dependencies", "tasks"],
    );
    assert!(!v.to_string().contains("s3cret"));
    let search = &v["dependencies"][0];
    assert_eq!(search["dependency"], "search");
    assert_eq!(search["ratio"], 0.1);
    assert_eq!(
        search["tasks"],
        serde_json::json!(["index_document", "reindex"])
    );
    let tasks = v["tasks"].as_array().unwrap();
    let index = tasks
        .iter()
        .find(|t| t["task"] == "index_document")
        .unwrap();
    assert_eq!(index["max_attempts"], 8);
}

#[test]
fn config_check_lists_every_error_and_exits_2() {
    let path = temp_file("bad.toml", "[defaults]\nratio = -1.0\nwindow_secs = 0\n");
    let o = run(&["config", "check", path.to_str().unwrap()]);
    assert_exit(&o, 2, "defaults.ratio");
    assert!(stderr(&o).contains("defaults.window_secs"));
    let o = run(&["config", "check", path.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(2));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["valid"], false);
    assert_eq!(v["errors"].as_array().unwrap().len(), 2);
    assert_exit(
        &run(&["config", "check", "/nonexistent/x.toml"]),
        2,
        "/nonexistent/x.toml",
    );
    let garbage = temp_file("garbage.toml", "\u{0}\u{1}[[[");
    assert_exit(
        &run(&["config", "check", garbage.to_str().unwrap()]),
        2,
        "garbage.toml",
    );
}

/// `FLEET_BUDGET_REDIS_URL` and `FLEET_BUDGET_AMQP_URL` replaced the file's checked URLs
/// unchecked: `config check` said "valid" for `rediss://.../#insecure` (certificate checks off,
/// and the shown URL had the fragment dropped) or a URL of another scheme, and a worker used
/// them. Now exit 2 naming the variable, the password not shown, in text and JSON.
#[test]
fn config_check_refuses_urls_of_the_environment_the_file_would_refuse() {
    let path = temp_file("env-urls.toml", "[defaults]\nratio = 0.2\n");
    let file = path.to_str().unwrap();
    for (var, url) in [
        (
            "FLEET_BUDGET_REDIS_URL",
            "rediss://u:hunter2@h:6380/#insecure",
        ),
        ("FLEET_BUDGET_REDIS_URL", "http://u:hunter2@h"),
        ("FLEET_BUDGET_AMQP_URL", "amqps://u:hunter2@h/v#insecure"),
        ("FLEET_BUDGET_AMQP_URL", "ftp://u:hunter2@h"),
    ] {
        let o = crate::budgetctl()
            .env(var, url)
            .args(["config", "check", file])
            .output()
            .unwrap();
        assert_exit(&o, 2, var);
        assert!(!stdout(&o).contains("valid"), "{}", stdout(&o));
        let o = crate::budgetctl()
            .env(var, url)
            .args(["config", "check", file, "--json"])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
        assert_eq!(v["valid"], false, "{v}");
        assert_eq!(v["errors"][0]["key"], var, "{v}");
        for out in [stdout(&o), stderr(&o)] {
            assert!(!out.contains("hunter2"), "password printed: {out}");
        }
    }
    // A good URL of the environment is taken.
    let o = crate::budgetctl()
        .env("FLEET_BUDGET_REDIS_URL", "redis://env:1")
        .args(["config", "check", file, "--json"])
        .output()
        .unwrap();
    assert_eq!(json(&o)["redis_url"], "redis://env:1");
}
