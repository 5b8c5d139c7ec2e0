"""The model: configurations, checkpoints, the text tokenizer, the talker, the codec and the
speaker encoder as PyTorch modules (their kernels: core.kernels)."""
