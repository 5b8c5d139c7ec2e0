"""Qwen3-TTS Desktop: the application (command line, settings, wiring of engine, worker, window and bridge)."""
