"""Process set-up and file helpers shared by the training scripts."""

import ctypes
import hashlib


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
