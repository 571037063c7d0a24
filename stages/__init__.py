"""One module per DVC stage: ``run(cfg)`` does I/O and orchestration; the library does the work."""
