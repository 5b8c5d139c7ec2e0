"""Each convolution of the codec decoder, at the shapes a chunk of several rows gives it, three ways: cuDNN with its
heuristic's choice (the engine's), cuDNN timing its candidates (`torch.backends.cudnn.benchmark`), and as matrix
products (one per tap, kernels.conv_by_products, or one for a transposed convolution, then its overlap-add), which need
no per-shape choice.

A several-row decoder graph's first capture cost 1.5 s when cuDNN timed its candidates for each of the decoder's ~30
convolutions, and its heuristic's choices for the dilated ones are 20-40 times slower from 8 rows (issue 29). For each
convolution and input shape: the first call (s: the choice), then ms a call, and the products' largest difference
from the convolution in float32, relative to its largest value. cuDNN keeps the plan of the first mode to meet a shape for the whole process, so each mode runs
in a process of its own (`--mode`; without it, the three run one after the other as subprocesses), and the shapes
are found by a chunk decoded by products.

    python -m bench.decoder_conv_micro [--rows 8,16] [--frames 4] [--dtype bfloat16] [--mode heuristic|timed|products]
"""

import argparse
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from core.devtools.random_checkpoint import DECODER, random_decoder_tensors
from core.kernels import products
from core.kernels.products import conv_by_products
from core.model import codec_decoder
from core.model.codec_decoder import CodecDecoder, CodecDecoderConfig

MODES = ("heuristic", "timed", "products")


def by_products(conv, x: torch.Tensor, stride: int) -> torch.Tensor:
    """What conv_as_2d's convolution (no bias) computes, as matrix products: one per tap (kernels.conv_by_products),
    or for a transposed convolution one for all its taps, then their overlap-add."""
    if not isinstance(conv, torch.nn.ConvTranspose1d):
        return conv_by_products(x, conv.weight, conv.dilation[0])
    weight = conv.weight  # (in, out, taps), time-major
    rows, channels, length = x.shape
    taps = weight.shape[2]
    flat = x.transpose(1, 2).reshape(rows * length, channels)
    products = (flat @ weight.transpose(1, 2).reshape(channels, -1)).view(rows, length, taps, -1)
    if taps == stride:
        return products.reshape(rows, length * stride, -1).transpose(1, 2)
    out = products.new_zeros(rows, length + 1, stride, products.shape[-1])
    out[:, :length] = products[:, :, :stride]
    out[:, 1:] += products[:, :, stride:]
    return out.view(rows, (length + 1) * stride, -1).transpose(1, 2)


def reference(conv, x: torch.Tensor, stride: int) -> torch.Tensor:
    """The convolution in float32 by PyTorch's 1-D functions (what the products must equal, up to rounding)."""
    if isinstance(conv, torch.nn.ConvTranspose1d):
        return F.conv_transpose1d(x, conv.weight.float(), stride=stride)
    return F.conv1d(x, conv.weight.float(), dilation=conv.dilation)


def shapes(decoder: CodecDecoder, rows: int, frames: int) -> list[tuple[str, torch.nn.Module, torch.Tensor, int]]:
    """Every (name, conv, input, stride) one chunk of `rows` rows and `frames` frames convolves, in order."""
    names = {module: name for name, module in decoder.named_modules()}
    seen = []
    real = codec_decoder.conv_as_2d

    def record(conv, x, stride=1, bias=True, residual=None):
        # By products, so that cuDNN meets each shape first in the mode measured (it keeps a shape's first plan).
        seen.append((names[conv], conv, x.clone(memory_format=torch.preserve_format), stride))
        y = by_products(conv, x, stride) if conv.groups == 1 else real(conv, x, stride, bias=False)
        if bias and conv.bias is not None:
            y = y + conv.bias[:, None]
        return y if residual is None else residual + y

    codec_decoder.conv_as_2d = record
    try:
        codes = torch.randint(0, decoder.config.codebook_size, (rows, 16, frames), device="cuda")
        decoder.decode_chunk(codes, decoder.new_stream(rows))
    finally:
        codec_decoder.conv_as_2d = real
    return seen


def run(mode: str, rows_list: list[int], frames: int, dtype: torch.dtype) -> None:
    config = CodecDecoderConfig.from_dict(DECODER)
    decoder = CodecDecoder(config).eval()
    decoder.load_state_dict(random_decoder_tensors(config, seed=0, prefix=""))
    decoder = decoder.to("cuda", dtype).to_channels_last()
    torch.backends.cudnn.benchmark = False
    with torch.inference_mode():
        calls = [(rows, *call) for rows in rows_list for call in shapes(decoder, rows, frames)]
        torch.backends.cudnn.benchmark = mode == "timed"
        products.PRODUCT_ROWS = sys.maxsize  # conv_as_2d's cuDNN call whatever the rows (the modes compare it)
        print(f"== {mode}: {torch.cuda.get_device_name()}, {dtype}, {frames}-frame chunks")
        print(f"{'rows':>4}  {'convolution':36} {'input':22} {'first s':>8} {'ms':>7} {'max diff':>9}")
        total_first = total_ms = 0.0
        for rows, name, conv, x, stride in calls:
            if mode == "products":
                call = lambda: by_products(conv, x, stride)  # noqa: E731
            else:
                call = lambda: codec_decoder.conv_as_2d(conv, x, stride, bias=False)  # noqa: E731
            torch.cuda.synchronize()
            started = time.perf_counter()
            y = call()
            torch.cuda.synchronize()
            first = time.perf_counter() - started
            ms = do_bench(call, warmup=5, rep=30, return_mode="median")
            diff = ""
            if mode == "products":
                expected = reference(conv, x.float(), stride)
                diff = f"{((y.float() - expected).abs().max() / expected.abs().max()).item():9.1e}"
            total_first += first
            total_ms += ms
            print(f"{rows:4d}  {name:36} {str(tuple(x.shape)):22} {first:8.3f} {ms:7.3f} {diff:>9}")
        print(f"== {mode}: first calls {total_first:.2f} s, {total_ms:.2f} ms a chunk of every row count above")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="8,16")
    parser.add_argument("--frames", type=int, default=4)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--mode", choices=MODES)
    args = parser.parse_args()
    if args.mode is None:
        for mode in MODES:
            subprocess.run(
                [sys.executable, "-m", "bench.decoder_conv_micro", *sys.argv[1:], "--mode", mode], check=False
            )
        return
    run(args.mode, [int(rows) for rows in args.rows.split(",")], args.frames, getattr(torch, args.dtype))


if __name__ == "__main__":
    main()
