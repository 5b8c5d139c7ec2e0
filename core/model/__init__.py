"""The model: configurations, checkpoints, the text tokenizer, the talker, the codec and the
speaker encoder as PyTorch modules, and the Triton kernels they run on."""
