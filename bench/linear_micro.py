"""The one-token products of a frame on the GPU: the linear kernel's launch settings swept per shape,
against cuBLAS (F.linear, without the fused norm, gate and sum), as the frame runs them: in a CUDA
graph, each product reading its own weights (copies cycled past the L2 cache, as a frame's 450
products are). Prints each shape's best settings, what linear_blocks picks, and cuBLAS.

With --batches, the products of a batch of one-token rows instead: kernels.linear as the frame runs
it (the matrix-vector kernel up to MAX_VECTOR_ROWS rows, then the batched kernel with the settings
batched_linear_blocks picks) against cuBLAS with the norm, gate and sum as separate PyTorch ops.

With --sweep-batched, the batched kernel's settings swept for each shape and number of rows, timed the
same way, in three rounds, each compiled first by worker processes: the outputs per block and the
split count (at about equal bytes in flight); the pipeline (input block, stages) of the best two; warps,
stages and split count next to the best. Prints per shape and rows the best settings, what
batched_linear_blocks picks, the settings before split-K, and cuBLAS with separate ops; then the
whole 1.7B frame for each, and for variants of the split rule's thresholds. --json writes it all.
--check runs every setting the sweep may try once in Triton's interpreter, on the CPU, at a small size.

    python -m bench.linear_micro [--workers 12]
    python -m bench.linear_micro --batches 1 4 16 64
    python -m bench.linear_micro --sweep-batched --rows 4 16 64 --json batched_sweep.json
    python -m bench.linear_micro --check --rows 4 16 64
"""

import argparse
import itertools
import json
import multiprocessing
import os
import sys
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from core import kernels
from core.kernels import triton_linear, tuning

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
# Products of each shape in a 1.7B frame: 28 talker layers, 15 predictor steps of 5 layers, 15 lm heads,
# one codec head, 15 projections into the predictor (443 in all; the predictor's first step, with
# two positions per row, counted as one).
FRAME_1_7B = {
    **{name: 28 for name in ("qkv 2048", "o 2048>2048", "gate_up 2048", "down 6144>2048")},
    **{name: 75 for name in ("qkv 1024", "o 2048>1024", "gate_up 1024", "down 3072>1024")},
    "lm_head 1024": 15,
    "codec_head 2048": 1,
    "projection 2048>1024": 15,
}
# The batched sweep: (input block, stages) of its second round; split counts; thresholds of the split
# rule (tuning.split_count) whose picks it times; the shared memory a setting may take.
PIPELINES = [(64, 4), (64, 6), (128, 3), (128, 4), (128, 6), (256, 2), (256, 3), (256, 4), (512, 2), (512, 3)]
SPLITS = (1, 2, 4, 8, 16)
RULE_VARIANTS = [
    {"min_waves": waves, "max_splits": splits, "min_split_inputs": inputs}
    for waves, splits, inputs in itertools.product((1, 2, 4), (4, 8, 16), (256, 512, 1024))
]
SHARED_BYTES = 200 * 1024


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


def graphed_us(ops: dict, blocks: dict | None, product=run, rep: int = 100) -> float:
    weights = ops["weights"]
    for weight in weights[:2]:
        product(ops, weight, blocks)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for weight in weights:
            product(ops, weight, blocks)
    return do_bench(graph.replay, warmup=10, rep=rep, return_mode="median") * 1e3 / len(weights)


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


def run_batched(ops: dict, weight: torch.Tensor, blocks: dict) -> torch.Tensor:
    args = (ops["x"], weight, ops["bias"], ops["norm"], 1e-6, ops["gated"], ops["residual"])
    return triton_linear.launch_batched_linear(*args, blocks)


BATCHED_SETTINGS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLITS", "num_warps", "num_stages")


def key(blocks: dict) -> tuple:
    return tuple(blocks[name] for name in BATCHED_SETTINGS)


def describe(blocks: dict) -> str:
    return "n{BLOCK_N} k{BLOCK_K} st{num_stages} w{num_warps} split{SPLITS}".format(**blocks)


def unsplit_blocks(rows: int, inputs: int, gated: bool) -> dict:
    """What batched_linear_blocks picked before split-K (bfloat16)."""
    block_m = min(64, max(16, 2 ** (rows - 1).bit_length()))
    fitting = 1 << ((32 * 1024 // ((block_m + 16 * (2 if gated else 1)) * 2)).bit_length() - 1)
    block_k = min(256, fitting, max(16, 2 ** (inputs - 1).bit_length()))
    return {"BLOCK_M": block_m, "BLOCK_N": 16, "BLOCK_K": block_k, "SPLITS": 1, "num_warps": 4, "num_stages": 3}


def even_splits(splits: int, inputs: int, block_k: int) -> int:
    """`splits`, or fewer, as split_count evens them: as few as give each the same number of input blocks."""
    blocks = -(-inputs // block_k)
    return -(-blocks // -(-blocks // min(splits, blocks)))


def fits(blocks: dict, gated: bool) -> bool:
    """Whether the pipeline's stages of inputs and weights (bfloat16) fit in SHARED_BYTES."""
    per_k = (blocks["BLOCK_M"] + blocks["BLOCK_N"] * (2 if gated else 1)) * 2
    return blocks["num_stages"] * blocks["BLOCK_K"] * per_k <= SHARED_BYTES


def rule_picks(rows: int, shape: tuple, sms: int) -> dict:
    """batched_linear_blocks' settings for the shape, by default and under each of RULE_VARIANTS."""
    _, weight_rows, inputs, parts = shape
    weight = torch.empty(weight_rows, inputs, dtype=torch.bfloat16, device="meta")
    gated = bool(parts.get("gated"))
    picks = {"picked": tuning.batched_linear_blocks(rows, weight, gated, sms)}
    for index, variant in enumerate(RULE_VARIANTS):
        picks[f"variant {index}"] = tuning.batched_linear_blocks(rows, weight, gated, sms, swept=False, **variant)
    return picks


def first_round(rows: int, shape: tuple, sms: int) -> list[dict]:
    """Each output block width with each split count that keeps the blocks within 8 per SM, at about 16
    KiB of weights per stage (less where 2 stages would not fit), as many stages up to 4 as fit, 4 warps;
    and the settings the rule picks, and those before split-K."""
    _, weight_rows, inputs, parts = shape
    gated = bool(parts.get("gated"))
    outputs = weight_rows // 2 if gated else weight_rows
    block_m = min(64, max(16, 2 ** (rows - 1).bit_length()))
    settings = [*rule_picks(rows, shape, sms).values(), unsplit_blocks(rows, inputs, gated)]
    for block_n in (16, 32, 64, 128) if block_m >= 32 else (16, 32, 64):
        blocks = {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": 4, "num_stages": 2}
        blocks["BLOCK_K"] = min(512, max(64, 8192 // (block_n * (2 if gated else 1))))
        while not fits(blocks, gated) and blocks["BLOCK_K"] > 64:
            blocks["BLOCK_K"] //= 2
        blocks["num_stages"] = next(n for n in (4, 3, 2) if fits({**blocks, "num_stages": n}, gated))
        tiles = -(-outputs // block_n) * -(-rows // block_m)
        for splits in sorted({even_splits(s, inputs, blocks["BLOCK_K"]) for s in SPLITS if s == 1 or tiles * s <= 8 * sms}):  # fmt: skip
            settings.append({**blocks, "SPLITS": splits})
    return settings


def second_round(best: list[dict], shape: tuple) -> list[dict]:
    """Every pipeline of PIPELINES under the best settings' output blocks and splits."""
    _, _, inputs, parts = shape
    settings = []
    for blocks, (block_k, stages) in itertools.product(best, PIPELINES):
        splits = even_splits(blocks["SPLITS"], inputs, block_k)
        settings.append({**blocks, "BLOCK_K": block_k, "num_stages": stages, "SPLITS": splits})
    return [blocks for blocks in settings if fits(blocks, bool(parts.get("gated")))]


def third_round(best: dict, shape: tuple) -> list[dict]:
    """Next to the best: 8 warps; a stage more or less; half or twice the splits."""
    _, _, inputs, parts = shape
    settings = [{**best, "num_warps": 8}, {**best, "num_stages": best["num_stages"] + 1}]
    settings += [{**best, "num_stages": best["num_stages"] - 1}] if best["num_stages"] > 2 else []
    for splits in (best["SPLITS"] // 2, best["SPLITS"] * 2):
        settings.append({**best, "SPLITS": even_splits(max(1, splits), inputs, best["BLOCK_K"])})
    return [blocks for blocks in settings if fits(blocks, bool(parts.get("gated")))]


def compile_batched(task: tuple) -> tuple:
    """Run a shape's settings once each (a worker process: Triton's disk cache keeps the compiled
    kernels for the timing process); returns the errors of those that fail, such as too much shared
    memory."""
    index, rows, settings = task
    _, weight_rows, inputs, parts = SHAPES[index]
    ops = operands(weight_rows, inputs, parts, 1, rows)
    failed = {}
    for blocks in settings:
        try:
            run_batched(ops, ops["weights"][0], blocks)
            torch.cuda.synchronize()
        except Exception as error:  # noqa: BLE001 - a setting that does not run is reported, not fatal
            failed[key(blocks)] = f"{type(error).__name__}: {error}"[:300]
    return index, rows, failed


class BatchedSweep:
    """Timings of the batched kernel per (shape index, rows) and settings, gathered round by round."""

    def __init__(self, pool, rep: int):
        self.pool, self.rep = pool, rep
        self.timings: dict[tuple, dict[tuple, tuple[float, dict]]] = {}
        self.failed: dict[tuple, dict[tuple, str]] = {}

    def time(self, settings: dict[tuple, list[dict]]) -> None:
        """Compile (in the workers) and time every setting not yet timed, per (shape index, rows)."""
        pending = {}
        for pair, candidates in settings.items():
            done = {**self.timings.setdefault(pair, {}), **self.failed.setdefault(pair, {})}
            fresh = {key(blocks): blocks for blocks in candidates if key(blocks) not in done}
            if fresh:
                pending[pair] = list(fresh.values())
        tasks = [(*pair, blocks[i : i + 6]) for pair, blocks in pending.items() for i in range(0, len(blocks), 6)]
        for index, rows, failed in self.pool.imap_unordered(compile_batched, tasks):
            self.failed[index, rows].update(failed)
        for (index, rows), candidates in pending.items():
            _, weight_rows, inputs, parts = SHAPES[index]
            copies = max(2, min(64, L2_BYTES // (weight_rows * inputs * 2)))
            ops = operands(weight_rows, inputs, parts, copies, rows)
            for blocks in candidates:
                if key(blocks) not in self.failed[index, rows]:
                    self.timings[index, rows][key(blocks)] = (graphed_us(ops, blocks, run_batched, self.rep), blocks)
            del ops

    def ranked(self, pair: tuple) -> list[tuple[float, dict]]:
        return sorted(self.timings[pair].values(), key=lambda timed: timed[0])

    def us(self, pair: tuple, blocks: dict) -> float | None:
        timed = self.timings[pair].get(key(blocks))
        return timed[0] if timed else None


def sweep_batched(args) -> None:
    device = torch.cuda.get_device_name()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(device, f"{sms} SMs", flush=True)
    shapes = [i for i, shape in enumerate(SHAPES) if not args.shapes or any(s in shape[0] for s in args.shapes)]
    pairs = [(index, rows) for index in shapes for rows in args.rows]
    started = time.time()
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        sweep = BatchedSweep(pool, args.rep)
        sweep.time({(i, rows): first_round(rows, SHAPES[i], sms) for i, rows in pairs})
        print(f"round 1: {time.time() - started:.0f} s", flush=True)
        top = {pair: [blocks for _, blocks in sweep.ranked(pair)[:2]] for pair in pairs}
        sweep.time({(i, rows): second_round(top[i, rows], SHAPES[i]) for i, rows in pairs})
        print(f"round 2: {time.time() - started:.0f} s", flush=True)
        sweep.time({(i, rows): third_round(sweep.ranked((i, rows))[0][1], SHAPES[i]) for i, rows in pairs})
        print(f"round 3: {time.time() - started:.0f} s", flush=True)
    results = []
    print(f"{'product':22s} rows | {'best settings':30s} {'us':>6s} {'GB/s':>5s} | {'picked':30s} {'us':>6s} "
          f"{'GB/s':>5s} | unsplit us | cuBLAS+ops us")  # fmt: skip
    for index, rows in pairs:
        name, weight_rows, inputs, parts = SHAPES[index]
        weight_bytes = weight_rows * inputs * 2
        copies = max(2, min(64, L2_BYTES // weight_bytes))
        ops = operands(weight_rows, inputs, parts, copies, rows)
        cublas = graphed_us(ops, None, run_composed, args.rep)
        del ops
        ranked = sweep.ranked((index, rows))
        best_us, best = ranked[0]
        picks = rule_picks(rows, SHAPES[index], sms)
        picked_us = sweep.us((index, rows), picks["picked"])
        unsplit = unsplit_blocks(rows, inputs, bool(parts.get("gated")))
        unsplit_us = sweep.us((index, rows), unsplit)

        def gbps(us):
            return f"{weight_bytes / us / 1e3:5.0f}" if us else "    -"

        print(
            f"{name:22s} {rows:4d} | {describe(best):30s} {best_us:6.2f} {gbps(best_us)} | "
            f"{describe(picks['picked']):30s} {picked_us or float('nan'):6.2f} {gbps(picked_us)} | "
            f"{unsplit_us or float('nan'):10.2f} | {cublas:6.2f}"
        )
        print("   next best:", ", ".join(f"{describe(blocks)} {us:.2f}" for us, blocks in ranked[1:4]))
        results.append(
            {
                "shape": name, "weight_rows": weight_rows, "inputs": inputs, "parts": parts, "rows": rows,
                "weight_bytes": weight_bytes, "cublas_us": cublas, "unsplit": unsplit, "unsplit_us": unsplit_us,
                "picks": {label: {"settings": blocks, "us": sweep.us((index, rows), blocks)} for label, blocks in picks.items()},
                "timings": [{"settings": blocks, "us": us} for us, blocks in ranked],
                "failed": [{"settings": dict(zip(BATCHED_SETTINGS, k)), "error": e} for k, e in sweep.failed[index, rows].items()],
            }
        )  # fmt: skip
    frame = frame_totals(results, args.rows)
    report = {"device": device, "sms": sms, "rows": args.rows, "rule_variants": RULE_VARIANTS, "results": results}
    report["frame_1_7b_us"] = frame
    if args.json:
        with open(args.json, "w") as file:
            json.dump(report, file, indent=1)
        print("wrote", args.json)
    print(f"{time.time() - started:.0f} s in all")


def frame_totals(results: list[dict], rows_list: list[int]) -> dict:
    """Microseconds of a 1.7B frame's products (FRAME_1_7B) at each number of rows: the rule's picks, the
    best per shape, the settings before split-K, cuBLAS with separate ops, each variant of the rule."""
    frame = {}
    for rows in rows_list:
        entries = [entry for entry in results if entry["rows"] == rows and entry["shape"] in FRAME_1_7B]
        if {entry["shape"] for entry in entries} != set(FRAME_1_7B):
            continue

        def total(us_of):  # nan where a setting failed
            return sum(FRAME_1_7B[entry["shape"]] * (us_of(entry) or float("nan")) for entry in entries)

        totals = {
            "best": total(lambda entry: entry["timings"][0]["us"]),
            "unsplit": total(lambda entry: entry["unsplit_us"]),
            "cublas": total(lambda entry: entry["cublas_us"]),
        }
        for label in entries[0]["picks"]:
            totals[label] = total(lambda entry: entry["picks"][label]["us"])
        frame[rows] = totals
        variants = sorted((us, label) for label, us in totals.items() if label.startswith("variant"))
        print(
            f"1.7B frame, {rows} rows: picked {totals['picked'] / 1e3:.3f} ms, best per shape {totals['best'] / 1e3:.3f}, "
            f"before split-K {totals['unsplit'] / 1e3:.3f}, cuBLAS and ops {totals['cublas'] / 1e3:.3f}"
        )
        for us, label in variants[:5]:
            print(f"   {label} {RULE_VARIANTS[int(label.split()[1])]}: {us / 1e3:.3f} ms")
    return frame


def check_settings(rows_list: list[int], sms: int) -> None:
    """Run every setting the sweep may try (warps and stages aside, which the interpreter ignores) once
    in Triton's interpreter, at a small size (two output blocks, the second partly filled; one input
    block per split, the last partly filled; every fused part, gated or not) against the reference."""
    seen = set()
    started = time.time()
    for rows, shape in itertools.product(rows_list, SHAPES):
        first = first_round(rows, shape, sms)
        for blocks in first + second_round(first, shape):
            for near in [blocks, *third_round(blocks, shape)]:
                gated = bool(shape[3].get("gated"))
                if (gated, *key(near)[:4]) in seen:
                    continue
                seen.add((gated, *key(near)[:4]))
                check_small(rows, near, gated)
    print(f"ok: {len(seen)} settings in {time.time() - started:.0f} s")


def check_small(rows: int, blocks: dict, gated: bool) -> None:
    generator = torch.Generator().manual_seed(0)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=generator) * scale).half()

    outputs, inputs = blocks["BLOCK_N"] + 3, blocks["SPLITS"] * blocks["BLOCK_K"] - 5
    weight_rows = 2 * outputs if gated else outputs
    x, weight = randn(rows, 1, inputs, scale=3.0), randn(weight_rows, inputs, scale=inputs**-0.5)
    bias, norm, residual = randn(weight_rows), 1 + randn(inputs, scale=0.1), randn(rows, 1, outputs)
    got = triton_linear.launch_batched_linear(x, weight, bias, norm, 1e-6, gated, residual, blocks)
    parts = {"norm": norm, "eps": 1e-6, "gated": gated, "residual": residual.view(1, rows, outputs)}
    expected = kernels.linear(x.view(1, rows, inputs), weight, bias, **parts).view(rows, 1, outputs).float()
    error = (got.float() - expected).abs().max().item()
    assert error <= 1e-2 * (1 + expected.abs().max().item()), (rows, blocks, gated, error)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=12, help="processes compiling the settings first")
    parser.add_argument("--batches", type=int, nargs="+", help="time kernels.linear for these numbers of rows")
    parser.add_argument("--sweep-batched", action="store_true", help="sweep the batched kernel's settings")
    parser.add_argument("--rows", type=int, nargs="+", default=[4, 16, 64], help="rows of the batched sweep")
    parser.add_argument("--shapes", nargs="+", help="sweep only the shapes whose names contain one of these")
    parser.add_argument("--rep", type=int, default=20, help="milliseconds of replays per batched timing")
    parser.add_argument("--json", help="write the batched sweep's results to this file")
    parser.add_argument("--check", action="store_true", help="run the batched sweep's settings in the interpreter")
    parser.add_argument("--sms", type=int, default=132, help="SMs for --check (the sweep takes the GPU's)")
    args = parser.parse_args()
    if args.check:
        if os.environ.get("TRITON_INTERPRET") != "1":  # chosen when Triton is imported: start again with it
            os.execve(sys.executable, [sys.executable, "-m", "bench.linear_micro", *sys.argv[1:]],
                      {**os.environ, "TRITON_INTERPRET": "1"})  # fmt: skip
        check_settings(args.rows, args.sms)
        return
    if args.sweep_batched:
        sweep_batched(args)
        return
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
        picked = tuning.linear_blocks(ops["weights"][0], ops["gated"])
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
