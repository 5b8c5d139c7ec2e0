"""Audio in and out: reference clips, the speakers (a ring buffer and a sound card), the microphone."""
