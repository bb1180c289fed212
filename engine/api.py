"""The engine's one facade (filled in next): the app, the CLI and the benchmarks open models and
sessions here."""
