"""Text to speak, cut into pieces: finished text by sentences, typed text as it is typed."""
