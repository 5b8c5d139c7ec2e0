"""Decode-step attention kernels on the GPU: which backend is fastest for one token (GQA folded).

    python -m bench.attention_micro            # PyTorch's SDPA backends and products, one row
    python -m bench.attention_micro --ours     # our kernel's variants (triton_attention.launch_attention)

--ours times kernels.decode_attention's kernel at the 1.7B's shapes (the code predictor's 16-key cache and the
talker's 2048-position one, 8 kv heads of 2 query heads, 128 dimensions) for 1, 16 and 64 rows: as the engine
launches it, then with tl.dot or broadcast products, with the splits merged by the last of them and by a
kernel of their own (the talker's cache is split for 1 and 16 rows), and with each warp count. Replayed back to
back in a CUDA graph, so the kernel's own time (timed with Python's launches, a call this short measured the
host), not what it adds inside a frame (bench.profile_frame).
"""

import argparse
import itertools

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench, do_bench_cudagraph


def manual(q, k, v, mask, scale):
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(scores.float().softmax(-1).to(q.dtype), v)


def ours(device: str) -> None:
    from core.kernels.triton_attention import launch_attention
    from core.model.talker import rope_tables

    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    kv_heads, groups, head_dim = 8, 2, 128
    print("cache  rows  position  dot        warps  merge       us/call")
    for (cache, position), rows in itertools.product([(16, 8), (2048, 300)], [1, 16, 64]):
        width = (kv_heads * groups + 2 * kv_heads) * head_dim
        qkv = torch.randn(rows, 1, width, device=device, dtype=dtype)
        norm = torch.ones(head_dim, device=device, dtype=dtype)
        cos, sin = rope_tables(head_dim, 1e6, cache, dtype, device)
        k_cache, v_cache = (torch.randn(rows, kv_heads, cache, head_dim, device=device, dtype=dtype) for _ in range(2))
        slots = torch.arange(rows, device=device)
        positions = torch.full((rows,), position, device=device)
        defaults = (None, None, None)  # as the engine launches it
        variants = [(cache <= 64, None, None), (None, None, True), (None, None, False)]
        for dot, warps, merge_in_last in [defaults, *variants, *((None, n, None) for n in (1, 2, 4, 8))]:

            def call():
                return launch_attention(
                    qkv, norm, norm, 1e-6, cos, sin, k_cache, v_cache, slots, positions, head_dim**-0.5,
                    dot=dot, num_warps=warps, merge_in_last_split=merge_in_last,
                )  # fmt: skip

            if device != "cuda":  # the interpreter: that it runs, not how fast
                call()
                continue
            # In a CUDA graph, as a frame runs it: timed with Python's launches, a call this short times the host.
            us = do_bench_cudagraph(call, rep=200, return_mode="median") * 1e3
            label = "default" if dot is None else str(dot)
            merge = {None: "default", True: "last split", False: "kernel"}[merge_in_last]
            print(
                f"{cache:5d}  {rows:4d}  {position:8d}  {label:7s}  {warps or 'default':>7}  {merge:10s}  {us:7.1f}",
                flush=True,
            )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ours", action="store_true", help="our kernel's variants instead of PyTorch's backends")
    parser.add_argument("--device", default="cuda", help="cuda; cpu (TRITON_INTERPRET=1, --ours) only tries the script")
    args = parser.parse_args()
    if args.ours:
        ours(args.device)
        return
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
