"""TriForce Chat engine: model runner, caches, drafters, hierarchical speculative decoding.

No Qt here, ever (enforced by import-linter in CI): scripts and tests use it alone.
"""
