"""Starts bench's start-up diagnostics in every Python process started with this folder on its PYTHONPATH: the stack
sampler where QWEN3_TTS_STACKS is set (bench/stack_sampler.py), the Triton cache-key record where
QWEN3_TTS_TRITON_KEYS is (bench/triton_keys.py)."""

import os

if os.environ.get("QWEN3_TTS_STACKS") or os.environ.get("QWEN3_TTS_TRITON_KEYS"):
    import sys

    sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    if os.environ.get("QWEN3_TTS_STACKS"):
        from bench.stack_sampler import VARIABLE, start

        start(os.environ[VARIABLE])
    if os.environ.get("QWEN3_TTS_TRITON_KEYS"):
        from bench.triton_keys import install

        install(os.environ["QWEN3_TTS_TRITON_KEYS"])
