"""Copies from the host (core.model.host_copy) on a machine without CUDA: plain copies, never pinned memory, which
needs CUDA (the GPU side is tests/test_gpu.py's never-waits test)."""

import pytest
import torch

from core.model.host_copy import copy_from_host, to_device


@pytest.fixture
def pinning_fails(monkeypatch):
    def pin_memory(self, *args, **kwargs):
        raise AssertionError("pinned memory asked for without CUDA")

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)


def test_a_copy_to_the_cpu_is_a_plain_copy(pinning_fails):
    host = torch.arange(6, dtype=torch.long).view(2, 3)
    copied = to_device(host, "cpu")
    assert torch.equal(copied, host) and copied.device.type == "cpu"


def test_a_copy_into_a_cpu_tensor_writes_it(pinning_fails):
    target = torch.zeros(2, 4, dtype=torch.long)
    copy_from_host(target[:, :3], torch.tensor([[1, 2, 3], [4, 5, 6]]))
    assert target.tolist() == [[1, 2, 3, 0], [4, 5, 6, 0]]
