#!/usr/bin/env python3
"""Distil a small draft model for speculative decoding from the stories260K fixture.

1. Load the teacher (llama2.c legacy checkpoint) into the small Llama below and check it
   reproduces the fixture's reference greedy ids.
2. Sample a corpus of stories from the teacher (temperature 1, from BOS, until EOS/BOS or the
   length cap), batched with a KV cache; keep the teacher's next-token distributions.
3. Train one or more student shapes by distillation (KL to the teacher at temperature 1, optionally
   mixed with cross-entropy on the sampled tokens), AdamW with warmup and a cosine schedule; report
   held-out KL, top-1 agreement with the teacher's argmax and the expected acceptance rate of
   speculative sampling, sum_x min(p(x), q(x)); pick the shape with the best expected greedy
   speed-up (top-1 agreement traded against parameter count, see --draft-k).
4. Write the chosen student in the llama2.c legacy format (same header layout as the teacher,
   positive vocab_size = tied classifier, RoPE tables included) and re-read the file to check it
   reproduces the student's torch logits.

CPU only, deterministic (fixed seeds, one thread by default). Run from the repository root:
    /usr/bin/python3 tools/train_draft.py
"""

import argparse
import dataclasses
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

BOS = 1
EOS = 2
HEADER = struct.Struct("<7i")  # dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab, seq_len
PROMPT_LEN = 4  # the reference ids file starts with the 4 prompt ids of "Once upon a time"
PROMPT = [BOS, 403, 407, 261, 378]
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
    """x [B, T, heads, head_size]; rotates the interleaved pairs (2i, 2i+1) of every head."""
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
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
        """tokens [B, T] at positions start_pos.. -> logits [B, T, vocab].

        Without a cache the attention is causal over the T tokens (start_pos must be 0); with a
        cache the new keys/values are written at start_pos.. and attention covers 0..start_pos+T.
        """
        c = self.cfg
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
        x = rms_norm(x, self.rms_final, c.rms_eps)
        return x @ self.tok_embeddings.T


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


# ----------------------------------------------------------------------------------------------
# Teacher checks and sampling


@torch.no_grad()
def greedy(model, prompt, total):
    """Greedy decoding with the KV cache from `prompt` (starting with BOS) to `total` tokens."""
    cache = model.new_cache(1, total)
    logits = model(torch.tensor([prompt]), 0, cache)[0, -1]
    out = list(prompt)
    while len(out) < total:
        out.append(int(logits.argmax()))
        if len(out) < total:
            logits = model(torch.tensor([[out[-1]]]), len(out) - 1, cache)[0, -1]
    return out


@torch.no_grad()
def check_teacher(model, reference_path):
    """Asserts that greedy decoding (KV-cache path) and one full causal forward (training path)
    both reproduce the reference greedy ids."""
    ids = [int(t) for t in open(reference_path).read().split()]
    assert ids[:PROMPT_LEN] == PROMPT[1:], f"{reference_path}: prompt ids {ids[:PROMPT_LEN]}"
    seq = [BOS] + ids
    got = greedy(model, seq[: PROMPT_LEN + 1], len(seq))
    first_diff = next((i for i, (a, b) in enumerate(zip(got, seq)) if a != b), None)
    assert got == seq, f"teacher greedy ids differ from {reference_path} at position {first_diff}"
    logits = model(torch.tensor([seq[:-1]]))[0]
    forced = logits.argmax(-1)[PROMPT_LEN:].tolist()
    assert forced == seq[PROMPT_LEN + 1 :], "teacher-forced argmax differs from the reference"
    return len(ids)


@torch.no_grad()
def sample_stories(model, count, batch, max_len, gen, logp_dtype):
    """Samples `count` stories at temperature 1 from BOS. Returns (stories, log_probs): each story
    a LongTensor that starts with BOS and ends with the first EOS or BOS sampled, or is cut at
    max_len tokens; log_probs[i] [len - 1, vocab] holds the teacher's next-token log-probabilities
    at each position but the last, as computed while sampling (in logp_dtype)."""
    stories, log_probs = [], []
    for first in range(0, count, batch):
        b = min(batch, count - first)
        rows = torch.arange(b)  # story index of each live cache row
        cache = model.new_cache(b, max_len)
        tokens = torch.full((b, max_len), BOS, dtype=torch.long)
        logps = torch.empty((b, max_len - 1, model.cfg.vocab_size), dtype=logp_dtype)
        lengths = torch.full((b,), max_len, dtype=torch.long)
        current = torch.full((b,), BOS, dtype=torch.long)
        done = torch.zeros((b,), dtype=torch.bool)  # per live row: has it ended?
        for pos in range(max_len - 1):
            logp = torch.log_softmax(model(current[:, None], pos, cache)[:, 0], -1)
            logps[rows, pos] = logp.to(logp_dtype)
            nxt = torch.multinomial(logp.exp(), 1, generator=gen)[:, 0]
            tokens[rows, pos + 1] = nxt  # rows that already ended write past their length
            ended = ~done & ((nxt == EOS) | (nxt == BOS))
            lengths[rows[ended]] = pos + 2
            done |= ended
            if done.all():
                break
            if int(done.sum()) * 4 >= len(rows):  # drop ended rows once they are a quarter
                keep = ~done
                rows, nxt, done = rows[keep], nxt[keep], done[keep]
                cache = [(k[keep], v[keep]) for k, v in cache]
            current = nxt
        for i in range(b):
            n = int(lengths[i])
            stories.append(tokens[i, :n].clone())
            log_probs.append(logps[i, : n - 1].clone())
    return stories, log_probs


def pad_batch(stories, idx):
    """Right-pads stories[idx] -> (inputs [B, T], targets [B, T], mask [B, T]); T = longest - 1."""
    T = max(len(stories[i]) for i in idx) - 1
    inputs = torch.zeros((len(idx), T), dtype=torch.long)
    targets = torch.zeros((len(idx), T), dtype=torch.long)
    mask = torch.zeros((len(idx), T), dtype=torch.bool)
    for r, i in enumerate(idx):
        s = stories[i]
        n = len(s) - 1
        inputs[r, :n] = s[:-1]
        targets[r, :n] = s[1:]
        mask[r, :n] = True
    return inputs, targets, mask


def plan_batches(stories, batch_tokens, gen):
    """One epoch: shuffled, bucketed by length so a batch holds at most batch_tokens padded
    positions; the batch order is shuffled too."""
    order = torch.randperm(len(stories), generator=gen).tolist()
    chunk = 1024
    batches = []
    for start in range(0, len(order), chunk):
        group = sorted(order[start : start + chunk], key=lambda i: len(stories[i]))
        cur = []
        for i in group:  # ascending length: story i is the longest of its batch so far
            if cur and (len(stories[i]) - 1) * (len(cur) + 1) > batch_tokens:
                batches.append(cur)
                cur = []
            cur.append(i)
        if cur:
            batches.append(cur)
    perm = torch.randperm(len(batches), generator=gen).tolist()
    return [batches[p] for p in perm]


def length_batches(stories, batch_tokens):
    """Story indices sorted by length, cut into batches of at most batch_tokens padded input
    positions (at least one story per batch)."""
    order = sorted(range(len(stories)), key=lambda i: len(stories[i]))
    batches, cur = [], []
    for i in order:
        if cur and (len(cur) + 1) * (len(stories[i]) - 1) > batch_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


@torch.no_grad()
def teacher_log_probs(teacher, stories, batch_tokens):
    """Per story, the teacher's log-probabilities at each input position, [len - 1, vocab]."""
    out = [None] * len(stories)
    for idx in length_batches(stories, batch_tokens):
        inputs, _, _ = pad_batch(stories, idx)
        logp = torch.log_softmax(teacher(inputs), -1)
        for r, i in enumerate(idx):
            out[i] = logp[r, : len(stories[i]) - 1].clone()
    return out


# ----------------------------------------------------------------------------------------------
# Distillation


def distill_loss(student_logits, teacher_logp, targets, mask, ce_weight):
    """Token-averaged (1 - ce_weight) * KL(p_teacher || q_student) + ce_weight * CE(sampled)."""
    s_logp = torch.log_softmax(student_logits, -1)
    p = teacher_logp.exp()
    kl = (p * (teacher_logp - s_logp)).sum(-1)
    m = mask.float()
    n = m.sum()
    loss = (kl * m).sum() / n
    if ce_weight > 0:
        ce = -s_logp.gather(-1, targets[..., None])[..., 0]
        loss = (1 - ce_weight) * loss + ce_weight * (ce * m).sum() / n
    return loss


@torch.no_grad()
def evaluate(student, stories, t_logps, batch_tokens):
    """Held-out KL(p || q) in nats, top-1 agreement with the teacher's argmax and the expected
    acceptance of speculative sampling sum_x min(p, q), averaged over all positions."""
    totals = {"kl": 0.0, "top1": 0.0, "accept": 0.0, "ce": 0.0}
    count = 0
    for idx in length_batches(stories, batch_tokens):
        inputs, targets, mask = pad_batch(stories, idx)
        s_logp = torch.log_softmax(student(inputs), -1)
        for r, i in enumerate(idx):
            n = len(stories[i]) - 1
            t = t_logps[i]
            q = s_logp[r, :n]
            p = t.exp()
            totals["kl"] += (p * (t - q)).sum().item()
            totals["top1"] += (t.argmax(-1) == q.argmax(-1)).sum().item()
            totals["accept"] += torch.minimum(p, q.exp()).sum().item()
            totals["ce"] += -q.gather(-1, targets[r, :n, None]).sum().item()
            count += n
    return {k: v / count for k, v in totals.items()}


@torch.no_grad()
def greedy_agreement(student, teacher, reference_path):
    """Top-1 agreement along the teacher's reference greedy trajectory (what greedy speculative
    decoding from "Once upon a time" sees), over the generated positions."""
    ids = [int(t) for t in open(reference_path).read().split()]
    seq = torch.tensor([[BOS] + ids[:-1]])
    s = student(seq)[0, PROMPT_LEN:].argmax(-1)
    t = teacher(seq)[0, PROMPT_LEN:].argmax(-1)
    return (s == t).float().mean().item()


def expected_speedup(alpha, cost_ratio, k):
    """Expected speed-up of speculative decoding with k drafted tokens per step, per-token
    acceptance alpha (i.i.d.) and draft/target cost ratio cost_ratio (Leviathan et al. 2023)."""
    tokens = k + 1 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return tokens / (1 + k * cost_ratio)


def train_student(cfg, teacher, train, train_logps, heldout, heldout_logps, args, log):
    gen = torch.Generator().manual_seed(args.seed + 1000 + cfg.dim * 31 + cfg.n_layers)
    student = Llama(cfg).init_random(gen)
    if args.init_embedding == "teacher-pca":
        # the teacher's token embeddings projected on their top cfg.dim principal directions
        u, s, _ = torch.linalg.svd(teacher.tok_embeddings.detach(), full_matrices=False)
        assert cfg.dim <= s.numel(), "teacher-pca needs a student no wider than the teacher"
        with torch.no_grad():
            student.tok_embeddings.copy_(u[:, : cfg.dim] * s[: cfg.dim])
    decay = [getattr(student, n) for n, _ in tensor_layout(cfg) if not n.startswith("rms")]
    no_decay = [getattr(student, n) for n, _ in tensor_layout(cfg) if n.startswith("rms")]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    def lr_at(step):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        t = (step - args.warmup) / max(1, args.steps - args.warmup)
        cosine = 0.5 * (1 + math.cos(math.pi * t))
        return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * cosine)

    plan = []
    t0 = time.time()
    tokens_seen = 0
    history = []
    for step in range(args.steps):
        if not plan:
            plan = plan_batches(train, args.batch_tokens, gen)
        idx = plan.pop()
        inputs, targets, mask = pad_batch(train, idx)
        t_logp = torch.zeros((*inputs.shape, cfg.vocab_size))
        for r, i in enumerate(idx):
            t_logp[r, : len(train[i]) - 1] = train_logps[i].float()
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss = distill_loss(student(inputs), t_logp, targets, mask, args.ce_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), args.clip)
        opt.step()
        tokens_seen += int(mask.sum())
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            m = evaluate(student, heldout, heldout_logps, args.batch_tokens)
            history.append({"step": step + 1, **m})
            log(f"  [{cfg.short()}] step {step + 1}/{args.steps} loss {loss.item():.4f} "
                f"held-out KL {m['kl']:.4f} top-1 {m['top1']:.4f} accept {m['accept']:.4f} "
                f"({time.time() - t0:.0f} s, {tokens_seen / 1e6:.1f}M tokens)")
    return student, history, time.time() - t0, tokens_seen


def parse_shape(text, vocab, seq_len):
    """dim:n_layers:n_heads:n_kv_heads:hidden_dim -> Config."""
    dim, layers, heads, kv_heads, hidden = (int(v) for v in text.split(":"))
    return Config(dim, hidden, layers, heads, kv_heads, vocab, seq_len)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(here)
    model_dir = os.environ.get("SPECDEC_MODEL_DIR",
                               os.path.join(os.path.dirname(repo), "shared", "models"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--teacher", default=os.path.join(model_dir, "stories260K.bin"))
    ap.add_argument("--reference",
                    default=os.path.join(model_dir, "reference_greedy_once_upon_a_time.ids"))
    ap.add_argument("--out", default=os.path.join(here, "draft", "stories_draft.bin"))
    ap.add_argument("--metrics", default=os.path.join(here, "draft", "metrics.json"),
                    help="where to write the numbers as JSON ('' for nowhere)")
    ap.add_argument("--seed", type=int, default=260)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--train-stories", type=int, default=2560)
    ap.add_argument("--heldout-stories", type=int, default=192)
    ap.add_argument("--max-len", type=int, default=512,
                    help="story length cap in tokens, BOS included")
    ap.add_argument("--sample-batch", type=int, default=256)
    ap.add_argument("--shapes", default="32:2:4:2:86,32:3:4:2:86",
                    help="student shapes to try, comma-separated dim:layers:heads:kv_heads:hidden")
    ap.add_argument("--init-embedding", choices=("teacher-pca", "random"), default="teacher-pca",
                    help="student token embedding: the teacher's projected on its top principal "
                    "directions, or random")
    ap.add_argument("--steps", type=int, default=1200, help="optimiser steps per shape")
    ap.add_argument("--batch-tokens", type=int, default=4096, help="padded positions per batch")
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--min-lr-ratio", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--ce-weight", type=float, default=0.0,
                    help="weight of cross-entropy on the sampled tokens in the loss (0: pure KL)")
    ap.add_argument("--eval-every", type=int, default=300)
    ap.add_argument("--draft-k", type=int, default=4,
                    help="draft length used to rank shapes by expected greedy speed-up")
    ap.add_argument("--max-ratio", type=float, default=4.0,
                    help="a student must be at least this many times smaller than the teacher")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(args.seed)
    t_start = time.time()

    def log(msg):
        print(f"[{time.time() - t_start:7.1f} s] {msg}", flush=True)

    # 1. teacher
    teacher, rope_error = read_legacy(args.teacher)
    teacher.requires_grad_(False)
    tcfg = teacher.cfg
    assert rope_error < 1e-5, (f"{args.teacher}: RoPE tables differ from theta "
                               f"{tcfg.rope_theta} by {rope_error}")
    n_ref = check_teacher(teacher, args.reference)
    log(f"teacher {tcfg.short()}, {tcfg.parameter_count()} parameters; reproduces the {n_ref} "
        f"reference greedy ids (KV-cache and full-sequence paths); RoPE tables match to "
        f"{rope_error:.1e}")

    # 2. corpus, with the teacher's distributions kept from the sampling pass
    gen = torch.Generator().manual_seed(args.seed)
    max_len = min(args.max_len, tcfg.seq_len)
    t0 = time.time()
    train, train_logps = sample_stories(teacher, args.train_stories, args.sample_batch, max_len,
                                        gen, torch.float16)
    heldout, heldout_logps = sample_stories(teacher, args.heldout_stories, args.sample_batch,
                                            max_len, gen, torch.float32)
    sample_s = time.time() - t0
    lens = np.array([len(s) for s in train + heldout])
    capped = int((lens == max_len).sum())
    log(f"sampled {len(lens)} stories in {sample_s:.0f} s: {int(lens.sum())} tokens, length mean "
        f"{lens.mean():.0f} median {np.median(lens):.0f} max {lens.max()}, {capped} cut at "
        f"{max_len}; teacher log-probabilities kept (train float16, held-out float32)")
    few = list(range(min(8, len(heldout))))
    full = teacher_log_probs(teacher, [heldout[i] for i in few], args.batch_tokens)
    cache_diff = max((full[j] - heldout_logps[i]).abs().max().item() for j, i in enumerate(few))
    assert cache_diff < 1e-3, f"KV-cache and full-sequence teacher log-probs differ by {cache_diff}"
    log(f"KV-cache and full-sequence teacher log-probabilities agree to {cache_diff:.1e}")

    # 3. students
    results = []
    best = None
    for text in args.shapes.split(","):
        cfg = parse_shape(text, tcfg.vocab_size, tcfg.seq_len)
        ratio = tcfg.parameter_count() / cfg.parameter_count()
        if ratio < args.max_ratio:
            log(f"skipping {cfg.short()}: only {ratio:.2f}x smaller than the teacher")
            continue
        log(f"training {cfg.short()}: {cfg.parameter_count()} parameters ({ratio:.2f}x smaller)")
        student, history, train_s, tokens_seen = train_student(
            cfg, teacher, train, train_logps, heldout, heldout_logps, args, log)
        m = history[-1]
        cost = cfg.parameter_count() / tcfg.parameter_count()
        r = {
            "shape": dataclasses.asdict(cfg),
            "parameters": cfg.parameter_count(),
            "size_ratio": ratio,
            "heldout_kl": m["kl"],
            "heldout_top1_agreement": m["top1"],
            "heldout_expected_acceptance": m["accept"],
            "heldout_cross_entropy_sampled": m["ce"],
            "reference_greedy_top1_agreement": greedy_agreement(student, teacher, args.reference),
            "expected_greedy_speedup": expected_speedup(m["top1"], cost, args.draft_k),
            "expected_sampling_speedup": expected_speedup(m["accept"], cost, args.draft_k),
            "train_seconds": train_s,
            "train_tokens": tokens_seen,
            "history": history,
        }
        log(f"  -> KL {m['kl']:.4f}, top-1 {m['top1']:.4f}, accept {m['accept']:.4f}, reference "
            f"greedy top-1 {r['reference_greedy_top1_agreement']:.4f}, expected speed-up at k="
            f"{args.draft_k}: greedy {r['expected_greedy_speedup']:.3f}, sampling "
            f"{r['expected_sampling_speedup']:.3f}; {train_s:.0f} s")
        results.append(r)
        if best is None or r["expected_greedy_speedup"] > best[1]["expected_greedy_speedup"]:
            best = (student, r)
    assert best is not None, "no student shape within the size limit"

    # 4. export and re-read
    student, r = best
    size = write_legacy(student, args.out)
    assert size < 1 << 20, f"{args.out}: {size} bytes, must be under 1 MiB"
    reread, rope_err = read_legacy(args.out)
    assert rope_err == 0.0
    inputs, _, _ = pad_batch(heldout, list(range(min(16, len(heldout)))))
    with torch.no_grad():
        diff = (reread(inputs) - student(inputs)).abs().max().item()
    assert diff <= 1e-6, f"{args.out}: re-read logits differ by {diff}"
    log(f"wrote {args.out} ({size} bytes, {r['shape']['dim']}-dim {r['shape']['n_layers']}-layer); "
        f"re-read logits match (max |diff| {diff:.1e})")

    summary = {
        "argv": sys.argv,
        "torch": torch.__version__,
        "threads": args.threads,
        "teacher_parameters": tcfg.parameter_count(),
        "student_parameters": r["parameters"],
        "chosen": r,
        "candidates": results,
        "corpus": {"train_stories": len(train), "heldout_stories": len(heldout),
                   "train_tokens": int(sum(len(s) - 1 for s in train)),
                   "heldout_positions": int(sum(len(s) - 1 for s in heldout)),
                   "mean_length": float(lens.mean()), "capped": capped,
                   "sample_seconds": sample_s},
        "file_bytes": size,
        "reread_max_abs_diff": diff,
        "total_seconds": time.time() - t_start,
    }
    if args.metrics:
        with open(args.metrics, "w") as f:
            json.dump(summary, f, indent=1)
    log(f"done: teacher {tcfg.parameter_count()} parameters, student {r['parameters']} "
        f"({r['size_ratio']:.2f}x smaller); held-out KL {r['heldout_kl']:.4f} nats, top-1 "
        f"agreement {r['heldout_top1_agreement']:.4f}, expected acceptance "
        f"{r['heldout_expected_acceptance']:.4f}; "
        f"total {summary['total_seconds']:.0f} s")


if __name__ == "__main__":
    main()
