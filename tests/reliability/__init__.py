"""Reliability checks a new user would run: the bad-input table and a kill -9 loop over `chat`.

    .venv/bin/python -m tests.reliability [--kills 100] [--model FOLDER] [--seed 0]

prints the counts (bad inputs tried / clean / tracebacks / junk turns / lost messages; kills /
corrupt / lost / orphans). The test suite runs a small version (tests/test_reliability.py, marker
`slow`).
"""
