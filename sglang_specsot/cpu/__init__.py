"""What SGLang 0.5.23 needs to run, speculatively too, on an x86-64 CPU without AMX."""
