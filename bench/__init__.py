"""Maintained benchmark and check tools (bench/README.md is the index); run from the repository root as
`python -m bench.NAME`."""
