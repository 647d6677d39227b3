//! The configuration's checks: every section's problems together, URLs and nodes redacted.

use super::*;

fn problems(text: &str) -> Vec<Problem> {
    match WorkerConfig::from_toml(text, "test.toml") {
        Err(ConfigError::Invalid { problems, .. }) => problems,
        other => panic!("expected invalid values, got {other:?}"),
    }
}

#[test]
fn both_sections_from_one_file() {
    let c = WorkerConfig::from_toml(
        "[amqp]\nprefix = \"shop\"\nprefetch = 4\nretry_tiers_secs = [0.5, 2]\n[dependencies.search]\ntasks = [\"index\"]\n",
        "t",
    )
    .unwrap();
    assert_eq!(c.amqp.prefix, "shop");
    assert_eq!(c.amqp.prefetch, 4);
    assert_eq!(
        c.amqp.retry_tiers,
        [Duration::from_millis(500), Duration::from_secs(2)]
    );
    assert_eq!(c.budget.map.resolve("index").unwrap().as_str(), "search");
    let d = WorkerConfig::from_toml("", "t").unwrap();
    assert_eq!(d.amqp, AmqpSettings::default());
}

#[test]
fn a_prefix_that_would_print_as_another_is_refused_by_code_point() {
    // A right-to-left override, a zero-width space, a no-break space: each would make the
    // queue names the tools print read as something they are not.
    for (prefix, named) in [
        ("fleet\u{202e}", "U+202E"),
        ("fl\u{200b}eet", "U+200B"),
        ("fleet\u{a0}x", "U+00A0"),
    ] {
        let p = problems(&format!("[amqp]\nprefix = \"{prefix}\"\n"));
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].key, "amqp.prefix");
        assert!(p[0].allowed.contains(named), "{}", p[0]);
        assert!(!p[0].to_string().contains(prefix), "printed raw: {}", p[0]);
    }
}

#[test]
fn problems_of_every_section_are_reported_together() {
    let p = problems(
        "[amqp]\nprefetch = 0\nprefix = \"amq.x\"\nretry_tiers_secs = [5, 1]\n[defaults]\nratio = -1.0\n",
    );
    let keys: Vec<&str> = p.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "defaults.ratio",
            "amqp.prefix",
            "amqp.prefetch",
            "amqp.retry_tiers_secs"
        ]
    );
    let p = problems(
        "[amqp]\nretry_tiers_secs = [-1, \"nan\"]\n"
            .replace("\"nan\"", "nan")
            .as_str(),
    );
    assert_eq!(p.len(), 3, "{p:?}");
    assert_eq!(p[2].allowed, "must list at least one delay");
    let many: Vec<String> = (1..=33).map(|i| i.to_string()).collect();
    let p = problems(&format!(
        "[amqp]\nretry_tiers_secs = [{}]\n",
        many.join(", ")
    ));
    assert_eq!(p[0].allowed, "must list at most 32 delays");
}

#[test]
fn a_file_that_does_not_parse_says_so_before_any_value_problem() {
    for text in [
        "[amqp]\nprefecth = 3\n[defaults]\nratio = -1.0\n",
        "[amqp]\nprefetch = 0\n[defaults]\nratoi = 1.0\n",
        "[amqp]\nprefetch = \"many\"\n",
        "[amqp\n",
    ] {
        let e = WorkerConfig::from_toml(text, "t").unwrap_err();
        assert!(matches!(e, ConfigError::Parse { .. }), "{text:?}: {e}");
        assert!(e.to_string().contains("line "), "{e}");
    }
    let e = WorkerConfig::from_toml("[amqp]\nprefecth = 3\n", "t").unwrap_err();
    assert!(e.to_string().contains("prefetch"), "{e}");
}

#[test]
fn bad_amqp_urls_are_named_with_passwords_redacted() {
    let p = problems("[amqp]\nurl = \"http://u:hunter2@h\"\n");
    assert_eq!(p[0].key, "amqp.url");
    assert!(!p[0].value.contains("hunter2"), "{}", p[0]);
    let mut settings = AmqpSettings::default();
    let p = settings.set_url("redis://u:hunter2@h").unwrap_err();
    assert!(!p.to_string().contains("hunter2"), "{p}");
    assert_eq!(settings.url, AmqpSettings::default().url);
    let p = settings
        .set_url("amqps://u:hunter2@h/v#insecure")
        .unwrap_err();
    assert!(p.allowed.contains("#fragment"), "{p}");
    assert!(!p.to_string().contains("hunter2"), "{p}");
    assert_eq!(settings.url, AmqpSettings::default().url);
    settings.set_url("amqps://h/v").unwrap();
    assert_eq!(settings.url, "amqps://h/v");
    settings.set_url("amqp://h/v").unwrap();
    assert!(settings.tls_problem().is_none());
    settings.tls.ca_file = Some("ca.pem".into());
    let p = settings.tls_problem().expect("files for a plaintext URL");
    assert!(p.to_string().contains("not be encrypted"), "{p}");
    settings.set_url("amqps://h/v").unwrap();
    assert!(settings.tls_problem().is_none());
}

#[test]
fn environment_overrides_urls() {
    let mut c = WorkerConfig::from_toml("[redis]\nurl = \"redis://file:6379\"\n", "t").unwrap();
    c.apply_env(|k| match k {
        fleet_budget::config::ENV_REDIS_URL => Some("redis://env:1".to_owned()),
        ENV_AMQP_URL => Some("amqp://u:secret@env:5672/%2f".to_owned()),
        _ => None,
    })
    .unwrap();
    assert_eq!(c.budget.redis.url, "redis://env:1");
    assert_eq!(c.amqp.url, "amqp://u:secret@env:5672/%2f");
}

#[test]
fn a_cluster_is_a_list_of_nodes_checked_each_with_passwords_redacted() {
    let c = WorkerConfig::from_toml(
        "[amqp]\nurls = [\"amqp://u:p@n1:5672\", \"amqp://u:p@n2:5673\"]\n",
        "t",
    )
    .unwrap();
    assert_eq!(c.amqp.url, "amqp://u:p@n1:5672");
    assert_eq!(c.amqp.other_urls, ["amqp://u:p@n2:5673"]);
    let to = c.amqp.connection();
    assert_eq!(to.urls().count(), 2);
    assert!(!format!("{to:?}").contains(":p@"), "{to:?}");
    assert!(!c.amqp.shown_urls().contains(":p@"));

    let p = problems("[amqp]\nurl = \"amqp://a\"\nurls = [\"amqp://b\"]\n");
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].key, "amqp.urls");
    assert!(p[0].allowed.contains("not both"), "{}", p[0]);
    let p = problems("[amqp]\nurls = []\n");
    assert_eq!(p[0].key, "amqp.urls");
    let p = problems("[amqp]\nurls = [\"amqp://a\", \"http://u:secret@b\"]\n");
    assert_eq!(p[0].key, "amqp.urls[1]");
    assert!(!p[0].to_string().contains("secret"), "{}", p[0]);
    let p = problems("[amqp]\nurls = [\"amqp://a\", \"amqp://a\"]\n");
    assert_eq!(p[0].key, "amqp.urls[1]");
    let many: Vec<String> = (0..=MAX_BROKER_URLS)
        .map(|i| format!("\"amqp://n{i}\""))
        .collect();
    let p = problems(&format!("[amqp]\nurls = [{}]\n", many.join(",")));
    assert_eq!(p[0].key, "amqp.urls");

    // A failover must not drop the encryption.
    let c = WorkerConfig::from_toml("[amqp]\nurls = [\"amqps://a\", \"amqp://b\"]\n", "t").unwrap();
    assert_eq!(
        c.amqp.tls_problem().map(|p| p.key),
        Some("amqp.urls".to_owned())
    );
}

#[test]
fn the_environment_names_one_broker_or_a_cluster_never_both() {
    let env = |url: Option<&'static str>, urls: Option<&'static str>| {
        move |k: &str| match k {
            ENV_AMQP_URL => url.map(str::to_owned),
            ENV_AMQP_URLS => urls.map(str::to_owned),
            _ => None,
        }
    };
    let mut c =
        WorkerConfig::from_toml("[amqp]\nurls = [\"amqp://a\", \"amqp://b\"]\n", "t").unwrap();
    c.apply_env(env(None, Some("amqp://x, amqp://u:secret@y")))
        .unwrap();
    assert_eq!(
        c.amqp.urls().collect::<Vec<_>>(),
        ["amqp://x", "amqp://u:secret@y"]
    );
    c.apply_env(env(Some("amqp://z"), None)).unwrap();
    assert_eq!(c.amqp.urls().collect::<Vec<_>>(), ["amqp://z"]);
    let p = c
        .apply_env(env(Some("amqp://z"), Some("amqp://x")))
        .unwrap_err();
    assert_eq!(p.key, ENV_AMQP_URLS);
    let p = c
        .apply_env(env(None, Some("amqp://x,,amqp://u:secret@y")))
        .unwrap_err();
    assert_eq!(p.key, "FLEET_BUDGET_AMQP_URLS[1]");
    let p = c
        .apply_env(env(None, Some("amqp://x,redis://u:secret@y")))
        .unwrap_err();
    assert!(!p.to_string().contains("secret"), "{p}");
    assert_eq!(
        c.amqp.urls().collect::<Vec<_>>(),
        ["amqp://z"],
        "unchanged after a problem"
    );
}
