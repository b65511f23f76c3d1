"""Shared pieces of the training scripts in tools/: the torch Llama that reproduces the llama2.c
fixture and its legacy file format (llama), and the frozen target as a teacher (teacher). The
scripts run from the repository root as `/usr/bin/python3 tools/<script>.py`, which puts tools/ on
the import path."""
