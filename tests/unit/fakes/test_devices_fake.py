"""The simulated GPUs (tests/fakes/devices.py) hold torch's placement rules, both ways: what CUDA
refuses raises here, what it allows runs here."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tests.fakes.devices import DeviceMismatch, SimulatedDevices  # noqa: E402


@pytest.fixture
def sim():
    with SimulatedDevices() as s:
        yield s


def test_moving_makes_a_copy_there_and_leaves_the_original(sim):
    a = torch.ones(3)
    b = a.to("cuda:0")
    assert b.device == torch.device("cuda:0") and a.device == torch.device("cpu") and b.is_cuda
    assert b.view(3, 1).device == b.device and b.float().device == b.device  # views and casts stay put
    assert b.cpu().device == torch.device("cpu") and b.to(torch.device("cuda:1")).device == torch.device("cuda:1")
    assert torch.zeros(2, device="cuda:1").device == torch.device("cuda:1")  # factories make it there
    assert b.to(a).device == torch.device("cpu")  # to(other): other's device
    b.add_(1)
    assert a.tolist() == [1.0, 1.0, 1.0]  # a copy, not an alias


def test_an_op_over_two_devices_is_refused_and_a_cpu_scalar_is_not(sim):
    a, b = torch.ones(3), torch.ones(3, device="cuda:0")
    with pytest.raises(DeviceMismatch, match="cpu and cuda:0"):
        a + b
    with pytest.raises(DeviceMismatch):
        torch.cat([b, torch.ones(3, device="cuda:1")])
    assert (b + torch.tensor(2.0)).device == b.device  # a 0-dim CPU tensor is a scalar to CUDA
    assert sim.checked >= 3


def test_indexing_follows_torch_index_and_index_put(sim):
    host, gpu = torch.zeros(5), torch.zeros(5, device="cuda:0")
    cpu_idx, gpu_idx = torch.arange(2), torch.arange(2, device="cuda:0")
    assert gpu[cpu_idx].device == gpu.device and gpu[gpu_idx].device == gpu.device
    with pytest.raises(DeviceMismatch, match="indices should be either on cpu"):
        host[gpu_idx]
    host[gpu_idx] = 1.0  # index_put moves the indices to the tensor's device
    with pytest.raises(DeviceMismatch, match="__setitem__"):
        host[cpu_idx] = torch.ones(2, device="cuda:0")  # the values must be where the tensor is


def test_numpy_needs_the_host_and_copy_crosses_devices(sim):
    gpu = torch.ones(2, device="cuda:0")
    with pytest.raises(TypeError, match="cuda:0 device type tensor to numpy"):
        gpu.numpy()
    host = torch.zeros(2)
    host.copy_(gpu)
    assert host.device == torch.device("cpu") and host.numpy().tolist() == [1.0, 1.0]


def test_a_placed_module_runs_on_its_device_only():
    sim = SimulatedDevices()
    layer = torch.nn.Linear(3, 2)
    sim.place(layer, "cuda:1")
    with sim:
        assert layer(torch.ones(1, 3, device="cuda:1")).device == torch.device("cuda:1")
        with pytest.raises(DeviceMismatch, match="in linear"):
            layer(torch.ones(1, 3))


def test_a_freed_storages_address_reused_by_an_unseen_tensor_is_the_cpus(sim):
    gpu = torch.ones(4, device="cuda:0")
    ptr = gpu.untyped_storage().data_ptr()
    assert sim.device_of(gpu) == "cuda:0" and sim.device_of(gpu.view(2, 2)) == "cuda:0"
    del gpu
    host = torch.from_numpy(__import__("numpy").zeros(4, dtype="float32"))
    # Whatever address it got, a tag whose tensors are all gone never makes a host tensor a GPU one:
    stale = sim._where.get(ptr)
    assert stale is not None and len(stale[1]) == 0
    sim._where[host.untyped_storage().data_ptr()] = stale
    assert sim.device_of(host) == "cpu"
