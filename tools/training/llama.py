"""The Llama of the llama2.c checkpoints (the stories260K fixture and the distilled draft): a torch
model laid out exactly like the legacy file, and the legacy file's reader and writer.

Float32 on the CPU; the forward pass reproduces the fixture's reference greedy ids (see
training.teacher.check_teacher).
"""

import dataclasses
import math
import os
import struct

import numpy as np
import torch
import torch.nn.functional as F

BOS = 1
EOS = 2
HEADER = struct.Struct("<7i")  # dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab, seq_len
ATTENTION_BLOCK = 128  # queries per block in the causal attention


# ----------------------------------------------------------------------------------------------
# Model


@dataclasses.dataclass(frozen=True)
class Config:
    """Hyper-parameters of a Llama-architecture model (mirrors specdec::llama_config)."""

    dim: int
    hidden_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    seq_len: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5

    @property
    def head_size(self):
        return self.dim // self.n_heads

    @property
    def kv_dim(self):
        return self.n_kv_heads * self.head_size

    def validate(self):
        assert min(self.dim, self.hidden_dim, self.n_layers, self.n_heads, self.n_kv_heads,
                   self.vocab_size, self.seq_len) > 0, f"non-positive size in {self}"
        assert self.dim % self.n_heads == 0, f"dim not a multiple of n_heads in {self}"
        assert self.n_heads % self.n_kv_heads == 0, f"n_heads not a multiple of n_kv_heads: {self}"
        assert self.head_size % 2 == 0, f"odd head size in {self}"

    def parameter_count(self):
        """Float parameters, tied classifier counted once (RoPE tables excluded)."""
        d, h, kv = self.dim, self.hidden_dim, self.kv_dim
        per_layer = 2 * d + 2 * d * d + 2 * kv * d + 3 * h * d
        return self.vocab_size * d + self.n_layers * per_layer + d

    def file_floats(self):
        """Floats after the header in a legacy file with a tied classifier."""
        return self.parameter_count() + self.seq_len * self.head_size  # + cos and sin tables

    def short(self):
        return (f"dim {self.dim}, hidden {self.hidden_dim}, {self.n_layers} layers, "
                f"{self.n_heads} heads, {self.n_kv_heads} kv heads")


def rope_tables(cfg):
    """cos and sin, each [seq_len, head_size / 2], as llama2.c's export writes them."""
    hs = cfg.head_size
    freqs = 1.0 / (cfg.rope_theta ** (torch.arange(0, hs, 2, dtype=torch.float32)[: hs // 2] / hs))
    angles = torch.outer(torch.arange(cfg.seq_len, dtype=torch.float32), freqs)
    return torch.cos(angles), torch.sin(angles)


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def apply_rope(x, cos, sin):
    """x [..., T, heads, head_size]; rotates the interleaved pairs (2i, 2i+1) of every head by the
    angles of cos, sin [..., T, head_size / 2] (one row per token, broadcast over the heads and
    over leading dimensions they lack: [T, head_size / 2] for a batch at consecutive positions)."""
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)


# Tensor names in the order of the legacy file, with their shapes (L = n_layers).
def tensor_layout(cfg):
    d, h, kv, L = cfg.dim, cfg.hidden_dim, cfg.kv_dim, cfg.n_layers
    return [
        ("tok_embeddings", (cfg.vocab_size, d)),
        ("rms_att", (L, d)),
        ("wq", (L, d, d)),
        ("wk", (L, kv, d)),
        ("wv", (L, kv, d)),
        ("wo", (L, d, d)),
        ("rms_ffn", (L, d)),
        ("w1", (L, h, d)),
        ("w2", (L, d, h)),
        ("w3", (L, h, d)),
        ("rms_final", (d,)),
    ]


class Llama(torch.nn.Module):
    """Llama: RMSNorm, interleaved RoPE, grouped-query attention, SwiGLU, tied classifier.

    Parameters are stacked per kind across layers, exactly as the legacy file stores them.
    """

    def __init__(self, cfg):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        for name, shape in tensor_layout(cfg):
            init = torch.ones if name.startswith("rms") else torch.zeros
            setattr(self, name, torch.nn.Parameter(init(shape)))
        cos, sin = rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def init_random(self, gen, std=0.02):
        """GPT-2 style initialisation; residual projections scaled by 1/sqrt(2 n_layers)."""
        with torch.no_grad():
            for name, _ in tensor_layout(self.cfg):
                p = getattr(self, name)
                if name.startswith("rms"):
                    p.fill_(1.0)
                else:
                    scale = std / math.sqrt(2 * self.cfg.n_layers) if name in ("wo", "w2") else std
                    p.copy_(torch.randn(p.shape, generator=gen) * scale)
        return self

    def new_cache(self, batch, length):
        """Per layer (k, v), each [batch, n_kv_heads, length, head_size]."""
        c = self.cfg
        shape = (batch, c.n_kv_heads, length, c.head_size)
        return [(torch.zeros(shape), torch.zeros(shape)) for _ in range(c.n_layers)]

    def _attention(self, q, k, v, start_pos):
        """Causal grouped-query attention. q [B, n_heads, T, hs] at positions start_pos..;
        k, v [B, n_kv_heads, S, hs] at positions 0..S-1 with S = start_pos + T.
        Returns [B, n_heads, T, hs].

        Query head g * rep + r reads kv head g (llama2.c: h / kv_mul), so each kv head is one
        batched matmul over its rep query heads. Queries go in blocks of ATTENTION_BLOCK, each
        against the keys it can see only, which skips most of the masked half of the scores.
        """
        B, nh, T, hs = q.shape
        nkv = k.shape[1]
        rep = nh // nkv
        scale = 1.0 / math.sqrt(hs)
        q = q.reshape(B, nkv, rep, T, hs)
        outs = []
        for t0 in range(0, T, ATTENTION_BLOCK):
            t1 = min(T, t0 + ATTENTION_BLOCK)
            n, keys = t1 - t0, start_pos + t1
            qb = q[:, :, :, t0:t1].reshape(B * nkv, rep * n, hs)  # row r * n + t
            kb = k[:, :, :keys].reshape(B * nkv, keys, hs).transpose(1, 2)
            vb = v[:, :, :keys].reshape(B * nkv, keys, hs)
            if n == 1:
                att = torch.bmm(qb, kb) * scale
            else:
                mask = torch.full((n, keys), float("-inf")).triu(start_pos + t0 + 1).repeat(rep, 1)
                att = torch.baddbmm(mask, qb, kb, alpha=scale)
            outs.append(torch.bmm(torch.softmax(att, dim=-1), vb).view(B, nkv, rep, n, hs))
        o = outs[0] if len(outs) == 1 else torch.cat(outs, dim=3)
        return o.view(B, nh, T, hs)

    def forward(self, tokens, start_pos=0, cache=None):
        """tokens [B, T] at positions start_pos.. -> logits [B, T, vocab] (see hidden)."""
        return self.hidden(tokens, start_pos, cache) @ self.tok_embeddings.T

    def hidden(self, tokens, start_pos=0, cache=None):
        """tokens [B, T] at positions start_pos.. -> final hidden states [B, T, dim], after the
        final RMSNorm (the classifier's input: logits = hidden @ tok_embeddings.T).

        Without a cache the attention is causal over the T tokens (start_pos must be 0); with a
        cache the new keys/values are written at start_pos.. and attention covers 0..start_pos+T.
        """
        return self.hidden_and_residuals(tokens, (), start_pos, cache)[0]

    def hidden_and_residuals(self, tokens, layers, start_pos=0, cache=None):
        """As `hidden`, and the residual stream at the output of each layer in `layers` (0-based
        indices, before the final RMSNorm; layer n_layers - 1's is the final norm's input):
        returns (hidden [B, T, dim], [residual [B, T, dim] per entry of `layers`, in its order]).
        """
        c = self.cfg
        assert all(0 <= l < c.n_layers for l in layers), f"layers {layers} outside the model"
        kept = {}
        B, T = tokens.shape
        nh, nkv, hs = c.n_heads, c.n_kv_heads, c.head_size
        assert start_pos + T <= c.seq_len, "context overflow"
        assert cache is not None or start_pos == 0
        cos = self.rope_cos[start_pos : start_pos + T]
        sin = self.rope_sin[start_pos : start_pos + T]
        S = start_pos + T
        x = self.tok_embeddings[tokens]
        for layer in range(c.n_layers):
            h = rms_norm(x, self.rms_att[layer], c.rms_eps)
            q = apply_rope((h @ self.wq[layer].T).view(B, T, nh, hs), cos, sin)
            k = apply_rope((h @ self.wk[layer].T).view(B, T, nkv, hs), cos, sin)
            v = (h @ self.wv[layer].T).view(B, T, nkv, hs)
            k, v = k.transpose(1, 2), v.transpose(1, 2)  # [B, nkv, T, hs]
            if cache is not None:
                ck, cv = cache[layer]
                ck[:, :, start_pos:S] = k
                cv[:, :, start_pos:S] = v
                k, v = ck[:, :, :S], cv[:, :, :S]
            else:
                k, v = k.contiguous(), v.contiguous()
            o = self._attention(q.transpose(1, 2), k, v, start_pos)
            o = o.transpose(1, 2).reshape(B, T, c.dim)
            x = x + o @ self.wo[layer].T
            h = rms_norm(x, self.rms_ffn[layer], c.rms_eps)
            x = x + (F.silu(h @ self.w1[layer].T) * (h @ self.w3[layer].T)) @ self.w2[layer].T
            if layer in layers:
                kept[layer] = x
        return rms_norm(x, self.rms_final, c.rms_eps), [kept[l] for l in layers]


# ----------------------------------------------------------------------------------------------
# llama2.c legacy format


def read_legacy(path):
    """Reads a llama2.c legacy checkpoint with a tied classifier; returns (model, max |RoPE table
    error|) where the error compares the file's tables with the ones computed from the config."""
    raw = open(path, "rb").read()
    assert len(raw) >= HEADER.size, f"{path}: shorter than the header"
    dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len = HEADER.unpack_from(raw)
    assert vocab > 0, f"{path}: untied classifier (negative vocab_size) is not supported here"
    cfg = Config(dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len)
    cfg.validate()
    expected = HEADER.size + 4 * cfg.file_floats()
    assert len(raw) == expected, f"{path}: {len(raw)} bytes, expected {expected} for {cfg}"
    floats = np.frombuffer(raw, dtype="<f4", offset=HEADER.size).copy()
    model = Llama(cfg)
    offset = 0
    with torch.no_grad():
        for name, shape in tensor_layout(cfg):
            n = int(np.prod(shape))
            getattr(model, name).copy_(torch.from_numpy(floats[offset : offset + n].reshape(shape)))
            offset += n
    half = cfg.seq_len * cfg.head_size // 2
    file_cos = torch.from_numpy(floats[offset : offset + half].reshape(cfg.seq_len, -1).copy())
    file_sin = torch.from_numpy(floats[offset + half :].reshape(cfg.seq_len, -1).copy())
    rope_error = max((file_cos - model.rope_cos).abs().max().item(),
                     (file_sin - model.rope_sin).abs().max().item())
    return model, rope_error


def write_legacy(model, path):
    """Writes the model as a llama2.c legacy checkpoint (positive vocab_size: tied classifier)."""
    c = model.cfg
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    parts = [HEADER.pack(c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size,
                         c.seq_len)]
    for name, shape in tensor_layout(c):
        t = getattr(model, name).detach()
        assert tuple(t.shape) == shape
        parts.append(t.numpy().astype("<f4").tobytes())
    parts.append(model.rope_cos.numpy().astype("<f4").tobytes())
    parts.append(model.rope_sin.numpy().astype("<f4").tobytes())
    data = b"".join(parts)
    assert len(data) == HEADER.size + 4 * c.file_floats()
    with open(path, "wb") as f:
        f.write(data)
    return len(data)
