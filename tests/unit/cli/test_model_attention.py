"""`h3core model attention`: the start-up probe on demand, for a model folder and a device."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from h3core.cli import app

pytest.importorskip("torch")


def test_it_prints_the_table_and_refuses_what_cannot_run(tmp_path):
    (tmp_path / "transformer").mkdir()
    (tmp_path / "transformer" / "config.json").write_text(json.dumps({"num_attention_heads": 2, "attention_head_dim": 32}))
    ok = CliRunner().invoke(app, ["model", "attention", str(tmp_path)])
    assert ok.exit_code == 0, ok.output
    assert "attention: flash (asked auto) on cpu" in ok.output and "| flash | chosen |" in ok.output
    no = CliRunner().invoke(app, ["model", "attention", str(tmp_path), "--attention", "efficient"])
    assert no.exit_code == 2 and "efficient needs a CUDA device, not cpu" in no.output
    empty = CliRunner().invoke(app, ["model", "attention", str(tmp_path / "nothing")])
    assert empty.exit_code == 2 and "cannot read the attention geometry" in empty.output
