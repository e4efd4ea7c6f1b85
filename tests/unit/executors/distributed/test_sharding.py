"""The two diffusers 0.42.1 rough edges that `sharding` works around on a CPU. Each test fails
when its workaround is no longer needed (diffusers fixed it: remove the workaround) or no longer
works."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers", reason="the pipeline extra is not installed")

import torch.distributed as dist  # noqa: E402

from h3core.executors.distributed import sharding  # noqa: E402
from h3core.executors.pipeline.tiny import TRANSFORMER  # noqa: E402
from tests.unit.executors.distributed.gather_case import gather_case  # noqa: E402
from tests.unit.executors.distributed.spawned import run_ranks  # noqa: E402


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_diffusers_still_takes_the_device_index_modulo_zero_accelerators_on_a_cpu(one_rank_group):
    from diffusers import ContextParallelConfig, MiniMaxH3Transformer3DModel

    assert torch.accelerator.device_count() == 0  # the case: a machine without an accelerator
    model = MiniMaxH3Transformer3DModel(**TRANSFORMER)
    with pytest.raises(ZeroDivisionError):  # if this stops raising, drop sharding._resolved_on
        model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=2, ulysses_anything=True))
    # That the workaround works is shown by the two-rank Ulysses runs in tests/integration/distributed.


@pytest.mark.slow  # two spawned ranks, each importing torch
def test_gloo_refuses_uneven_all_gather_and_the_padded_gather_trims_back(tmp_path):
    got = run_ranks(gather_case, tmp_path / "store", timeout_s=300)  # a bound on a loaded machine, not a measure
    assert [g[0] for g in got] == [0, 1]
    for _rank, plain, shape, column in got:
        assert "invalid tensor size" in plain, f"gloo now gathers uneven shards ({plain}): drop install_gloo_gather"
        assert tuple(shape) == (2, 7, 4)
        assert column == [0.0] * 3 + [1.0] * 4


def test_the_gloo_gather_replaces_diffusers_once():
    from diffusers.hooks import context_parallel

    original = context_parallel._all_gather_anything
    try:
        sharding.install_gloo_gather()
        sharding.install_gloo_gather()
        assert context_parallel._all_gather_anything is sharding._padded_all_gather
    finally:
        context_parallel._all_gather_anything = original
