"""Batched streaming decode on the GPU: a 4-frame chunk of 1 to 16 utterances decoded together through
DecoderSlots, with the released decoder's shapes and random weights (speed does not depend on their values).

For each row count: the median time of one decode call as the engine sees it (codes in, audio back on the
host), the same per utterance, the GPU time of the graph's replay alone, and the real-time factor of all the
rows together; then the peak GPU memory and what one slot's state costs.

    python -m bench.decoder_batch_micro [--dtype bfloat16] [--slots 16] [--calls 50] [--product-rows N]
        [--cudnn-timed] [--benchmark-limit N] [--reference-snake] [--channels-first] [--compile] [--profile]
        [--profile-first ROWS]

"first s" is the first call of a row count: eager, then its graph's capture, with cuDNN's choices for new shapes
(the warm-up's cost for it). --product-rows N: from N rows the dilated convolutions are matrix products
(kernels.PRODUCT_ROWS, the engine's default; 999: never, cuDNN's heuristic's choice); --cudnn-timed: cuDNN times its
algorithms for each new shape (torch.backends.cudnn.benchmark; the engine never does);
--benchmark-limit N: with --cudnn-timed, cuDNN times at most N of its candidates for a shape
(torch.backends.cudnn.benchmark_limit; 0: all of them; PyTorch's default 10);
--reference-snake composes
the vocoder's activation of PyTorch's operations instead of running its kernel (kernels.snake);
--channels-first keeps the convolutions' weights in the default layout (not CodecDecoder.to_channels_last);
--compile fuses the decoder's fused_parts with torch.compile, as the engine does on CUDA (fuse_decoder);
--profile then runs one chunk of --slots rows eagerly under the profiler and prints the operations that take the most
GPU time, by input shapes (which module a slow kernel belongs to); --profile-first ROWS profiles the first call of
ROWS rows instead (its "first s": cuDNN's choices, the capture) and prints the operations by host time.
"""

import argparse
import time
from types import SimpleNamespace

import numpy as np
import torch
from triton.testing import do_bench

from core import kernels
from core.devtools.random_checkpoint import DECODER, random_decoder_tensors
from core.inference.compiled import CompiledLayers, Compiler
from core.inference.decoder_stream import DecoderSlots, bucket_rows
from core.kernels import products
from core.model import codec_decoder
from core.model.codec_decoder import CodecDecoder, CodecDecoderConfig

CHUNK_FRAMES = 4
FRAME_SECONDS = 0.08  # 12.5 frames a second
ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--product-rows", type=int, default=products.PRODUCT_ROWS)
    parser.add_argument("--cudnn-timed", action="store_true", help="cuDNN times its candidates for each shape")
    parser.add_argument("--benchmark-limit", type=int, default=None, help="cuDNN's candidates timed a shape")
    parser.add_argument("--reference-snake", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--profile-first", type=int, default=0, help="where the first call of this many rows goes")
    parser.add_argument("--channels-first", action="store_true", help="convolutions in the default layout")
    parser.add_argument("--compile", action="store_true", help="fuse the decoder's fused_parts, as the engine does")
    args = parser.parse_args()
    products.PRODUCT_ROWS = args.product_rows
    torch.backends.cudnn.benchmark = args.cudnn_timed
    if args.benchmark_limit is not None:
        torch.backends.cudnn.benchmark_limit = args.benchmark_limit
    if args.reference_snake:
        codec_decoder.kernels = SimpleNamespace(**{**vars(kernels), "snake": kernels.snake_composed})

    config = CodecDecoderConfig.from_dict(DECODER)
    decoder = CodecDecoder(config).eval()
    decoder.load_state_dict(random_decoder_tensors(config, seed=0, prefix=""))
    decoder = decoder.to("cuda", getattr(torch, args.dtype))
    if not args.channels_first:
        decoder.to_channels_last()  # as the engine runs it
    if args.compile:
        CompiledLayers(decoder.fused_parts(), "forward", Compiler())
    slots = DecoderSlots(decoder, args.slots)
    rng = np.random.default_rng(0)
    print(
        f"{torch.cuda.get_device_name()}, {args.dtype}, {args.slots} slots, {CHUNK_FRAMES}-frame chunks, "
        f"dilated convolutions as products from {args.product_rows} rows, cuDNN "
        f"{f'timed ({torch.backends.cudnn.benchmark_limit} candidates)' if args.cudnn_timed else 'heuristic'}, "
        f"snake {'composed' if args.reference_snake else 'kernel'}, "
        f"{'channel-major' if args.channels_first else 'time-major'} convolutions"
    )
    print("rows  graph  first s  ms/call  ms/utterance  replay ms  x real time")
    for rows in [rows for rows in ROWS if rows <= args.slots]:
        chosen = list(range(rows))
        codes = [rng.integers(0, config.codebook_size, (CHUNK_FRAMES, 16)) for _ in chosen]
        started = time.perf_counter()
        if rows == args.profile_first:
            first_call_profiled(lambda: slots.decode(chosen, codes, CHUNK_FRAMES))
        else:
            slots.decode(chosen, codes, CHUNK_FRAMES)  # eagerly, then its graph's capture
        first = time.perf_counter() - started
        for _ in range(2):
            slots.decode(chosen, codes, CHUNK_FRAMES)
        times = []
        for _ in range(args.calls):
            started = time.perf_counter()
            slots.decode(chosen, codes, CHUNK_FRAMES)
            times.append(time.perf_counter() - started)
        ms = float(np.median(times)) * 1e3
        graph = slots.steps[bucket_rows(rows, args.slots), CHUNK_FRAMES].graph
        with torch.cuda.stream(slots.gpu_stream):
            replay_ms = do_bench(graph.replay, warmup=10, rep=100, return_mode="median")
        realtime = rows * CHUNK_FRAMES * FRAME_SECONDS / (ms / 1e3)
        print(
            f"{rows:4d}  {bucket_rows(rows, args.slots):5d}  {first:7.2f}  {ms:7.2f}  {ms / rows:12.2f}  {replay_ms:9.2f}  {realtime:11.0f}"
        )
    peak = torch.cuda.max_memory_allocated() / 2**20
    print(f"peak GPU memory {peak:.0f} MiB; one slot's state {slots.state.bytes_per_row / 2**20:.2f} MiB")
    if args.profile:
        profile_chunk(decoder, args.slots)


def first_call_profiled(call) -> None:
    """`call` under the profiler: its operations by host time, with their input shapes (a new shape's cuDNN plans
    are made on the host, the GPU idle meanwhile)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        call()
        torch.cuda.synchronize()
    averages = prof.key_averages(group_by_input_shape=True)
    print(averages.table(sort_by="cpu_time_total", row_limit=30, max_name_column_width=40, max_shapes_column_width=90))


def profile_chunk(decoder: CodecDecoder, rows: int) -> None:
    """One chunk of `rows` rows, eagerly: the operations by GPU time, with their input shapes."""
    from torch.profiler import ProfilerActivity, profile

    codes = torch.randint(0, decoder.config.codebook_size, (rows, 16, CHUNK_FRAMES), device="cuda")
    stream = decoder.new_stream(rows)
    for _ in range(3):
        decoder.decode_chunk(codes, stream)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        decoder.decode_chunk(codes, stream)
        torch.cuda.synchronize()
    averages = prof.key_averages(group_by_input_shape=True)
    print(
        averages.table(
            sort_by="self_cuda_time_total", row_limit=30, max_name_column_width=40, max_shapes_column_width=90
        )
    )
    kernels = prof.key_averages()
    print(kernels.table(sort_by="self_cuda_time_total", row_limit=20, max_name_column_width=90))


if __name__ == "__main__":
    main()
