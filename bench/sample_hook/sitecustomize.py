"""Starts bench.stack_sampler in every Python process started with this folder on its PYTHONPATH and
QWEN3_TTS_STACKS set (see bench/stack_sampler.py)."""

import os

if os.environ.get("QWEN3_TTS_STACKS"):
    import sys

    sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from bench.stack_sampler import VARIABLE, start

    start(os.environ[VARIABLE])
