"""The attention kernels: where each runs (both ways), the one-kernel guard, installing a plan, and
the SageAttention backend (with stand-in functions: the real ones need CUDA)."""

from __future__ import annotations

import inspect
import sys
import types

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from h3core.executors.pipeline import attention  # noqa: E402
from h3core.executors.pipeline.attention import (  # noqa: E402
    CHOICES,
    KERNELS,
    AttentionError,
    AttentionPlan,
    AttentionRefused,
    SageBuild,
    Target,
    install,
    plan_for,
    sage_backend,
)

H200 = Target("cuda:0", "bfloat16", 56, 128, (9, 0), "NVIDIA H200")
TURING = Target("cuda:0", "float16", 56, 128, (7, 5), "NVIDIA GeForce RTX 2080 Ti")
ADA = Target("cuda:0", "bfloat16", 56, 128, (8, 9), "NVIDIA L40S")
CPU = Target("cpu", "float32", 56, 128)
SAGE2 = SageBuild(
    "2.2.0",
    {
        n: print
        for n in ("sageattn", "sageattn_qk_int8_pv_fp16_cuda", "sageattn_qk_int8_pv_fp8_cuda", "sageattn_qk_int8_pv_fp16_triton")
    },
)
SAGE1 = SageBuild("1.0.6", {"sageattn": print})
SM75_BUILD = SageBuild("2.1.1+sm75", {"sageattn_qk_int8_pv_fp16_cuda": print})  # the community build: fp16 PV only


def runs(kernel: str, target: Target, sage: SageBuild = SAGE2) -> bool:
    return KERNELS[kernel].unsupported(target, sage) is None


def test_on_an_h200_every_kernel_runs_given_a_sageattention_2_build():
    assert [k for k in KERNELS if runs(k, H200)] == list(KERNELS)
    assert runs("sage-triton", H200, SAGE1)  # 1.x: its sageattn is the Triton kernel
    assert not runs("sage-fp16", H200, SAGE1)  # 1.x has no CUDA kernels


@pytest.mark.parametrize(
    ("kernel", "why"),
    [
        ("cudnn", "cudnn needs compute capability sm_80 or newer; NVIDIA GeForce RTX 2080 Ti is sm_75"),
        ("flash", "sm_80"),
        ("sage-fp8", "sm_89"),
        ("sage-triton", "sm_80"),
    ],
)
def test_on_the_2080_ti_the_sm80_kernels_are_refused_by_name(kernel, why):
    assert why in KERNELS[kernel].unsupported(TURING, SM75_BUILD)


def test_on_the_2080_ti_the_deployments_sage_fp16_efficient_and_math_run():
    assert [k for k in KERNELS if runs(k, TURING, SM75_BUILD)] == ["efficient", "sage-fp16", "math"]
    assert runs("sage-fp8", ADA)


def test_dtypes_are_each_kernels_own():
    fp32 = Target("cuda:0", "float32", 56, 128, (9, 0), "NVIDIA H200")
    assert [k for k in KERNELS if runs(k, fp32)] == ["efficient", "math"]  # SageAttention 2 asserts fp16/bf16
    assert "takes bfloat16/float16 on cuda, not float32" in KERNELS["flash"].unsupported(fp32)
    half_cpu = Target("cpu", "bfloat16", 2, 32)
    assert [k for k in KERNELS if runs(k, half_cpu)] == ["flash", "math"]


def test_head_dims_are_each_kernels_own():
    tiny = Target("cuda:0", "bfloat16", 2, 32, (9, 0), "NVIDIA H200")  # the tiny model's head dim
    assert "takes head dims 64/96/128, not 32" in KERNELS["sage-triton"].unsupported(tiny, SAGE1)
    assert "takes head dims 64/128, not 32" in KERNELS["sage-fp16"].unsupported(tiny, SAGE2)
    assert runs("cudnn", tiny) and runs("flash", tiny) and runs("efficient", tiny)
    assert runs("sage-triton", Target("cuda:0", "float16", 8, 96, (8, 0), "A100"), SAGE1)
    wide = Target("cuda:0", "bfloat16", 8, 192, (9, 0), "NVIDIA H200")
    assert "up to 128, not 192" in KERNELS["cudnn"].unsupported(wide) and runs("flash", wide)
    odd = Target("cuda:0", "bfloat16", 8, 36, (9, 0), "NVIDIA H200")
    assert "multiples of 8, not 36" in KERNELS["flash"].unsupported(odd) and runs("math", odd)


def test_on_a_cpu_only_flash_and_math_run_and_the_rest_need_cuda():
    assert [k for k in KERNELS if runs(k, CPU)] == ["flash", "math"]
    for k in ("cudnn", "efficient", "sage-fp16", "sage-fp8", "sage-triton"):
        assert KERNELS[k].unsupported(CPU, SAGE2) == f"{k} needs a CUDA device, not cpu"


def test_a_missing_or_broken_sageattention_is_named_not_raised():
    missing = SageBuild(None, error="sageattention is not installed (pip install 'h3core[sage]', or a local build)")
    assert "not installed" in KERNELS["sage-fp16"].unsupported(H200, missing)
    broken = SageBuild("1.0.6", error="sageattention 1.0.6 does not import: ImportError: no triton")
    assert "does not import" in KERNELS["sage-triton"].unsupported(H200, broken)
    assert "sageattention 1.0.6 has no sageattn_qk_int8_pv_fp16_cuda" in KERNELS["sage-fp16"].unsupported(H200, SAGE1)
    fp8_sm90 = SageBuild("2.2.0", {"sageattn_qk_int8_pv_fp8_cuda_sm90": print})
    assert runs("sage-fp8", H200, fp8_sm90) and not runs("sage-fp8", ADA, fp8_sm90)


def test_sage_build_survives_an_import_that_raises(monkeypatch, tmp_path):
    pkg = tmp_path / "sageattention"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('Triton needs a CUDA driver')\n")
    (tmp_path / "sageattention-1.0.6.dist-info").mkdir()
    (tmp_path / "sageattention-1.0.6.dist-info" / "METADATA").write_text("Name: sageattention\nVersion: 1.0.6\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "sageattention", raising=False)
    attention.sage_build.cache_clear()
    try:
        build = attention.sage_build()
        assert build.version == "1.0.6" and "does not import: RuntimeError: Triton needs a CUDA driver" in build.error
    finally:
        attention.sage_build.cache_clear()


def test_a_plan_is_one_kernel_and_the_start_refuses_one_that_cannot_run():
    plan = plan_for("flash", CPU)
    assert (plan.kernel, plan.describe(), plan.max_tokens) == ("flash", "flash (asked flash)", None)
    math = plan_for("math", CPU, choice="auto", math_max_tokens=77)
    assert math.describe() == "math (asked auto; up to 77 tokens)" and math.max_tokens == 77
    with pytest.raises(AttentionError, match="attention 'efficient' cannot run here: efficient needs a CUDA device"):
        plan_for("efficient", CPU)
    with pytest.raises(AttentionError, match="one of auto, cudnn, flash, efficient, sage-fp16, sage-fp8, sage-triton, math"):
        plan_for("native", CPU)


def qkv(seq: int = 40):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 2, seq, 16, generator=g) for _ in range(3)]


def test_the_guard_runs_only_the_plans_kernel_never_a_fallback():
    q, k, v = qkv(40)
    with AttentionPlan("flash", "auto", "cpu").guard(40):
        F.scaled_dot_product_attention(q, k, v)
    # A plan whose kernel this device lacks raises instead of quietly running MATH (a plan made by hand:
    # plan_for refuses it at start).
    with pytest.raises(
        AttentionRefused, match="kernel efficient cannot take this job's 40-token sequence .* no efficient kernel"
    ):
        with AttentionPlan("efficient", "efficient", "cpu").guard(40):
            F.scaled_dot_product_attention(q, k, v)
    with pytest.raises(AttentionRefused, match="SDPA has no sage-fp16 kernel"):  # a sage plan switches SDPA off
        with AttentionPlan("sage-fp16", "auto", "cuda:0").guard(40):
            F.scaled_dot_product_attention(q, k, v)


def test_math_is_bounded_both_ways():
    plan = AttentionPlan("math", "math", "cpu", math_max_tokens=32)
    q, k, v = qkv(32)
    with plan.guard(32):
        F.scaled_dot_product_attention(q, k, v)
    with pytest.raises(AttentionRefused, match="40-token sequence .* MATH kernel is allowed only up to 32 tokens"):
        with plan.guard(40):
            pass


def test_the_guard_does_not_swallow_other_errors():
    with pytest.raises(RuntimeError, match="shape"):
        with AttentionPlan("flash", "auto", "cpu").guard(10):
            raise RuntimeError("shape mismatch")


def test_attend_runs_the_kernel_as_the_transformer_calls_it():
    q, k, v = (t.transpose(1, 2) for t in qkv(24))  # diffusers' (batch, sequence, heads, dim)
    expected = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v))).transpose(1, 2)
    assert torch.allclose(AttentionPlan("flash", "auto", "cpu").attend(q, k, v), expected, atol=1e-6)


def standin_sage(calls: list):
    def fn(q, k, v, tensor_layout, is_causal, sm_scale):
        calls.append(tensor_layout)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=sm_scale)
        return out.transpose(1, 2)

    return fn


def test_the_sage_backend_passes_diffusers_layout_and_refuses_a_mask():
    calls = []
    backend = sage_backend(standin_sage(calls))
    q, k, v = (t.transpose(1, 2) for t in qkv(24))
    expected = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v))).transpose(1, 2)
    assert torch.allclose(backend(q, k, v), expected, atol=1e-6) and calls == ["NHD"]
    with pytest.raises(ValueError, match="no attention mask"):
        backend(q, k, v, attn_mask=torch.ones(1))


def test_in_a_ulysses_group_the_sage_backend_runs_inside_diffusers_context_parallel_attention(monkeypatch):
    from diffusers.models import attention_dispatch

    seen = {}

    def templated(
        query,
        key,
        value,
        attn_mask,
        dropout_p,
        is_causal,
        scale,
        enable_gqa,
        return_lse,
        *,
        forward_op,
        backward_op,
        _parallel_config,
    ):
        seen["config"] = _parallel_config
        # diffusers calls forward_op on the gathered full sequence with these positional arguments
        return forward_op(
            None,
            query,
            key,
            value,
            attn_mask,
            dropout_p,
            is_causal,
            scale,
            enable_gqa,
            return_lse,
            _save_ctx=False,
            _parallel_config=_parallel_config,
        )

    monkeypatch.setattr(attention_dispatch, "_templated_context_parallel_attention", templated)
    calls = []
    q, k, v = (t.transpose(1, 2) for t in qkv(24))
    out = sage_backend(standin_sage(calls))(q, k, v, _parallel_config="the group's config")
    assert seen["config"] == "the group's config" and calls == ["NHD"] and out.shape == q.shape


def test_install_guards_the_forward_once_keeps_its_signature_and_points_sage_processors(monkeypatch):
    class Processor:
        _attention_backend = None

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = torch.nn.Module()
            self.attn.processor = Processor()

        def forward(self, hidden_states, encoder_hidden_states=None, extra=1):
            q = hidden_states[:, None]
            return F.scaled_dot_product_attention(q, q, q)

        def set_attention_backend(self, name):
            self.backend = name

    model = Model()
    plan = AttentionPlan("math", "math", "cpu", math_max_tokens=10)
    install(model, plan)
    install(model, plan)  # again: wraps the original, not the guard
    assert model.backend == "native"
    assert list(inspect.signature(model.forward).parameters) == ["hidden_states", "encoder_hidden_states", "extra"]
    model(torch.randn(1, 8, 16))
    assert model._h3_tokens == 8
    with pytest.raises(AttentionRefused):
        model(torch.randn(1, 12, 16))

    monkeypatch.setattr(attention, "sage_build", lambda: SageBuild("2.2.0", {"sageattn_qk_int8_pv_fp16_cuda": print}))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    install(model, AttentionPlan("sage-fp16", "auto", "cuda:0"))
    assert model.attn.processor._attention_backend.value == "_sage_qk_int8_pv_fp16_cuda"


def test_detect_names_a_device_torch_cannot_use_here():
    if not torch.cuda.is_available():
        with pytest.raises(AttentionError, match="sees no CUDA device here"):
            Target.detect("cuda", "bfloat16", 56, 128)
    with pytest.raises(AttentionError, match="run on 'cpu' or 'cuda'"):
        Target.detect("meta", "float32", 56, 128)
    assert Target.detect("cpu", "float32", 2, 32).kind == "cpu"


def test_the_stand_in_module_is_not_what_is_imported_on_a_cpu(monkeypatch):
    """A CPU never imports sageattention: every sage kernel is refused on the device before the build is read."""
    boom = types.ModuleType("sageattention")
    monkeypatch.setitem(sys.modules, "sageattention", boom)
    monkeypatch.setattr(attention, "sage_build", lambda: pytest.fail("sageattention was consulted on a CPU"))
    assert [k for k in KERNELS if KERNELS[k].unsupported(CPU) is None] == ["flash", "math"]


def test_the_settings_offer_exactly_these_choices_and_refuse_the_old_names():
    from typing import get_args

    from pydantic import ValidationError

    from h3core.runtime.settings import Settings

    assert get_args(Settings.model_fields["attention"].annotation) == CHOICES
    for old in ("native", "sage"):
        with pytest.raises(ValidationError, match="attention"):
            Settings(attention=old)
