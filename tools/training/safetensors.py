"""A safetensors writer and reader (https://github.com/huggingface/safetensors, format version of
the `safetensors` package): an 8-byte little-endian unsigned header length N, N bytes of JSON
header, then the tensor data. The header maps each tensor name to {"dtype", "shape",
"data_offsets": [begin, end]} (byte offsets into the data that follows the header, end exclusive)
and may hold "__metadata__", a map of strings to strings. Data is little-endian, row-major,
tensors packed back to back in header order with no gaps; the header is padded with spaces to a
multiple of 8 bytes, as the reference writer does.

Floating tensors are written as F32, F16 or BF16 (bfloat16 rounded to nearest even from float32,
as torch converts); integer and boolean tensors keep their type: torch.int32 as I32, torch.int64 as
I64, torch.bool as BOOL (one byte, 0 or 1), as the `safetensors` package writes them."""

import json
import struct

import numpy as np
import torch

DTYPES = ("F32", "F16", "BF16")  # the float types a file may be written in
INTEGER_DTYPES = {torch.int32: "I32", torch.int64: "I64", torch.bool: "BOOL"}
INTEGER_NUMPY = {"I32": "<i4", "I64": "<i8", "BOOL": "u1"}
ITEM_SIZE = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "I64": 8, "BOOL": 1}


def _file_dtype(t, dtype):
    """The header dtype of tensor t written by `write(..., dtype)`."""
    if t.dtype in INTEGER_DTYPES:
        return INTEGER_DTYPES[t.dtype]
    assert t.dtype.is_floating_point, f"unsupported tensor type {t.dtype}"
    return dtype


def _encode(t, dtype):
    """tensor -> little-endian bytes in `dtype` (a float type, or the tensor's integer type)."""
    if dtype in INTEGER_NUMPY:
        return t.detach().contiguous().numpy().astype(INTEGER_NUMPY[dtype]).tobytes()
    t = t.detach().to(torch.float32).contiguous()
    if dtype == "F32":
        return t.numpy().astype("<f4").tobytes()
    if dtype == "F16":
        return t.numpy().astype("<f2").tobytes()
    if dtype == "BF16":
        return t.to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes()
    raise ValueError(f"unsupported dtype {dtype}; one of {DTYPES}")


def _decode(raw, dtype, shape):
    """little-endian bytes in `dtype` -> tensor of `shape`: float32 for the float types, int32,
    int64 or bool for I32, I64, BOOL (a BOOL byte other than 0 or 1 is an error)."""
    if dtype in INTEGER_NUMPY:
        a = np.frombuffer(raw, dtype=INTEGER_NUMPY[dtype])
        if dtype == "BOOL":
            assert (a <= 1).all(), "BOOL tensor with a byte other than 0 or 1"
            return torch.from_numpy(a.astype(np.bool_)).reshape(shape)
        return torch.from_numpy(a.astype(a.dtype.newbyteorder("="))).reshape(shape)
    if dtype == "F32":
        a = np.frombuffer(raw, dtype="<f4").astype(np.float32)
    elif dtype == "F16":
        a = np.frombuffer(raw, dtype="<f2").astype(np.float32)
    elif dtype == "BF16":
        a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        raise ValueError(f"unsupported dtype {dtype}; one of {DTYPES}")
    return torch.from_numpy(a.copy()).reshape(shape)


def write(path, tensors, dtype="F32", metadata=None):
    """Writes `tensors` (an ordered mapping name -> tensor) to `path`, floating tensors in
    `dtype`, integer and boolean ones in their own type (I32, I64, BOOL), data in the mapping's
    order; `metadata` (str -> str) goes to "__metadata__". Returns the file size."""
    assert dtype in DTYPES, f"unsupported dtype {dtype}; one of {DTYPES}"
    header, blobs, offset = {}, [], 0
    if metadata:
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
        header["__metadata__"] = dict(metadata)
    for name, t in tensors.items():
        assert name != "__metadata__" and name not in header, f"bad or repeated name {name!r}"
        file_dtype = _file_dtype(t, dtype)
        blob = _encode(t, file_dtype)
        assert len(blob) == t.numel() * ITEM_SIZE[file_dtype]
        header[name] = {"dtype": file_dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    data = struct.pack("<Q", len(text)) + text + b"".join(blobs)
    with open(path, "wb") as f:
        f.write(data)
    return len(data)


def read(path):
    """Reads a file written by `write` (or any safetensors file of F32/F16/BF16/I32/I64/BOOL
    tensors), checking every offset and shape against the header and the file size. Returns
    (tensors in file order, float ones as float32, {name: dtype}, metadata)."""
    raw = open(path, "rb").read()
    assert len(raw) >= 8, f"{path}: shorter than the 8-byte header length"
    (n,) = struct.unpack_from("<Q", raw, 0)
    assert 8 + n <= len(raw), f"{path}: header of {n} bytes past the end of the file"
    header = json.loads(raw[8 : 8 + n].decode("utf-8"))
    metadata = header.pop("__metadata__", {})
    data = raw[8 + n :]
    tensors, dtypes, end = {}, {}, 0
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        dtype, shape, (begin, stop) = info["dtype"], info["shape"], info["data_offsets"]
        count = int(np.prod(shape)) if shape else 1
        assert begin == end, f"{path}: tensor {name} starts at {begin}, expected {end}"
        assert stop - begin == count * ITEM_SIZE[dtype], f"{path}: tensor {name}: bad size"
        assert stop <= len(data), f"{path}: tensor {name} ends past the end of the file"
        tensors[name] = _decode(data[begin:stop], dtype, shape)
        dtypes[name] = dtype
        end = stop
    assert end == len(data), f"{path}: {len(data) - end} bytes after the last tensor"
    return tensors, dtypes, metadata
