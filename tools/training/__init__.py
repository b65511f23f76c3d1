"""Shared pieces of the training scripts in tools/ (train_draft.py, train_heads.py,
train_eagle.py): the torch Llama that reproduces the llama2.c fixture and its legacy file format
(llama), the frozen target as a teacher (teacher), the llama2.c tokenizer (tokenizer), a
safetensors reader and writer (safetensors) and process set-up (runtime). The scripts run from
the repository root as `/usr/bin/python3 tools/<script>.py`, which puts tools/ on the import
path."""
