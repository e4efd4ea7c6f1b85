"""The one retry with backoff (h3core.adapters.backoff): its schedule, its limit counted from the
first failure, what it tries again and what passes at once (cancellation always)."""

from __future__ import annotations

import itertools

import anyio
import pytest

from h3core.adapters.backoff import Backoff, retry

pytestmark = pytest.mark.anyio


class Down(Exception):
    pass


def test_the_pauses_double_from_the_first_up_to_the_longest_and_never_overflow():
    backoff = Backoff(first_s=0.05, longest_s=2.0)
    assert [backoff.pause(n) for n in range(1, 9)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    assert list(itertools.islice(backoff.pauses(), 8)) == [backoff.pause(n) for n in range(1, 9)]
    assert backoff.pause(100_000) == 2.0  # a call retried forever


async def test_a_call_is_tried_again_until_it_answers_each_retry_told_with_its_pause():
    calls, told = 0, []

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 4:
            raise Down(f"down {calls}")
        return "up"

    answer = await retry(
        flaky,
        Backoff(0.01, 0.02),
        retry_if=lambda exc: isinstance(exc, Down),
        on_retry=lambda exc, tries, pause: told.append((str(exc), tries, pause)),
    )
    assert answer == "up" and calls == 4
    assert told == [("down 1", 1, 0.01), ("down 2", 2, 0.02), ("down 3", 3, 0.02)]


async def test_past_the_limit_from_the_first_failure_give_up_is_raised_from_the_last_failure():
    calls, pauses = 0, []

    async def down() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            await anyio.sleep(0.3)  # a slow first failure: the limit is counted from its end
        raise Down(f"down {calls}")

    backoff = Backoff(0.05, 10.0, limit_s=0.4, jitter=0.0)
    with pytest.raises(RuntimeError, match=r"gave up after \d+ tries: down \d+") as raised:
        await retry(
            down,
            backoff,
            retry_if=lambda exc: isinstance(exc, Down),
            on_retry=lambda exc, tries, pause: pauses.append(pause),
            give_up=lambda exc, tries: RuntimeError(f"gave up after {tries} tries: {exc}"),
        )
    assert isinstance(raised.value.__cause__, Down) and str(raised.value.__cause__) == f"down {calls}"
    # The pauses follow the schedule (0.05, 0.1, 0.2, ...), the last one cut to the time left: all
    # of them fit in the limit, however slow the machine (uncut, they would reach 0.75 s). Only the
    # schedule's figures are checked, never a clock's.
    assert pauses and all(p <= backoff.pause(n) for n, p in enumerate(pauses, start=1))
    assert sum(pauses) <= backoff.limit_s + 1e-9 and calls == len(pauses) + 1


async def test_a_failure_not_named_passes_at_once_and_without_give_up_the_last_failure_is_raised():
    calls = 0

    async def broken() -> None:
        nonlocal calls
        calls += 1
        raise (Down("down") if calls < 3 else ValueError("a bug"))

    with pytest.raises(ValueError, match="a bug"):
        await retry(broken, Backoff(0.01, 0.01), retry_if=lambda exc: isinstance(exc, Down))
    assert calls == 3

    calls = 0
    with pytest.raises(Down):
        await retry(broken, Backoff(0.01, 0.01, limit_s=0.0), retry_if=lambda exc: isinstance(exc, Down))
    assert calls == 1


async def test_cancellation_is_never_retried_whatever_retry_if_says():
    calls, told = 0, []

    async def slow() -> None:
        nonlocal calls
        calls += 1
        await anyio.sleep(10)

    def gave_up(exc: Exception, tries: int) -> BaseException:
        return RuntimeError("gave up")

    for limit_s in (None, 0.0):  # past the limit, give_up is not raised in its place either
        with anyio.move_on_after(0.1) as scope:
            await retry(
                slow,
                Backoff(0.01, 0.01, limit_s),
                retry_if=lambda exc: True,
                on_retry=lambda exc, tries, pause: told.append(exc),
                give_up=gave_up,
            )
        assert scope.cancelled_caught
    assert calls == 2 and told == []

    with anyio.move_on_after(0.1) as scope:  # cancelled in a pause
        await retry(_always_down, Backoff(10.0, 10.0), retry_if=lambda exc: True)
    assert scope.cancelled_caught


async def _always_down() -> None:
    raise Down("down")


def test_jitter_cuts_each_pause_by_up_to_its_fraction_and_varies_it():
    b = Backoff(first_s=1.0, longest_s=8.0, jitter=0.5)
    pauses = [b.pause(3) for _ in range(200)]
    assert all(2.0 <= p <= 4.0 for p in pauses) and len(set(pauses)) > 1
    assert {Backoff(first_s=1.0, longest_s=8.0).pause(3) for _ in range(5)} == {4.0}  # none by default
