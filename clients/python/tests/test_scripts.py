"""The scripts shipped in the package are the repository's ``lua/*.lua``, byte for byte."""

from conftest import REPO

from fleet_budget import BudgetPolicy, scripts


def test_shipped_scripts_are_the_repositorys():
    for name in scripts.NAMES:
        shipped = scripts.text(name)
        source = (REPO / "lua" / f"{name}.lua").read_text(encoding="utf-8")
        assert shipped == source, (
            f"clients/python/src/fleet_budget/lua/{name}.lua differs from lua/{name}.lua: "
            f"cp lua/{name}.lua clients/python/src/fleet_budget/lua/")


def test_arguments_follow_the_readme():
    p = BudgetPolicy(window_ms=60_000, ratio=0.2, min_allowance=10, deposit="request", mode="fixed")
    assert scripts.spend_args(p) == ["60000", "0.2", "10", "a", "fixed"]
    assert scripts.deposit_args(p, 3, 4) == ["60000", "3", "4", "0.2", "10", "a", "fixed"]
    # The denials answered in the process go last (ARGV 8, since 0.2.0), only when there are some.
    assert scripts.deposit_args(p, 3, 4, 0) == ["60000", "3", "4", "0.2", "10", "a", "fixed"]
    assert scripts.deposit_args(p, 0, 0, 7) == ["60000", "0", "0", "0.2", "10", "a", "fixed", "7"]
    assert scripts.keys("fb", "search") == ["fb:v1:{search}"]


def test_the_ratio_is_spelled_as_rust_spells_it():
    # Rust's f64 Display: the scripts compare the text, so "1.0" would be another policy than "1".
    for ratio, text in [(0.2, "0.2"), (1.0, "1"), (10.0, "10"), (0.1, "0.1"), (1e-7, "0.0000001"), (0.0, "0")]:
        assert scripts.ratio_text(ratio) == text


CALLER = BudgetPolicy(window_ms=1000, ratio=0.5, min_allowance=3, mode="fixed")
IN_FORCE = (b"0.2", 10, b"s", b"sliding")


def reply(*ints, tail=(1, 1, 0, *IN_FORCE)):
    return [*ints, *tail]


def test_malformed_replies_are_errors():
    good = (1, 10, 7, 1000, 5, 995, 1, 2, 3, 4, 5, 6, 7, 8)
    for bad in [None, b"x", [], reply(*[1] * 13), reply(*[1] * 13, tail=(0, 1, 0)),
                reply(1, -5, *good[2:]), reply(1, 5, 1, 0, *good[4:]),
                reply(1, b"2", *good[2:]), reply(*good, tail=(1, 0, 0, b"nan", 10, b"s", b"sliding")),
                reply(*good, tail=(1, 0, 0, b"0.2", 10, b"x", b"sliding")),
                reply(*good, tail=(1, 0, 0, b"0.2", 10, b"s", 5)),
                reply(*good, tail=(1, 0, 0, b"0.2", -1, b"s", b"sliding")),
                # the policy in force left out: only without a conflict, and then with the caller's window
                reply(*good, tail=(1, 0, 0)), reply(1, 10, 7, 2000, *good[4:], tail=(0, 0, 0))]:
        try:
            scripts.parse_reply("spend", bad, CALLER)
        except scripts.BadReply:
            continue
        raise AssertionError(f"accepted {bad!r}")
    granted, snap, policy = scripts.parse_reply("spend", reply(*good), CALLER)
    assert granted == 1 and snap.allowance == 10 and snap.previous.denied == 8
    assert snap.control.frozen and snap.control.conflict
    assert policy == BudgetPolicy(window_ms=1000, ratio=0.2, min_allowance=10)


def test_without_a_conflict_the_policy_in_force_is_the_callers():
    good = (0, 10, 7, 1000, 5, 0, 1, 2, 3, 4, 5, 6, 7, 8)
    granted, snap, policy = scripts.parse_reply("spend", reply(*good, tail=(0, 0, 0)), CALLER)
    assert granted == 0 and policy == CALLER and not snap.control.conflict
    assert snap.current.retries == 3 and snap.previous_weight_ms == 0
