"""The results suite behind ``python benchmarks/results.py`` (the one command; see its docstring).

plan      tasks, methods, the grid of cells and their command lines (nothing runs)
records   the JSONL file of cell records (append-only; the latest line of a cell wins)
run       one cell: the real CLI in a subprocess, timed, its numbers read from the run's files
stats     groups of cells over seeds: mean, standard deviation, standard error
verdicts  the paper's claims, decided from the groups
render    docs/results.md and its plots
"""
