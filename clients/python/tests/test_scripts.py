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
    p = BudgetPolicy(window_secs=60, ratio=0.2, min_allowance=10, deposit="request", mode="fixed")
    assert scripts.spend_args(p) == ["60000", "0.2", "10", "a", "fixed"]
    assert scripts.deposit_args(p, 3, 4) == ["60000", "3", "4", "0.2", "10", "a", "fixed"]
    assert scripts.keys("fb", "search") == ["fb:v1:{search}"]


def test_malformed_replies_are_errors():
    for bad in [None, b"x", [], [1] * 13, [1, -5] + [1] * 12, [1, 5, 1, 0] + [1] * 10, [1, b"2"] + [1] * 12]:
        try:
            scripts.parse_reply("spend", bad)
        except scripts.BadReply:
            continue
        raise AssertionError(f"accepted {bad!r}")
    granted, snap = scripts.parse_reply("spend", [1, 10, 7, 1000, 5, 995, 1, 2, 3, 4, 5, 6, 7, 8])
    assert granted == 1 and snap.allowance == 10 and snap.previous.denied == 8
