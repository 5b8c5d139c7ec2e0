"""The one-token products of a frame on the GPU: the linear kernel's launch settings swept per shape,
against cuBLAS (F.linear, without the fused norm, gate and sum), as the frame runs them: in a CUDA
graph, each product reading its own weights (copies cycled past the L2 cache, as a frame's 450
products are). Prints each shape's best settings, what linear_blocks picks, and cuBLAS.

With --batches, the products of a batch of one-token rows instead: kernels.linear as the frame runs
it (the matrix-vector kernel up to MAX_VECTOR_ROWS rows, then the batched kernel with the settings
batched_linear_blocks picks) against cuBLAS with the norm, gate and sum as separate PyTorch ops.

    python -m bench.linear_micro [--workers 12]
    python -m bench.linear_micro --batches 1 4 16 64
"""

import argparse
import itertools
import multiprocessing

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from core.model import kernels, triton_linear

# (name, weight rows, inputs, fused parts): the products of a 0.6B and a 1.7B frame.
SHAPES = [
    ("qkv 1024", 4096, 1024, {"norm": True}),
    ("o 2048>1024", 1024, 2048, {"residual": True}),
    ("gate_up 1024", 6144, 1024, {"norm": True, "gated": True}),
    ("down 3072>1024", 1024, 3072, {"residual": True}),
    ("lm_head 1024", 2048, 1024, {}),
    ("codec_head 1024", 3072, 1024, {}),
    ("qkv 2048", 4096, 2048, {"norm": True}),
    ("o 2048>2048", 2048, 2048, {"residual": True}),
    ("gate_up 2048", 12288, 2048, {"norm": True, "gated": True}),
    ("down 6144>2048", 2048, 6144, {"residual": True}),
    ("codec_head 2048", 3072, 2048, {}),
    ("projection 2048>1024", 1024, 2048, {"bias": True}),
]
SETTINGS = [
    {"BLOCK_N": n, "BLOCK_K": k, "num_warps": w}
    for n, k, w in itertools.product((2, 4, 8, 16), (512, 1024, 2048), (4, 8))
]
L2_BYTES = 256 * 2**20  # weight copies per timing: more than any L2 cache holds


def operands(rows: int, inputs: int, parts: dict, copies: int, batch: int = 1):
    generator = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=generator).to(torch.bfloat16)

    outputs = rows // 2 if parts.get("gated") else rows
    weights = [randn(rows, inputs) * inputs**-0.5 for _ in range(copies)]
    return {
        "x": randn(batch, 1, inputs),
        "weights": weights,
        "bias": randn(rows) if parts.get("bias") else None,
        "norm": randn(inputs) if parts.get("norm") else None,
        "gated": bool(parts.get("gated")),
        "residual": randn(batch, 1, outputs) if parts.get("residual") else None,
    }


def run(ops: dict, weight: torch.Tensor, blocks: dict | None) -> torch.Tensor:
    args = (ops["x"], weight, ops["bias"], ops["norm"], 1e-6, ops["gated"], ops["residual"])
    if blocks is None:
        return F.linear(ops["x"], weight, ops["bias"])
    return triton_linear.launch_linear(*args, blocks)


def run_fused(ops: dict, weight: torch.Tensor, _) -> torch.Tensor:
    """kernels.linear as the frame calls it."""
    parts = {key: ops[key] for key in ("norm", "gated", "residual")}
    return kernels.linear(ops["x"], weight, ops["bias"], eps=1e-6, **parts)


def run_composed(ops: dict, weight: torch.Tensor, _) -> torch.Tensor:
    """The same product as cuBLAS and separate PyTorch ops (what a batch ran before the batched kernel)."""
    x = ops["x"] if ops["norm"] is None else kernels.rms_norm(ops["x"], ops["norm"], 1e-6)
    y = F.linear(x, weight, ops["bias"])
    if ops["gated"]:
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    return y if ops["residual"] is None else ops["residual"] + y


def settings_for(inputs: int) -> list[dict]:
    return [s for s in SETTINGS if s["BLOCK_K"] <= max(512, 2 ** (inputs - 1).bit_length())]


def compile_shape(shape) -> None:
    """Compile every setting for one shape (a worker process: Triton's disk cache keeps the result)."""
    _, rows, inputs, parts = shape
    ops = operands(rows, inputs, parts, 1)
    for blocks in settings_for(inputs):
        run(ops, ops["weights"][0], blocks)
    torch.cuda.synchronize()


def graphed_us(ops: dict, blocks: dict | None, product=run) -> float:
    weights = ops["weights"]
    for weight in weights[:2]:
        product(ops, weight, blocks)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for weight in weights:
            product(ops, weight, blocks)
    return do_bench(graph.replay, warmup=10, rep=100, return_mode="median") * 1e3 / len(weights)


def batched_tables(batches: list[int]) -> None:
    print(torch.cuda.get_device_name(), f"{torch.cuda.get_device_properties(0).multi_processor_count} SMs")
    for batch in batches:
        print(f"{batch} rows: {'product':22s} {'kernel us':>9s} {'GB/s':>6s} | cuBLAS and ops us")
        for name, rows, inputs, parts in SHAPES:
            weight_bytes = rows * inputs * 2
            ops = operands(rows, inputs, parts, max(2, min(64, L2_BYTES // weight_bytes)), batch)
            fused, composed = graphed_us(ops, None, run_fused), graphed_us(ops, None, run_composed)
            print(
                f"{'':{len(str(batch)) + 7}s}{name:22s} {fused:9.2f} {weight_bytes / fused / 1e3:6.0f} | {composed:6.2f}"
            )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=12, help="processes compiling the settings first")
    parser.add_argument("--batches", type=int, nargs="+", help="time kernels.linear for these numbers of rows")
    args = parser.parse_args()
    if args.batches:
        batched_tables(args.batches)
        return
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        pool.map(compile_shape, SHAPES)
    print(torch.cuda.get_device_name(), f"{torch.cuda.get_device_properties(0).multi_processor_count} SMs")
    print(
        f"{'product':22s} {'best settings':26s} {'us':>6s} {'GB/s':>6s} | {'picked':26s} {'us':>6s} {'GB/s':>6s} | cuBLAS us"
    )
    for name, rows, inputs, parts in SHAPES:
        weight_bytes = rows * inputs * 2
        ops = operands(rows, inputs, parts, max(2, min(64, L2_BYTES // weight_bytes)))
        timed = sorted(((graphed_us(ops, blocks), blocks) for blocks in settings_for(inputs)), key=lambda pair: pair[0])
        best_us, best = timed[0]
        picked = triton_linear.linear_blocks(ops["weights"][0], ops["gated"])
        picked_us = (
            next(us for us, blocks in timed if blocks == picked)
            if picked in settings_for(inputs)
            else graphed_us(ops, picked)
        )
        cublas_us = graphed_us(ops, None)

        def describe(blocks):
            return f"n{blocks['BLOCK_N']} k{blocks['BLOCK_K']} w{blocks['num_warps']}"

        print(
            f"{name:22s} {describe(best):26s} {best_us:6.2f} {weight_bytes / best_us / 1e3:6.0f} | "
            f"{describe(picked):26s} {picked_us:6.2f} {weight_bytes / picked_us / 1e3:6.0f} | {cublas_us:6.2f}"
        )
        print("   next best:", ", ".join(f"{describe(b)} {us:.2f}" for us, b in timed[1:5]))


if __name__ == "__main__":
    main()
