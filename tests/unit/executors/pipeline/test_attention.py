"""The attention policy: what each choice resolves to, the MATH guard, and the SageAttention 1.x
backend (with a stand-in `sageattention` module, since it needs CUDA and Triton)."""

from __future__ import annotations

import sys
import types

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from h3core.executors.pipeline.attention import (  # noqa: E402
    AttentionError,
    AttentionRefused,
    install,
    resolve,
    sage_triton_attention,
)


def qkv(seq: int = 40):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 2, seq, 16, generator=g) for _ in range(3)]


def test_each_choice_resolves_to_a_named_kernel_on_a_cpu():
    assert resolve("auto", "cpu").describe() == "native (asked auto; sdpa flash,efficient,cudnn; math up to 4096 tokens)"
    assert resolve("flash", "cpu").sdpa == ("FLASH_ATTENTION",)
    assert resolve("efficient", "cpu", math_max_tokens=7).describe().endswith("math up to 7 tokens)")


def test_sage_is_refused_where_it_cannot_run_and_nonsense_is_named():
    with pytest.raises(AttentionError, match="needs a CUDA device"):
        resolve("sage", "cpu")
    with pytest.raises(AttentionError, match="one of auto, sage, flash, efficient, native"):
        resolve("fastest", "cpu")


def test_the_guard_refuses_math_above_the_limit_and_allows_it_below():
    plan = resolve("efficient", "cpu", math_max_tokens=32)  # CPU SDPA has no memory-efficient kernel
    q, k, v = qkv(40)
    with pytest.raises(AttentionRefused, match="40-token sequence .* only up to 32 tokens"):
        with plan.guard(40):
            F.scaled_dot_product_attention(q, k, v)
    with plan.guard(32):
        F.scaled_dot_product_attention(q, k, v)  # MATH, admitted because the sequence is short


def test_the_guard_does_not_swallow_other_errors():
    with pytest.raises(RuntimeError, match="shape"):
        with resolve("auto", "cpu").guard(10):
            raise RuntimeError("shape mismatch")


def test_the_sage_1x_backend_passes_diffusers_layout_to_sageattn(monkeypatch):
    calls = []

    def sageattn(q, k, v, tensor_layout, is_causal, sm_scale):
        calls.append(tensor_layout)
        assert tensor_layout == "NHD"  # (batch, sequence, heads, dim), as diffusers hands them over
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=sm_scale)
        return out.transpose(1, 2)

    monkeypatch.setitem(sys.modules, "sageattention", types.SimpleNamespace(sageattn=sageattn))
    q, k, v = (t.transpose(1, 2) for t in qkv(24))  # to diffusers' layout
    expected = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
    assert torch.allclose(sage_triton_attention(q, k, v), expected, atol=1e-6) and calls == ["NHD"]
    with pytest.raises(ValueError, match="no attention mask"):
        sage_triton_attention(q, k, v, attn_mask=torch.ones(1))


def test_install_guards_the_forward_once_and_keeps_its_signature():
    import inspect

    class Model(torch.nn.Module):
        def forward(self, hidden_states, encoder_hidden_states=None, extra=1):
            q = hidden_states[:, None]
            return F.scaled_dot_product_attention(q, q, q)

        def set_attention_backend(self, name):
            self.backend = name

    model = Model()
    plan = resolve("efficient", "cpu", math_max_tokens=10)
    install(model, plan)
    install(model, plan)  # again: wraps the original, not the guard
    assert model.backend == "native"
    assert list(inspect.signature(model.forward).parameters) == ["hidden_states", "encoder_hidden_states", "extra"]
    model(torch.randn(1, 8, 16))  # 8 tokens: MATH allowed
    assert model._h3_tokens == 8
    with pytest.raises(AttentionRefused):
        model(torch.randn(1, 12, 16))
