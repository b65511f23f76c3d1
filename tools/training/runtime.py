"""Process set-up and file helpers shared by the training scripts."""

import ctypes
import hashlib
import math

import torch

from training.llama import tensor_layout


def keep_freed_memory():
    """glibc gives large freed blocks back to the kernel, so every large tensor is page-faulted
    in again; keeping them on the heap makes the training about twice as fast (no numeric
    effect). M_TRIM_THRESHOLD = -1, M_MMAP_THRESHOLD = -3."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-1, 1 << 30)
        libc.mallopt(-3, 1 << 30)
    except OSError:
        pass


def sha256(path):
    """The hex SHA-256 of a file's bytes."""
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def adamw(student, cfg, lr, weight_decay):
    """The drafts' optimiser: AdamW (betas 0.9/0.95), weight decay on the matrices only."""
    decay = [getattr(student, n) for n, _ in tensor_layout(cfg) if not n.startswith("rms")]
    no_decay = [getattr(student, n) for n, _ in tensor_layout(cfg) if n.startswith("rms")]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.95), eps=1e-8)


def warmup_cosine(lr, warmup, steps, min_lr_ratio):
    """The learning rate at each step: linear warmup to lr, then cosine decay to lr * min_lr_ratio."""

    def lr_at(step):
        if step < warmup:
            return lr * (step + 1) / warmup
        t = (step - warmup) / max(1, steps - warmup)
        cosine = 0.5 * (1 + math.cos(math.pi * t))
        return lr * (min_lr_ratio + (1 - min_lr_ratio) * cosine)

    return lr_at
