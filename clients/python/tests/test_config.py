"""The configuration: the Rust library's keys, limits and messages."""

import pytest

from fleet_budget import Config, ConfigError, FleetBudget
from fleet_budget.budget import InvalidTask
from fleet_budget.config import _is_unsafe_char

README = """
[defaults]
window_secs = 60
ratio = 0.2
min_allowance = 10
[dependencies.search]
tasks = ["index_document", "reindex_tenant", "bulk_import"]
[dependencies.mail]
tasks = ["send_receipt"]
ratio = 0.1
[tasks.index_document]
class = "idempotent"
[tasks.send_receipt]
max_attempts = 3
[tasks.bulk_import]
recovery_window_secs = 900
[amqp]
prefetch = 4
"""


def test_the_readme_example_parses_like_rust():
    c = Config.from_toml(README)
    assert c.dependency("reindex_tenant") == "search"
    assert c.dependency("unlisted") == "unlisted"
    assert c.policy("mail").ratio == 0.1 and c.policy("search").ratio == 0.2
    assert c.ceiling("index_document").max_attempts == 8
    assert c.ceiling("send_receipt").max_attempts == 3
    assert c.ceiling("bulk_import").max_attempts == 10, "900 s: the Rust schedule (docs/semantics.md, 4 h → 32)"
    assert c.ceiling("bulk_import").recovery_window == 900
    assert c.ceiling("other").max_attempts == 5


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as e:
        Config.from_toml("[defaults]\nratio = -1.0\nwindow_secs = 0\nmin_allowance = -3\n", "t.toml")
    assert [p.key for p in e.value.problems] == ["defaults.window_secs", "defaults.ratio", "defaults.min_allowance"]
    assert str(e.value).startswith("t.toml: invalid configuration:\n  - ")
    for value in ["nan", "-0.1", "11.0", "inf"]:
        with pytest.raises(ConfigError) as e:
            Config.from_toml(f"[defaults]\nratio = {value}\n")
        assert "from 0 to 10" in str(e.value)


def test_bad_text_unknown_keys_and_secrets():
    with pytest.raises(ConfigError):
        Config.from_toml("[defaults\n")
    with pytest.raises(ConfigError) as e:
        Config.from_toml("[defaults]\nratoi = 0.2\n")
    assert "ratoi" in str(e.value) and "window_secs" in str(e.value)
    with pytest.raises(ConfigError) as e:
        Config.from_toml('[redis]\nurl = "http://u:hunter2@h"\n')
    assert "redis.url" in str(e.value) and "hunter2" not in str(e.value)
    with pytest.raises(ConfigError) as e:
        Config.from_toml('[dependencies."a{b"]\n[dependencies.x]\ntasks = ["t", "t"]\n')
    assert len(e.value.problems) == 2
    with pytest.raises(ConfigError) as e:
        Config.from_toml("[tasks.t]\nclass = \"paid\"\nmax_attempts = 2\n")
    assert "at most one" in str(e.value)


def test_the_file_and_the_environment(tmp_path, monkeypatch):
    with pytest.raises(ConfigError) as e:
        Config.from_path(tmp_path / "missing.toml")
    assert "cannot read" in str(e.value)
    path = tmp_path / "fb.toml"
    path.write_text('[redis]\nurl = "redis://example:1"\nkey_prefix = "p"\n')
    monkeypatch.setenv("FLEET_BUDGET_REDIS_URL", "redis://127.0.0.1:7")
    budget = FleetBudget.from_config(str(path))
    assert budget.config.redis.url == "redis://127.0.0.1:7" and budget.config.redis.key_prefix == "p"
    budget.close()


def test_concurrency_and_breaker_sections_are_read_not_refused():
    """[dependencies.X.concurrency] and [dependencies.X.breaker] (issue 13) are read as in Rust
    (clients/python/tests/test_concurrency.py checks their values and problems)."""
    c = Config.from_toml('[dependencies.paid]\ntasks = ["charge"]\n[dependencies.paid.concurrency]\ncap = 20\n'
                         'planned_primary = 16\n[dependencies.paid.breaker]\n')
    assert c.concurrency["paid"].cap == 20 and c.breakers["paid"].half_open_probes == 3


def test_unmapped_tasks_and_max_delay_are_read_like_rust():
    c = Config.from_toml("")
    assert (c.unmapped.policy, c.unmapped.max_own_budgets) == ("own_budget", 100), "today's default, now capped"
    assert c.ceiling("any").max_delay == 1200, "twice the default 600 s backoff cap, longer than the 1,024 s tier"
    c = Config.from_toml("[defaults]\nbackoff_cap_ms = 10000\n")
    assert c.ceiling("any").max_delay == 1024, "the longest default retry tier"
    c = Config.from_toml("[defaults]\nmax_delay_secs = 300\n[tasks.a]\nmax_attempts = 3\n"
                         "[tasks.b]\nmax_delay_secs = 60\nclass = \"paid\"\n[tasks.c]\nrecovery_window_secs = 900\n")
    assert [c.ceiling(t).max_delay for t in ("a", "b", "c", "other")] == [300, 60, 300, 300]
    c = Config.from_toml("[unmapped_tasks]\npolicy = \"share\"\ndependency = \"search\"\n[dependencies.search]\n")
    assert c.unmapped.dependency == "search" and c.dependency("whatever") == "search"
    # Under share or reject an unmapped [tasks.*] name is not a budget name, so it may hold `{`.
    Config.from_toml("[unmapped_tasks]\npolicy = \"reject\"\n[tasks.\"a{b}\"]\nmax_attempts = 2\n")
    with pytest.raises(ConfigError) as e:
        Config.from_toml("[tasks.\"a{b}\"]\nmax_attempts = 2\n")
    assert e.value.problems[0].key == 'tasks."a{b}"'


@pytest.mark.parametrize("text, key, needle", [
    ("[unmapped_tasks]\npolicy = \"share\"\n", "unmapped_tasks.dependency", "there is none"),
    ("[unmapped_tasks]\npolicy = \"share\"\ndependency = \"serch\"\n[dependencies.search]\n",
     "unmapped_tasks.dependency", "(search)"),
    ("[unmapped_tasks]\npolicy = \"reject\"\ndependency = \"search\"\n", "unmapped_tasks.dependency",
     "only with policy = \"share\""),
    ("[unmapped_tasks]\npolicy = \"reject\"\nmax_own_budgets = 3\n", "unmapped_tasks.max_own_budgets",
     "only with policy = \"own_budget\""),
    ("[unmapped_tasks]\nmax_own_budgets = -1\n", "unmapped_tasks.max_own_budgets", "0 to 100000"),
    ("[unmapped_tasks]\nmax_own_budgets = 100001\n", "unmapped_tasks.max_own_budgets", "0 to 100000"),
    ("[defaults]\nmax_delay_secs = 0\n", "defaults.max_delay_secs", "1 to 604800"),
    ("[defaults]\nmax_delay_secs = 604801\n", "defaults.max_delay_secs", "1 to 604800"),
    ("[tasks.t]\nmax_delay_secs = -1\n", "tasks.t.max_delay_secs", "1 to 604800"),
])
def test_bad_unmapped_tasks_and_max_delay_are_named(text, key, needle):
    with pytest.raises(ConfigError) as e:
        Config.from_toml(text)
    assert [p.key for p in e.value.problems] == [key], text
    assert needle in e.value.problems[0].allowed, str(e.value)


@pytest.mark.parametrize("text", [
    "[unmapped_tasks]\npolicy = \"own\"\n",
    "[unmapped_tasks]\npolicy = 1\n",
    "[unmapped_tasks]\ndependency = 3\npolicy = \"share\"\n",
    "[unmapped_tasks]\nmax_own_budgets = \"many\"\n",
    "[unmapped_tasks]\ncap = 3\n",
    "unmapped_tasks = 3\n",
    "[defaults]\nmax_delay_secs = 1.5\n",
])
def test_unmapped_tasks_of_the_wrong_shape_refuse_the_text(text):
    with pytest.raises(ConfigError) as e:
        Config.from_toml(text)
    assert not e.value.problems, "refused whole, as serde refuses it"


def test_batch_across_dependencies_is_read_like_rust():
    assert Config.from_toml("[redis]\nbatch_across_dependencies = false\n") is not None
    with pytest.raises(ConfigError) as e:
        Config.from_toml('[redis]\nbatch_across_dependencies = "no"\n')
    assert [p.key for p in e.value.problems] == ["redis.batch_across_dependencies"]


def _problem_keys(text: str) -> list[str]:
    with pytest.raises(ConfigError) as e:
        Config.from_toml(text)
    return sorted(p.key for p in e.value.problems)


def test_key_prefixes_are_refused_as_rust_refuses_them():
    """Input review, session 5: the Rust check counts 64 *bytes* and refuses every Unicode space;
    this client counted characters and refused only " ", so it accepted prefixes the Rust worker
    of the same fleet refuses (and would have written keys no Rust tool reads)."""
    assert Config.from_toml('[redis]\nkey_prefix = "' + "é" * 32 + '"\n').redis.key_prefix == "é" * 32
    for prefix in ["é" * 33, "a\u00a0b", "a\u3000b", "a\u2003b"]:
        assert _problem_keys(f'[redis]\nkey_prefix = "{prefix}"\n') == ["redis.key_prefix"], prefix


def _problems(text: str, origin: str = "<toml>") -> tuple[str, list]:
    with pytest.raises(ConfigError) as e:
        Config.from_toml(text, origin)
    return str(e.value), e.value.problems


@pytest.mark.parametrize("escape, code", [
    ("\\u202E", "U+202E (a bidirectional control)"),
    ("\\u2066", "U+2066 (a bidirectional control)"),
    ("\\u200E", "U+200E (a bidirectional control)"),
    ("\\u200F", "U+200F (a bidirectional control)"),
    ("\\u200B", "U+200B (an invisible character)"),
    ("\\u200D", "U+200D (an invisible character)"),
    ("\\uFEFF", "U+FEFF (an invisible character)"),
    ("\\u00AD", "U+00AD (an invisible character)"),
    ("\\U000E0041", "U+E0041 (an invisible character)"),
    ("\\u2028", "U+2028 (a line or paragraph separator)"),
    ("\\u0085", "U+0085 (a control character)"),
])
def test_key_prefixes_with_bidi_or_invisible_characters_are_refused(escape, code):
    """Input review, session 6: such a prefix was accepted, and was then in every key name and in
    status and audit output. Refused as Rust refuses it; the message names the file, the field and
    the character by its code point, and never holds the character itself."""
    shown, problems = _problems(f'[redis]\nkey_prefix = "fb{escape}x"\n', "/etc/fleet-budget/worker.toml")
    assert [p.key for p in problems] == ["redis.key_prefix"]
    assert shown.startswith("/etc/fleet-budget/worker.toml: invalid configuration:")
    assert f"contains {code}" in problems[0].allowed
    assert "\\u{" in problems[0].value
    assert not any(_is_unsafe_char(ch) for ch in str(problems[0])), repr(shown)


@pytest.mark.parametrize("escape, code, shown", [
    ("\\u200B", "U+200B (an invisible character)", "\\u{200b}"),
    ("\\u2060", "U+2060 (an invisible character)", "\\u{2060}"),
    ("\\u202E", "U+202E (a bidirectional control)", "\\u{202e}"),
    ("\\u3164", "U+3164 (an invisible character)", "\\u{3164}"),
])
def test_dependency_and_task_names_with_invisible_characters_are_refused(escape, code, shown):
    """Zero-width and other invisible characters were accepted in dependency and task names, so
    ``sea\\u200Brch`` was a budget of its own that printed as ``search``."""
    for text, key in [
        (f'[dependencies."sea{escape}rch"]\n', f'dependencies."sea{shown}rch"'),
        (f'[dependencies.search]\ntasks = ["t{escape}"]\n', "dependencies.search.tasks[0]"),
        (f'[tasks."t{escape}"]\nmax_attempts = 2\n', f'tasks."t{shown}"'),
    ]:
        message, problems = _problems(text)
        assert [p.key for p in problems] == [key], (text, problems)
        assert code in problems[0].allowed, problems[0]
        assert not any(_is_unsafe_char(ch) for ch in str(problems[0])), repr(message)


def test_a_task_of_its_own_with_an_invisible_character_is_refused():
    budget = FleetBudget(Config.from_toml(""), redis_url="redis://127.0.0.1:1")
    with pytest.raises(InvalidTask) as e:
        budget.dependency("sea\u200brch")
    assert "U+200B" in str(e.value)
    budget.close()


def test_a_key_prefix_given_to_the_constructor_is_checked_like_the_files():
    with pytest.raises(ConfigError) as e:
        FleetBudget(Config.from_toml(""), redis_url="redis://127.0.0.1:1", key_prefix="fb\u202e")
    assert "U+202E" in str(e.value) and "\u202e" not in str(e.value)


def test_only_a_fragment_with_text_is_refused_in_urls():
    """An empty fragment (``redis://h:1/#``) turns nothing off; Rust takes it, and so does this
    client now. A fragment with text is refused by both."""
    assert Config.from_toml('[redis]\nurl = "redis://h:1/#"\n').redis.url == "redis://h:1/#"
    assert _problem_keys('[redis]\nurl = "rediss://h:1/#insecure"\n') == ["redis.url"]


def test_metrics_listen_takes_a_numeric_ipv6_scope_only():
    """Rust's socket address syntax: ``[fe80::1%2]:9464`` yes, ``[fe80::1%eth0]:9464`` no."""
    Config.from_toml('[metrics]\nlisten = "[fe80::1%2]:9464"\n')
    for bad in ["[fe80::1%eth0]:9464", "[fe80::1%]:9464", "[fe80::1%4294967296]:9464"]:
        assert _problem_keys(f'[metrics]\nlisten = "{bad}"\n') == ["metrics.listen"], bad


def test_a_byte_order_mark_is_skipped_as_rust_skips_it(tmp_path):
    """A file saved with a BOM (Windows editors) was refused here ("Invalid statement") and taken
    by the Rust worker."""
    path = tmp_path / "bom.toml"
    path.write_bytes("\ufeff[defaults]\nratio = 0.1\n".encode("utf-8"))
    assert Config.from_path(path).defaults.ratio == 0.1


def test_urls_the_redis_client_cannot_use_are_refused_as_rust_refuses_them():
    """The Rust check now asks the Redis client whether it can use the URL (a port out of range,
    a host it cannot parse, a database that is not a number, a wildcard address); this client
    refuses the same URLs, so both languages still take or refuse one file alike."""
    for url in ["redis://u:hunter2@h:99999", "redis://h ost:1", "redis://[::1:1", "redis://h:1/zero",
                "redis://0.0.0.0:6379", "redis://[::]:1", "redis://h:1?protocol=9", "redis://u:p%ff@h:1",
                "unix://host/tmp/x", "unix:///tmp/x?db=one"]:
        assert _problem_keys(f'[redis]\nurl = "{url}"\n') == ["redis.url"], url
        assert _problem_keys(f'[redis]\ncluster_urls = ["{url.replace("unix", "redis")}"]\n') \
            == ["redis.cluster_urls[0]"], url
    for url in ["redis://h:1/+3", "redis://u:p@[::1]:1", "rediss://h:1?protocol=resp3", "unix:///tmp/x?db=2"]:
        assert Config.from_toml(f'[redis]\nurl = "{url}"\n').redis.url == url
    with pytest.raises(ConfigError) as e:
        Config().apply_env({"FLEET_BUDGET_REDIS_URL": "redis://u:hunter2@h:99999"})
    assert "hunter2" not in str(e.value) and e.value.problems[0].key == "FLEET_BUDGET_REDIS_URL"


@pytest.mark.parametrize("escape, code", [("\\u202e", "U+202E"), ("\\u200b", "U+200B"), ("\\u00a0", "U+00A0")])
def test_an_amqp_prefix_that_would_print_as_another_is_refused_as_rust_refuses_it(escape, code):
    # The Rust WorkerConfig's rule and text (crates/fleet-budget-amqp/src/config/mod.rs): the prefix
    # starts every queue and exchange name the tools print.
    with pytest.raises(ConfigError) as e:
        Config.from_toml(f'[amqp]\nprefix = "fl{escape}eet"\n')
    (problem,) = e.value.problems
    assert problem.key == "amqp.prefix"
    assert f"contains {code}" in str(e.value)
    assert "must be 1 to 100 bytes without spaces, control, bidirectional control or invisible" in str(e.value)
    assert Config.from_toml('[amqp]\nprefix = "shop"\n').amqp_prefix == "shop"
