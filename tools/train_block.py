#!/usr/bin/env python3
"""Trains block drafters for the stories260K fixture: a DFlash-style drafter (a whole block of
draft tokens in one forward, conditioned on the target's features) and DSpark's additions to it
(a low-rank Markov head and a confidence head).

The drafter and its file format are described in tools/block/README.md. Data: stories the frozen
target samples at temperature 1 (as tools/train_eagle.py), the target's residual streams after
layers 0, 2 and 4 at every position (the context features), and the target's greedy
continuation at every position (the confidence head's labels, the held-out evaluation).

Two phases: the drafter's body (DFlash: the fused context, the mask embedding, the layers, the
final norm) is trained on blocks anchored at random positions of the stories, cross-entropy at
every block position against the story's tokens, weighted decay^(i - 1); then, with the body
frozen, the Markov head (teacher-forced on the story's previous token) and the confidence head
(the probability that position i's greedy draft is the target's greedy token, given the earlier
positions right). The body alone is written as tools/block/dflash, body and heads as
tools/block/dspark.

    OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 tools/train_block.py
"""

import argparse
import dataclasses
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from training import safetensors  # noqa: E402
from training.llama import BOS, EOS, apply_rope, read_legacy, rms_norm, rope_tables  # noqa: E402
from training.runtime import keep_freed_memory, sha256, warmup_cosine  # noqa: E402
from training.teacher import (check_teacher, greedy, greedy_chains, length_batches,  # noqa: E402
                              sample_continuations)
from training.tokenizer import Tokenizer  # noqa: E402

GOLDEN_ROWS = 12


def _linear_init(out_features, in_features, gen):
    bound = 1.0 / math.sqrt(in_features)
    return (torch.rand(out_features, in_features, generator=gen) * 2 - 1) * bound


class BlockDrafter(torch.nn.Module):
    """A block drafter (tools/block/README.md).

    Context row j (a committed token whose target feature f_j exists): c_j = rms(fc f_j,
    hidden_norm) at position j. Block rows i = 0..B-1 at positions t + i: row 0 holds the
    embedding of the root x_t (the token the target chose last), rows 1.. the mask embedding.
    Each layer: a = rms(h, input_norm); q, k, v of the block rows from a, k, v of the context rows
    from c (the same projections); every block row sees every context row and every block row
    (no causal mask inside the block); h = h + o_proj(attention); h = h + mlp(rms(h, post_norm)).
    Row i >= 1 drafts x_{t+i}: logits = E @ rms(h_i, norm) (the target's tied classifier).
    DSpark: plus the Markov bias markov_out @ markov_in[prev] (prev: the root for row 1, the
    token drafted at row i - 1 after), and the confidence sigmoid(w . [rms(h_i, norm), E[y_i]]
    + position_bias[i - 1]) of the token y_i drafted at row i.
    """

    def __init__(self, cfg, embedding, layers, block, n_layers, rank, gen):
        super().__init__()
        self.cfg, self.block, self.n_layers, self.rank = cfg, block, n_layers, rank
        self.feature_layers = tuple(layers)
        d, nh, nkv, hs, hid = cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_size, cfg.hidden_dim
        self.register_buffer("embedding", embedding.detach().clone(), persistent=False)
        cos, sin = rope_tables(dataclasses.replace(cfg, seq_len=cfg.seq_len + block))
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        P = torch.nn.Parameter
        self.fc = P(_linear_init(d, len(layers) * d, gen))
        self.hidden_norm = P(torch.ones(d))
        self.mask_embedding = P(torch.randn(d, generator=gen) * embedding.std())
        self.layers = torch.nn.ModuleList()
        for _ in range(n_layers):
            m = torch.nn.Module()
            m.input_norm = P(torch.ones(d))
            m.wq = P(_linear_init(nh * hs, d, gen))
            m.wk = P(_linear_init(nkv * hs, d, gen))
            m.wv = P(_linear_init(nkv * hs, d, gen))
            m.wo = P(_linear_init(d, nh * hs, gen))
            m.post_norm = P(torch.ones(d))
            m.gate = P(_linear_init(hid, d, gen))
            m.up = P(_linear_init(hid, d, gen))
            m.down = P(_linear_init(d, hid, gen))
            self.layers.append(m)
        self.norm = P(torch.ones(d))
        V = embedding.shape[0]
        self.markov_in = P(torch.randn(V, rank, generator=gen) * 0.02)
        self.markov_out = P(torch.zeros(V, rank))
        self.confidence = P(torch.zeros(2 * d))
        self.confidence_bias = P(torch.zeros(block - 1))

    def body(self):
        return [p for n, p in self.named_parameters()
                if not n.startswith(("markov", "confidence"))]

    def heads(self):
        return [self.markov_in, self.markov_out, self.confidence, self.confidence_bias]

    @property
    def scale(self):
        return 1.0 / math.sqrt(self.cfg.head_size)

    def context(self, feats):
        """feats [B, L, F] -> per layer (k, v) [B, L, n_heads, hs] of the context rows."""
        c = self.cfg
        ctx = rms_norm(F.linear(feats, self.fc), self.hidden_norm, c.rms_eps)
        L = feats.shape[1]
        cos, sin = self.rope_cos[:L], self.rope_sin[:L]
        rep = c.n_heads // c.n_kv_heads
        out = []
        for m in self.layers:
            k = apply_rope(F.linear(ctx, m.wk).unflatten(-1, (c.n_kv_heads, c.head_size)), cos,
                           sin)
            v = F.linear(ctx, m.wv).unflatten(-1, (c.n_kv_heads, c.head_size))
            out.append((k.repeat_interleave(rep, -2), v.repeat_interleave(rep, -2)))
        return out

    def blocks(self, kv, roots, t):
        """kv: `context`'s output over [B, L]; roots [B, A] the root tokens x_t of A blocks per
        sequence, t [B, A] their positions (block b, a sees context rows 0..t-1).
        Returns rms(h, norm) of every block row, [B, A, block, dim]."""
        c, Bk = self.cfg, self.block
        B, A = roots.shape
        h = self.mask_embedding.expand(B, A, Bk, c.dim).clone()
        h[:, :, 0] = self.embedding[roots]
        pos = t[..., None] + torch.arange(Bk)  # [B, A, Bk]
        cos, sin = self.rope_cos[pos], self.rope_sin[pos]
        L = kv[0][0].shape[1]
        ctx_mask = torch.where(torch.arange(L)[None, None, :] < t[..., None], 0.0,
                               float("-inf"))[:, :, None, None, :]  # [B, A, 1, 1, L]
        rep = c.n_heads // c.n_kv_heads
        for m, (kc, vc) in zip(self.layers, kv):
            a = rms_norm(h, m.input_norm, c.rms_eps)
            q = apply_rope(F.linear(a, m.wq).unflatten(-1, (c.n_heads, c.head_size)), cos, sin)
            k = apply_rope(F.linear(a, m.wk).unflatten(-1, (c.n_kv_heads, c.head_size)), cos, sin)
            v = F.linear(a, m.wv).unflatten(-1, (c.n_kv_heads, c.head_size))
            k, v = k.repeat_interleave(rep, -2), v.repeat_interleave(rep, -2)
            s_ctx = torch.einsum("baihd,blhd->bahil", q, kc) * self.scale + ctx_mask
            s_own = torch.einsum("baihd,bajhd->bahij", q, k) * self.scale
            p = torch.softmax(torch.cat((s_ctx, s_own), -1), -1)
            o = (torch.einsum("bahil,blhd->baihd", p[..., :L], vc)
                 + torch.einsum("bahij,bajhd->baihd", p[..., L:], v))
            h = h + F.linear(o.flatten(-2), m.wo)
            n = rms_norm(h, m.post_norm, c.rms_eps)
            h = h + F.linear(F.silu(F.linear(n, m.gate)) * F.linear(n, m.up), m.down)
        return rms_norm(h, self.norm, c.rms_eps)

    def logits(self, out):
        return out @ self.embedding.T

    def markov(self, prev):
        """prev [...] -> the Markov bias [..., V] of the next position."""
        return self.markov_in[prev] @ self.markov_out.T

    def confidence_logit(self, out, tokens, i):
        """out [..., dim] of rows i (1-based block rows, [...] or scalar), tokens [...] drafted
        there -> the confidence logit."""
        x = torch.cat((out, self.embedding[tokens]), -1)
        return x @ self.confidence + self.confidence_bias[i - 1]

    def draft(self, out, root, markov=True):
        """Greedy drafting from one block's rows out [block, dim] with root token `root`: returns
        (tokens [block - 1], logits [block - 1, V] as drafted, confidence [block - 1])."""
        toks, rows, conf = [], [], []
        prev = root
        lg = self.logits(out[1:])
        for i in range(1, self.block):
            row = lg[i - 1] + (self.markov(torch.tensor(prev)) if markov else 0)
            y = int(row.argmax())
            rows.append(row)
            conf.append(torch.sigmoid(self.confidence_logit(out[i], torch.tensor(y), i)))
            toks.append(y)
            prev = y
        return toks, torch.stack(rows), torch.stack(conf)

    # -- files --------------------------------------------------------------------------------

    def tensors(self, dspark):
        out = {"fc.weight": self.fc, "hidden_norm.weight": self.hidden_norm,
               "mask_embedding": self.mask_embedding}
        for l, m in enumerate(self.layers):
            p = f"layers.{l}."
            out.update({
                f"{p}input_layernorm.weight": m.input_norm,
                f"{p}self_attn.q_proj.weight": m.wq, f"{p}self_attn.k_proj.weight": m.wk,
                f"{p}self_attn.v_proj.weight": m.wv, f"{p}self_attn.o_proj.weight": m.wo,
                f"{p}post_attention_layernorm.weight": m.post_norm,
                f"{p}mlp.gate_proj.weight": m.gate, f"{p}mlp.up_proj.weight": m.up,
                f"{p}mlp.down_proj.weight": m.down})
        out["norm.weight"] = self.norm
        if dspark:
            out.update({"markov_head.in": self.markov_in, "markov_head.out": self.markov_out,
                        "confidence_head.weight": self.confidence,
                        "confidence_head.position_bias": self.confidence_bias})
        return {k: v.detach().clone() for k, v in out.items()}

    def load(self, tensors, dspark):
        mine = self.tensors(dspark)
        assert list(tensors) == list(mine), f"tensor names or order differ: {list(tensors)}"
        with torch.no_grad():
            for (name, t), p in zip(tensors.items(), self._params(dspark)):
                assert t.shape == p.shape, f"{name}: {t.shape}"
                p.copy_(t)
        return self

    def _params(self, dspark):
        out = [self.fc, self.hidden_norm, self.mask_embedding]
        for m in self.layers:
            out += [m.input_norm, m.wq, m.wk, m.wv, m.wo, m.post_norm, m.gate, m.up, m.down]
        out.append(self.norm)
        if dspark:
            out += self.heads()
        return out

    def config(self, base, dspark):
        c = self.cfg
        out = {"architectures": ["DSparkDraftModel" if dspark else "DFlashDraftModel"],
               "model_type": "llama", "hidden_act": "silu", "hidden_size": c.dim,
               "intermediate_size": c.hidden_dim, "num_attention_heads": c.n_heads,
               "num_key_value_heads": c.n_kv_heads, "num_hidden_layers": self.n_layers,
               "rms_norm_eps": c.rms_eps, "rope_theta": c.rope_theta,
               "max_position_embeddings": c.seq_len, "vocab_size": c.vocab_size,
               "block_size": self.block, "target_layer_outputs": list(self.feature_layers),
               "rope_style": "interleaved", "tie_word_embeddings": True,
               "torch_dtype": "float32", "base_model_name_or_path": base}
        if dspark:
            out["markov_rank"] = self.rank
        return out


# ----------------------------------------------------------------------------------------------
# Data


class Batch:
    """Right-padded stories: tokens [B, L], lengths [B], features [B, L, 3 dim], final [B, L, dim]
    (the target's final hidden state: its logits at s are final[:, s] @ E^T, its distribution of
    token s + 1), chains [B, L, depth] (the target's greedy continuation of tokens[:, :s + 1])."""

    def __init__(self, tokens, lengths, features, final, chains):
        self.tokens, self.lengths, self.features = tokens, lengths, features
        self.final, self.chains = final, chains


@torch.no_grad()
def build_batches(target, stories, layers, batch_tokens, depth):
    out = []
    for idx in length_batches(stories, batch_tokens):
        L = max(len(stories[i]) for i in idx)
        tokens = torch.zeros((len(idx), L), dtype=torch.long)
        for r, i in enumerate(idx):
            tokens[r, : len(stories[i])] = stories[i]
        lengths = torch.tensor([len(stories[i]) for i in idx])
        final, res = target.hidden_and_residuals(tokens, layers)
        _, chains = greedy_chains(target, tokens, depth)
        out.append(Batch(tokens, lengths, torch.cat(res, -1), final, chains))
    return out


def anchors(batch, count, gen):
    """count random anchors per story: t [B, A] in [1, length - 2] (row 1's label exists)."""
    B = batch.tokens.shape[0]
    span = (batch.lengths - 2).clamp(min=1).double()
    u = torch.rand((B, count), generator=gen, dtype=torch.float64)
    return 1 + (u * span[:, None]).long()


def gather(t, idx):
    """t [B, L, ...], idx [B, ...] -> t[b, idx[b, ...]] (indices clamped to the length)."""
    idx = idx.clamp(max=t.shape[1] - 1)
    flat = idx.reshape(idx.shape[0], -1)
    out = torch.stack([t[b, flat[b]] for b in range(t.shape[0])])
    return out.reshape(*idx.shape, *t.shape[2:])


def block_labels(batch, t, block):
    """Labels of block rows 1..block-1 anchored at t [B, A]: the story's x_{t+i} [B, A, block-1],
    valid [B, A, block-1] where t + i < length."""
    i = torch.arange(1, block)
    pos = t[..., None] + i
    valid = pos < batch.lengths[:, None, None]
    return gather(batch.tokens, pos), valid


def block_targets(batch, t, block, labels, E):
    """The training targets of rows 1..block-1: with soft labels the target's distribution of
    x_{t+i} given the story up to x_{t+i-1} ([B, A, block-1, V]), else the tokens `labels`."""
    if labels is None:
        pos = t[..., None] + torch.arange(0, block - 1)
        return torch.softmax(gather(batch.final, pos) @ E.T, -1)
    return labels


# ----------------------------------------------------------------------------------------------
# Training


def train(model, batches, held, args, log):
    gen = torch.Generator().manual_seed(args.seed + 1)
    Bk = model.block
    history = []

    def run_phase(name, params, steps, lr, step_fn):
        opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
        lr_at = warmup_cosine(lr, args.warmup, steps, args.min_lr_ratio)
        order, cursor, t0 = torch.randperm(len(batches), generator=gen).tolist(), 0, time.time()
        for step in range(steps):
            if cursor == len(order):
                order, cursor = torch.randperm(len(batches), generator=gen).tolist(), 0
            b = batches[order[cursor]]
            cursor += 1
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            loss, parts = step_fn(b)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, args.clip)
            opt.step()
            if (step + 1) % args.eval_every == 0 or step + 1 == steps:
                m = evaluate(model, held, markov=name == "heads")
                history.append({"phase": name, "step": step + 1, "train_loss": loss.item(),
                                "parts": parts, "heldout": m, "seconds": time.time() - t0})
                log(f"  [{name}] step {step + 1}/{steps} loss {loss.item():.3f}; held-out "
                    "acceptance " + " ".join(f"{a:.3f}" for a in m["acceptance"])
                    + f", chain {m['expected_chain_length']:.3f} ({time.time() - t0:.0f} s)")
        return time.time() - t0

    weights = torch.tensor([args.decay ** i for i in range(Bk - 1)])

    soft = args.labels == "soft"

    def targets(b, t, labels):
        y = block_targets(b, t, Bk, None if soft else labels, model.embedding)
        return y.flatten(0, 2) if soft else y.flatten()

    def body_step(b):
        t = anchors(b, args.anchors, gen)
        out = model.blocks(model.context(b.features), gather(b.tokens, t), t)
        labels, valid = block_labels(b, t, Bk)
        ce = F.cross_entropy(model.logits(out[:, :, 1:]).flatten(0, 2), targets(b, t, labels),
                             reduction="none").view(labels.shape)
        w = weights * valid
        per = (ce * valid).sum((0, 1)) / valid.sum((0, 1)).clamp(min=1)
        return (ce * w).sum() / w.sum(), per.tolist()

    def heads_step(b):
        t = anchors(b, args.anchors, gen)
        out = model.blocks(model.context(b.features), gather(b.tokens, t), t)
        lg = model.logits(out[:, :, 1:])
        labels, valid = block_labels(b, t, Bk)
        prev = torch.cat((gather(b.tokens, t)[..., None], labels[..., :-1]), -1)
        ce = F.cross_entropy((lg + model.markov(prev)).flatten(0, 2), targets(b, t, labels),
                             reduction="none").view(labels.shape)
        ce = (ce * valid).sum() / valid.sum()
        # confidence: the greedy draft with the target's greedy prefix as the Markov context
        chain = gather(b.chains, t)[..., : Bk - 1]  # [B, A, Bk-1] y_1..y_{Bk-1} after x_t
        gprev = torch.cat((gather(b.tokens, t)[..., None], chain[..., :-1]), -1)
        with torch.no_grad():
            y = (lg + model.markov(gprev)).argmax(-1)
        hit = (y == chain).float()
        z = model.confidence_logit(out[:, :, 1:].detach(), y, torch.arange(1, Bk))
        bce = F.binary_cross_entropy_with_logits(z, hit)
        return ce + bce, [ce.item(), bce.item()]

    log(f"body: {sum(p.numel() for p in model.body())} parameters, {args.body_steps} steps")
    body_s = run_phase("body", model.body(), args.body_steps, args.lr, body_step)
    body_eval = evaluate(model, held, markov=False)
    dflash = {k: v.clone() for k, v in model.state_dict().items()}
    log(f"DSpark: {sum(p.numel() for p in model.heads())} head parameters ({args.dspark_body} "
        f"body), {args.head_steps} steps")
    params = model.heads()
    if args.dspark_body == "joint":
        params = params + model.body()
    else:
        for p in model.body():
            p.requires_grad_(False)
    heads_s = run_phase("heads", params, args.head_steps, args.head_lr, heads_step)
    return history, body_s, heads_s, body_eval, dflash


@torch.no_grad()
def evaluate(model, held, markov):
    """Greedy acceptance on held-out stories, a block anchored at every position t in
    [1, length - 2]: acceptance[i] = P(row i's greedy draft is the target's greedy token | rows
    < i right), the Markov head fed the target's greedy tokens (equal to the drafts whenever the
    earlier rows were right, the only rows counted); the confidence head's calibration (mean
    confidence and hit rate per decile) over the counted rows."""
    Bk = model.block
    hit = torch.zeros(Bk - 1, dtype=torch.float64)
    seen = torch.zeros(Bk - 1, dtype=torch.float64)
    bins = torch.zeros(10, 3, dtype=torch.float64)  # count, sum confidence, hits
    for b in held:
        B, L = b.tokens.shape
        t = torch.arange(1, L - 1).expand(B, -1)
        out = model.blocks(model.context(b.features), gather(b.tokens, t), t)
        lg = model.logits(out[:, :, 1:])
        chain = gather(b.chains, t)[..., : Bk - 1]
        prev = torch.cat((gather(b.tokens, t)[..., None], chain[..., :-1]), -1)
        if markov:
            lg = lg + model.markov(prev)
        y = lg.argmax(-1)
        ok = y == chain
        alive = (t < (b.lengths[:, None] - 1))  # the root is not the story's last token
        conf = torch.sigmoid(model.confidence_logit(out[:, :, 1:], y, torch.arange(1, Bk)))
        for i in range(Bk - 1):
            seen[i] += alive.sum()
            hit[i] += (alive & ok[..., i]).sum()
            if markov:
                c = conf[..., i][alive]
                h = ok[..., i][alive].double()
                k = (c * 10).long().clamp(max=9)
                bins[:, 0] += torch.bincount(k, minlength=10)
                bins[:, 1] += torch.bincount(k, weights=c.double(), minlength=10)
                bins[:, 2] += torch.bincount(k, weights=h, minlength=10)
            alive = alive & ok[..., i]
    acc = (hit / seen.clamp(min=1)).tolist()
    expected, p = 1.0, 1.0
    for a in acc:
        p *= a
        expected += p
    out = {"acceptance": acc, "expected_chain_length": expected}
    if markov:
        out["calibration"] = [{"bin": i / 10, "count": int(bins[i, 0]),
                               "mean_confidence": float(bins[i, 1] / max(1, bins[i, 0])),
                               "hit_rate": float(bins[i, 2] / max(1, bins[i, 0]))}
                              for i in range(10)]
        n = bins[:, 0].sum()
        out["expected_calibration_error"] = float(
            sum(abs(bins[i, 1] - bins[i, 2]) for i in range(10)) / max(1, n))
    return out


@torch.no_grad()
def simulate(model, target, sequences, new_tokens, markov):
    """Greedy speculative decoding with a chain of block - 1 drafts per step (specdec's loop:
    prefill prompt[:-1]; each step, root x_t, one block from the context rows 0..t-1; the matching
    prefix is accepted plus one token); `sequences` are (prompt length, greedy continuation)."""
    steps = accepted = tokens = 0
    per_depth = [0] * (model.block - 1)
    for P, seq in sequences:
        s = torch.tensor([seq])
        _, res = target.hidden_and_residuals(s, model.feature_layers)
        kv = model.context(torch.cat(res, -1))
        t_all = torch.arange(P - 1, len(seq) - model.block)[None]
        out = model.blocks(kv, s[:, t_all[0]], t_all)[0]
        t, emitted, done = P - 1, 0, False
        while not done:
            toks, _, _ = model.draft(out[t - (P - 1)], seq[t], markov)
            m = 0
            while m < len(toks) and toks[m] == seq[t + 1 + m]:
                m += 1
            for d in range(m):
                per_depth[d] += 1
            steps += 1
            accepted += m
            for tok in seq[t + 1 : t + m + 2]:
                emitted += 1
                if tok == EOS or emitted == new_tokens:
                    done = True
                    break
            t += m + 1
        tokens += emitted
    return {"mean_accepted_length": (accepted + steps) / steps, "steps": steps,
            "accepted": accepted, "tokens": tokens,
            "acceptance_at_depth": [c / steps for c in per_depth]}


# ----------------------------------------------------------------------------------------------
# Files


def export(model, out_dir, base, dspark):
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "model.safetensors")
    size = safetensors.write(path, model.tensors(dspark), "F32", {"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(model.config(base, dspark), f, indent=2)
        f.write("\n")
    return {"bytes": size, "sha256": sha256(path)}


def reload(out_dir, target, dspark):
    cfg = json.load(open(os.path.join(out_dir, "config.json")))
    m = BlockDrafter(target.cfg, target.tok_embeddings, cfg["target_layer_outputs"],
                     cfg["block_size"], cfg["num_hidden_layers"], cfg.get("markov_rank", 1),
                     torch.Generator().manual_seed(0))
    assert m.config(cfg["base_model_name_or_path"], dspark) == cfg, f"{out_dir}: config differs"
    tensors, _, _ = safetensors.read(os.path.join(out_dir, "model.safetensors"))
    return m.load(tensors, dspark).requires_grad_(False)


@torch.no_grad()
def write_golden(model, target, seq, out_dir, dspark):
    """golden.safetensors: the context rows of seq[0..T-1] (T = len(seq) - 1), one block with
    root seq[T] at position T, and the greedy chain drafted from it."""
    T = len(seq) - 1
    s = torch.tensor([seq])
    _, res = target.hidden_and_residuals(s[:, :T], model.feature_layers)
    feats = torch.cat(res, -1)
    out = model.blocks(model.context(feats), s[:, T:], torch.tensor([[T]]))[0, 0]
    toks, rows, conf = model.draft(out, seq[T], markov=dspark)
    i32 = lambda x: torch.tensor(x, dtype=torch.int32)
    tensors = {"sequence": i32(seq), "features": feats[0], "block_out": out,
               "block_logits": model.logits(out[1:]), "chain_tokens": i32(toks)}
    if dspark:
        tensors["chain_logits"] = rows
        tensors["chain_confidence"] = conf
    path = os.path.join(out_dir, "golden.safetensors")
    size = safetensors.write(path, tensors, "F32", {"format": "pt"})
    return {"bytes": size, "sha256": sha256(path), "rows": T, "chain": toks}


# ----------------------------------------------------------------------------------------------


def parser():
    here = os.path.dirname(os.path.abspath(__file__))
    shared = os.path.join(os.path.dirname(os.path.dirname(here)), "shared")
    model_dir = os.environ.get("SPECDEC_MODEL_DIR", os.path.join(shared, "models"))
    data_dir = os.environ.get("SPECDEC_DATA_DIR", os.path.join(shared, "data"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--target", default=os.path.join(model_dir, "stories260K.bin"))
    ap.add_argument("--reference",
                    default=os.path.join(model_dir, "reference_greedy_once_upon_a_time.ids"))
    ap.add_argument("--tokenizer", default=os.path.join(model_dir, "tok512.bin"))
    ap.add_argument("--prompts", default=os.path.join(data_dir, "tinystories_prompts.jsonl"))
    ap.add_argument("--out-dir", default=os.path.join(here, "block"))
    ap.add_argument("--seed", type=int, default=26)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layers", default="0,2,4", help="target layers whose outputs are fused")
    ap.add_argument("--block", type=int, default=8, help="block rows (drafts block - 1 tokens)")
    ap.add_argument("--draft-layers", type=int, default=2)
    ap.add_argument("--markov-rank", type=int, default=32)
    ap.add_argument("--bos-stories", type=int, default=2048)
    ap.add_argument("--prompt-stories", type=int, default=32)
    ap.add_argument("--heldout-stories", type=int, default=128)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--sample-batch", type=int, default=256)
    ap.add_argument("--batch-tokens", type=int, default=4096)
    ap.add_argument("--anchors", type=int, default=48, help="blocks per story per step")
    ap.add_argument("--body-steps", type=int, default=2000)
    ap.add_argument("--head-steps", type=int, default=1000,
                    help="DSpark steps (the heads, from the DFlash body)")
    ap.add_argument("--dspark-body", choices=("joint", "frozen"), default="joint",
                    help="whether the DSpark phase trains the body with the heads or keeps the "
                         "DFlash body")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--head-lr", type=float, default=3e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--decay", type=float, default=0.8, help="loss weight of row i: decay^(i-1)")
    ap.add_argument("--labels", choices=("soft", "sampled"), default="soft",
                    help="row i's target: the target's distribution of x_{t+i} given the story "
                         "before it (soft), or the story's token")
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--new-tokens", type=int, default=128)
    return ap


def main():
    args = parser().parse_args()
    layers = tuple(int(x) for x in args.layers.split(","))
    keep_freed_memory()
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(args.seed)
    t_start = time.time()

    def log(msg):
        print(f"[{time.time() - t_start:7.1f} s] {msg}", flush=True)

    target, rope_error = read_legacy(args.target)
    target.requires_grad_(False)
    assert rope_error < 1e-5, f"{args.target}: RoPE tables differ by {rope_error}"
    n_ref = check_teacher(target, args.reference)
    log(f"target reproduces the {n_ref} reference greedy ids")
    tok = Tokenizer(args.tokenizer)
    prompts = [tok.encode(json.loads(line)["prompt"]) for line in open(args.prompts)
               if line.strip()]

    gen = torch.Generator().manual_seed(args.seed)
    t0 = time.time()
    train_stories = sample_continuations(target, [BOS], args.bos_stories, args.sample_batch,
                                         args.max_len, gen)
    for p in prompts:
        if args.prompt_stories > 0:
            train_stories += sample_continuations(target, p, args.prompt_stories,
                                                  args.sample_batch, args.max_len, gen)
    heldout = sample_continuations(target, [BOS], args.heldout_stories, args.sample_batch,
                                   args.max_len, gen)
    sample_s = time.time() - t0
    log(f"sampled {len(train_stories)} training and {len(heldout)} held-out stories in "
        f"{sample_s:.0f} s ({sum(map(len, train_stories))} + {sum(map(len, heldout))} tokens)")
    t0 = time.time()
    batches = build_batches(target, train_stories, layers, args.batch_tokens, args.block - 1)
    held = build_batches(target, heldout, layers, args.batch_tokens, args.block - 1)
    feature_s = time.time() - t0
    log(f"features and greedy continuations: {len(batches)} + {len(held)} batches in "
        f"{feature_s:.0f} s")
    story = heldout[0]
    b0 = next(b for b in held for r in range(len(b.tokens))
              if b.lengths[r] == len(story) and torch.equal(b.tokens[r, : len(story)], story))
    r0 = next(r for r in range(len(b0.tokens))
              if b0.lengths[r] == len(story) and torch.equal(b0.tokens[r, : len(story)], story))
    check = [greedy(target, story[: s + 1].tolist(), s + args.block)[s + 1:]
             for s in range(1, len(story) - 1, 11)]
    assert check == b0.chains[r0, 1 : len(story) - 1 : 11].tolist(), \
        "greedy continuations differ from KV-cache greedy decoding"

    gen_init = torch.Generator().manual_seed(args.seed + 2)
    model = BlockDrafter(target.cfg, target.tok_embeddings, layers, args.block, args.draft_layers,
                         args.markov_rank, gen_init)
    history, body_s, heads_s, body_eval, dflash_state = train(model, batches, held, args, log)
    model.requires_grad_(False)
    final_eval = evaluate(model, held, markov=True)
    body = BlockDrafter(target.cfg, target.tok_embeddings, layers, args.block, args.draft_layers,
                        args.markov_rank, gen_init)
    body.load_state_dict(dflash_state)
    body.requires_grad_(False)

    seqs = [(len(p), greedy(target, p, len(p) + args.new_tokens + 2 * args.block + 1))
            for p in prompts]
    sim_dflash = simulate(body, target, seqs, args.new_tokens, markov=False)
    sim_dspark = simulate(model, target, seqs, args.new_tokens, markov=True)
    log(f"fixture prompts, greedy chain of {args.block - 1}: DFlash "
        f"{sim_dflash['mean_accepted_length']:.3f}, DSpark {sim_dspark['mean_accepted_length']:.3f}"
        " tokens per target forward")

    base = os.path.basename(args.target)
    golden_seq = [BOS] + [int(x) for x in open(args.reference).read().split()][:GOLDEN_ROWS]
    files = {}
    for name, dspark in (("dflash", False), ("dspark", True)):
        m = model if dspark else body
        out = os.path.join(args.out_dir, name)
        files[name] = export(m, out, base, dspark)
        reread = reload(out, target, dspark)
        diff = 0.0
        for b in held[:2]:
            t = torch.arange(1, b.tokens.shape[1] - 1).expand(b.tokens.shape[0], -1)
            o1 = m.blocks(m.context(b.features), gather(b.tokens, t), t)
            o2 = reread.blocks(reread.context(b.features), gather(b.tokens, t), t)
            diff = max(diff, (o1 - o2).abs().max().item())
            if dspark:
                diff = max(diff, (m.markov(b.tokens) - reread.markov(b.tokens)).abs().max()
                           .item())
        assert diff == 0.0, f"{out}: re-read drafter differs by {diff}"
        files[name]["golden"] = write_golden(reread, target, golden_seq, out, dspark)
        log(f"wrote {out} ({files[name]['bytes']} bytes) and its golden vectors")

    summary = {"argv": sys.argv, "torch": torch.__version__, "args": vars(args),
               "corpus": {"train_stories": len(train_stories), "heldout_stories": len(heldout),
                          "train_tokens": sum(map(len, train_stories)),
                          "heldout_tokens": sum(map(len, heldout)), "sample_seconds": sample_s,
                          "feature_seconds": feature_s},
               "parameters": {"body": sum(p.numel() for p in model.body()),
                              "heads": sum(p.numel() for p in model.heads())},
               "body_seconds": body_s, "heads_seconds": heads_s, "history": history,
               "heldout_dflash": body_eval, "heldout_dspark": final_eval,
               "simulation_dflash": sim_dflash, "simulation_dspark": sim_dspark, "files": files,
               "total_seconds": time.time() - t_start}
    with open(os.path.join(args.out_dir, "metrics.json"), "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    log(f"done in {summary['total_seconds']:.0f} s")


if __name__ == "__main__":
    main()
