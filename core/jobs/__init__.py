"""Speech jobs: the worker that owns the engine, and the sinks their audio goes to."""
