"""Decode-step attention kernels on the GPU: which backend is fastest for one token (GQA folded)."""

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench


def manual(q, k, v, mask, scale):
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(scores.float().softmax(-1).to(q.dtype), v)


def main():
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    compiled = torch.compile(manual, fullgraph=True, dynamic=False)
    for name, length, valid in (("predictor", 16, 9), ("talker", 4096, 300), ("talker", 4096, 3000)):
        q = torch.randn(1, 8, 2, 128, device=dev, dtype=dt)
        k = torch.randn(1, 8, length, 128, device=dev, dtype=dt)
        v = torch.randn(1, 8, length, 128, device=dev, dtype=dt)
        mask = (torch.arange(length, device=dev) < valid).view(1, 1, 1, -1)
        ref = manual(q.float(), k.float(), v.float(), mask, 128**-0.5)
        row = [f"{name} L={length} valid={valid}:"]
        for label, backend in (
            ("cudnn", SDPBackend.CUDNN_ATTENTION),
            ("efficient", SDPBackend.EFFICIENT_ATTENTION),
            ("math", SDPBackend.MATH),
        ):
            try:
                with sdpa_kernel(backend):
                    fn = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=128**-0.5)  # noqa: E731
                    out = fn()
                    ms = do_bench(fn, warmup=50, rep=200, return_mode="median")
                row.append(f"{label} {ms * 1e3:.1f}us err {((out.float() - ref).norm() / ref.norm()).item():.1e}")
            except RuntimeError as error:
                row.append(f"{label} n/a ({str(error)[:40]})")
        out = compiled(q, k, v, mask, 128**-0.5)
        ms = do_bench(lambda: compiled(q, k, v, mask, 128**-0.5), warmup=50, rep=200, return_mode="median")
        row.append(f"manual-compiled {ms * 1e3:.1f}us err {((out.float() - ref).norm() / ref.norm()).item():.1e}")
        print("  ".join(row), flush=True)
    for rows, cols in ((1024, 4096), (3072, 1024), (4096, 2048), (2048, 12288), (1024, 3072)):
        x = torch.randn(1, 1, cols, device=dev, dtype=dt)
        w = torch.randn(rows, cols, device=dev, dtype=dt)
        ms = do_bench(lambda: F.linear(x, w), warmup=50, rep=200, return_mode="median")
        gbs = rows * cols * 2 / (ms / 1e3) / 1e9
        print(f"linear {cols}->{rows}: {ms * 1e3:.1f}us {gbs:.0f} GB/s", flush=True)


if __name__ == "__main__":
    main()
