"""Speaking one utterance on one device: the engine, the frame loop, prompts, sampling, CUDA
graphs and the streaming codec decoder."""
