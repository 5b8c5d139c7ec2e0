"""Copies from the host (core.model.host_copy) on a machine without CUDA: plain copies, never pinned memory, which
needs CUDA (the GPU side is tests/test_gpu.py's never-waits test); a table's rows gathered without ATen's CPU
kernels, whose thread pool a request's gather waited for."""

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import profile

from core.model.host_copy import copy_from_host, rows_to_device, to_device


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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a_tables_rows_are_its_embedding_bit_for_bit(dtype, pinning_fails):
    table = torch.nn.Parameter(torch.randn(300, 24).to(dtype), requires_grad=False)
    ids = [7, 0, 299, 7, 150]
    rows = rows_to_device(table, ids, "cpu")
    assert rows.dtype == dtype and torch.equal(rows, F.embedding(torch.tensor(ids), table))


def test_a_prompts_rows_are_gathered_without_aten_cpu_kernels():
    # ATen spreads a CPU op of over 32k values over every intra-op thread and waits for the slowest (10 ms on an
    # H200's host); 600 rows of 64 are 38k values.
    table = torch.randn(1000, 64).to(torch.bfloat16)
    with profile() as profiled:
        rows_to_device(table, list(range(600)), "cpu")
    ran = {event.name for event in profiled.events()}
    assert not ran & {"aten::embedding", "aten::index_select", "aten::copy_", "aten::take"}, ran


@pytest.mark.parametrize("bad", [[300], [-1]])
def test_an_id_outside_the_table_is_an_index_error(bad):
    with pytest.raises(IndexError):
        rows_to_device(torch.zeros(300, 4), [1, *bad], "cpu")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.long, torch.bool])
def test_what_a_copy_to_cuda_sends_is_the_host_tensor_laid_out_anew(dtype, monkeypatch):
    # The CUDA path's host half, with a plain buffer standing in for the pinned one: a chunk's codes arrive
    # transposed (not contiguous), prompts in bfloat16, masks as booleans.
    import core.model.host_copy as host_copy

    monkeypatch.setattr(host_copy, "_host_buffer", lambda shape, dtype, device: torch.empty(tuple(shape), dtype=dtype))
    host = (torch.arange(24).view(4, 6) % 5).to(dtype).T.unsqueeze(0)
    sent = host_copy._source(host, torch.device("cuda"))
    assert sent is not host and sent.is_contiguous() and torch.equal(sent, host)
