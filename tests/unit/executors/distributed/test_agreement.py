"""A group's decisions at a step boundary (`SyncedStop`): rank 0 decides whether to stop and whether
to checkpoint the step just done, and every rank gets its decision, whatever its own clock or flag
says; one rank alone decides for itself."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers", reason="the pipeline extra is not installed")

from h3core.executors.distributed.rank import SyncedStop  # noqa: E402
from tests.unit.executors.distributed.agree_case import OFFERS, agree_case  # noqa: E402
from tests.unit.executors.distributed.spawned import run_ranks  # noqa: E402


def test_one_rank_decides_for_itself_and_times_the_checkpoints_it_agrees_to():
    synced = SyncedStop(0, 1, torch.device("cpu"))
    assert synced.agree(False, False) == (False, False) and synced.agreed_at == 0.0
    assert synced.agree(True, True) == (True, True) and synced.agreed_at > 0


@pytest.mark.slow  # two spawned ranks, each importing torch
def test_every_rank_gets_rank_0s_decision_whatever_it_offered(tmp_path):
    got = dict(run_ranks(agree_case, tmp_path / "store"))
    expected = [(stop, save, save) for (stop, save), _ in OFFERS]  # rank 0's; a checkpoint's agreement is timed
    assert got == {0: expected, 1: expected}
