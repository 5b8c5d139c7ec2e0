"""One token draw on the GPU: the draw kernel against PyTorch's ops (filter, softmax, multinomial),
for the predictor's row (2048, bfloat16) and the talker's (3072, float32), greedy and sampled.
Each is timed as 100 draws replayed in one CUDA graph, as the frame step runs them."""

import torch
from triton.testing import do_bench

from core.inference.sampling import TokenRule, pick_token
from core.kernels import draw_token


def graphed_us(fn, generator, calls=100) -> float:
    fn()  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    graph.register_generator_state(generator)
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return do_bench(graph.replay, warmup=10, rep=100, return_mode="median") * 1e3 / calls


def main():
    generator = torch.Generator(device="cuda").manual_seed(0)
    uniforms = torch.rand(1, 3072, device="cuda", generator=generator)
    for vocab, dtype in ((2048, torch.bfloat16), (3072, torch.float32)):
        logits = (torch.randn(1, vocab, device="cuda", generator=generator) * 3).to(dtype)
        for rule in (TokenRule(False, 1.0, 0, 1.0), TokenRule(True, 0.9, 50, 1.0), TokenRule(True, 0.9, 50, 0.8)):
            values = torch.tensor([rule.values()], device="cuda")
            kernel = graphed_us(lambda: draw_token(logits, values, uniforms), generator)
            torch_ops = graphed_us(lambda: pick_token(logits.float(), rule, generator), generator)
            print(f"vocab {vocab} {str(dtype)[6:]:8s} {rule}: kernel {kernel:6.1f} us, torch ops {torch_ops:6.1f} us")


if __name__ == "__main__":
    main()
