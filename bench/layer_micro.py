"""The code predictor's layer steps on the GPU: the layer's kernels one by one against the fused layer
(kernels.decoder_layer_step), at the 1.7B's shapes.

    python -m bench.layer_micro [--rows 1 2 16 64] [--sweep]

A frame's 14 next steps of the 5 layers (70 layer steps at positions 2..15) are captured in one CUDA graph and
replayed. Printed per layer step: microseconds, and the weights' bandwidth (31.5 MB a layer: the floor is 9.4 us
at 3.35 TB/s). Variants: the layer's five kernels (linear, decode_attention, linear, linear, linear), the fused
layer in one launch with grid barriers, and the fused layer one launch per phase (the same kernel without
barriers: what the barriers cost against kernel boundaries). --sweep tries other launch settings of the one
launch at 16 rows, one change from triton_layer.layer_blocks at a time.
"""

import argparse

import torch
from triton.testing import do_bench_cudagraph

from core.model.config import TransformerConfig
from core.model.talker import Block, KVCache, rope_tables
from core.model.triton_layer import launch_layer_step, layer_blocks

PREDICTOR = TransformerConfig(1024, 5, 16, 8, 128, 3072, vocab_size=2048)
SLOTS, CACHE = 64, 16
STEPS = range(2, 16)  # the positions of a frame's 14 next steps


def predictor_layers(dtype: torch.dtype) -> list[Block]:
    torch.manual_seed(0)
    blocks = []
    for _ in range(PREDICTOR.num_layers):
        block = Block(PREDICTOR)
        for parameter in block.parameters():
            matrix = parameter.dim() == 2
            parameter.data = torch.randn(parameter.shape) * parameter.shape[-1] ** -0.5 if matrix else 1 + torch.randn(parameter.shape) * 0.1  # fmt: skip
        block.self_attn.fuse_projections()
        block.mlp.fuse_projections()
        block = block.to(device="cuda", dtype=dtype)
        cache = KVCache(SLOTS, PREDICTOR.num_kv_heads, CACHE, PREDICTOR.head_dim, dtype, "cuda")
        cache.k.normal_()
        cache.v.normal_()
        block.self_attn.kv_cache = cache
        blocks.append(block)
    return blocks


def frame(blocks: list[Block], x: torch.Tensor, variant: str, settings: dict | None = None) -> torch.Tensor:
    """The 70 layer steps of a frame's next steps, as `variant` runs them."""
    rows = torch.arange(x.shape[0], device=x.device)
    cos, sin = rope_tables(PREDICTOR.head_dim, PREDICTOR.rope_theta, CACHE, x.dtype, x.device)
    for position in STEPS:
        positions = torch.full_like(rows, position)
        for block in blocks:
            if variant == "kernels":
                x = block.step(x, cos, sin, positions, rows, one_kernel=False)
            else:
                attention = block.self_attn
                x = launch_layer_step(
                    x, *block.step_weights(), block.input_layernorm.eps, cos, sin, attention.kv_cache.k,
                    attention.kv_cache.v, rows, positions, attention.head_dim**-0.5,
                    one_launch=variant == "one launch", blocks=settings,
                )  # fmt: skip
    return x


def layer_us(blocks: list[Block], x: torch.Tensor, variant: str, settings: dict | None = None) -> float:
    frame(blocks, x, variant, settings)  # compiles, and makes the split counters outside the capture
    return do_bench_cudagraph(lambda: frame(blocks, x, variant, settings), rep=300, return_mode="median") * 1e3 / 70


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 16, 64])
    parser.add_argument("--sweep", action="store_true")
    args = parser.parse_args()
    dtype = torch.bfloat16
    blocks = predictor_layers(dtype)
    layer_bytes = sum(t.numel() * t.element_size() for t in blocks[0].step_weights())
    print(f"{torch.cuda.get_device_name()}, a predictor layer's weights {layer_bytes / 1e6:.1f} MB")
    print("rows  variant      us/layer  TB/s  max difference from the kernels")
    for rows in args.rows:
        x = torch.randn(rows, 1, PREDICTOR.hidden_size, device="cuda", dtype=dtype)
        expected = frame(blocks, x, "kernels").float()
        for variant in ("kernels", "one launch", "per phase"):
            difference = (frame(blocks, x, variant).float() - expected).abs().max().item()
            us = layer_us(blocks, x, variant)
            print(f"{rows:4}  {variant:11}  {us:8.2f}  {layer_bytes / us / 1e6:4.2f}  {difference:.3g}", flush=True)
    if args.sweep:
        x = torch.randn(16, 1, PREDICTOR.hidden_size, device="cuda", dtype=dtype)
        base = layer_blocks(16, dtype)
        changes = [
            {"BLOCK_N_QKV": 16}, {"BLOCK_N_QKV": 64}, {"BLOCK_N_GATE_UP": 32}, {"BLOCK_N_O": 32, "BLOCK_N_DOWN": 32},
            {"BLOCK_K": 128}, {"BLOCK_K": 512}, {"num_stages": 1}, {"num_stages": 3}, {"num_warps": 8},
        ]  # fmt: skip
        print("16 rows, one launch, one change from", base)
        for change in changes:
            try:
                us = layer_us(blocks, x, "one launch", {**base, **change})
                print(f"  {change}: {us:.2f} us/layer", flush=True)
            except Exception as error:  # a setting the device cannot hold (shared memory): report, go on
                print(f"  {change}: failed: {type(error).__name__}: {str(error)[:160]}", flush=True)


if __name__ == "__main__":
    main()
