"""A cancellation a call swallowed still ends the asyncio flavour's loop tasks (the registry's
writer, the deposits' flusher): a CI run's ``asyncio.run`` waited 30 minutes in its shutdown for
a writer that went on beating after its cancel."""

import asyncio

import pytest

from fleet_budget import registry


def test_a_swallowed_cancel_still_ends_a_loop_task():
    async def loop(seen: list[str]) -> None:
        while True:
            registry.raise_if_cancelled()
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                seen.append("swallowed")  # as a call that drops the cancel would

    async def main() -> list[str]:
        seen: list[str] = []
        task = asyncio.create_task(loop(seen))
        await asyncio.sleep(0.05)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=5)
        assert done, "the task went on after its cancel"
        with pytest.raises(asyncio.CancelledError):
            task.result()
        return seen

    assert asyncio.run(main()) == ["swallowed"]


def test_a_task_never_cancelled_goes_on():
    async def main() -> None:
        registry.raise_if_cancelled()  # in a task, not cancelled: nothing

    asyncio.run(main())
