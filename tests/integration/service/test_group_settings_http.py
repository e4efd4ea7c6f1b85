"""Group settings that cannot work stop `h3core serve` before it starts anything (Ray included),
with the setting named. No Ray runs here, so these run with the rest, not in the Ray tests' group."""

from __future__ import annotations

import pytest

pytest.importorskip("diffusers", reason="the pipeline extra is not installed")
pytest.importorskip("ray", reason="the distributed extra is not installed")


def test_group_settings_that_cannot_work_stop_the_server_with_the_setting_named(tmp_path, tiny_model):
    from tests.integration.service.test_client_cli import h3

    env = {"H3_MODEL_DIR": str(tiny_model)}

    def serve(*args: str):
        return h3("serve", "--port", "0", "--db", str(tmp_path / "h3.db"), *args, env=env)

    uneven = serve("--devices", "3", "--group-size", "2")
    assert uneven.returncode == 2 and "group_size: 2 does not divide devices (3)" in uneven.stderr, uneven.stderr
    mixed = serve("--devices", "4", "--group-size", "2,1")
    assert mixed.returncode == 2 and "use 3 devices, but devices is 4" in mixed.stderr, mixed.stderr
    ordinal = serve("--devices", "2", "--device", "cuda:1")
    assert ordinal.returncode == 2 and "device: a group's ranks run on 'cpu' or 'cuda'" in ordinal.stderr, ordinal.stderr
    placed = serve("--devices", "2", "--text-encoder-device", "cuda:1")
    assert placed.returncode == 2 and "text_encoder_device: a group's ranks run on" in placed.stderr, placed.stderr
    slots = serve("--devices", "2", "--group-size", "1", "--slots", "3")
    assert slots.returncode == 2 and "each of the 2 groups is one slot" in slots.stderr, slots.stderr
    budgets = serve("--devices", "2", "--group-budgets", "1:4000")
    assert budgets.returncode == 2 and "group_budgets" in budgets.stderr and "size=tokens" in budgets.stderr, budgets.stderr
