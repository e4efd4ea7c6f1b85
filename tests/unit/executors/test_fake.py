import pytest

from h3core.executors.base import ExecutorFailure, classify
from h3core.executors.fake import FakePlan, OutOfMemoryError


def test_plans_parse_from_prompt_directives():
    plan = FakePlan.parse("step=0.5 fail_at=3 kind=oom fail_attempts=1 no_result")
    assert plan == FakePlan(step_seconds=0.5, fail_at=3, kind="oom", fail_attempts=1, no_result=True)


@pytest.mark.parametrize("text", ["bogus=1", "kind=gremlins", "fail_at=x"])
def test_bad_directives_are_refused(text):
    with pytest.raises(ValueError):
        FakePlan.parse(text)


def test_classify_recognises_oom_the_way_torch_raises_it():
    assert classify(OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))[0] == "oom"
    assert classify(MemoryError())[0] == "oom"
    cpu = RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate 2147483648 bytes.")
    assert classify(cpu)[0] == "oom"
    kind, message, _ = classify(ValueError("bad shape"))
    assert (kind, message) == ("executor_error", "ValueError: bad shape")
    assert classify(ExecutorFailure("executor_lost", "gone", "rank 1"))[0:3] == ("executor_lost", "gone", "rank 1")
