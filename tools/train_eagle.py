#!/usr/bin/env python3
"""Train EAGLE-1 and EAGLE-3 draft heads for the stories260K fixture by self-distillation.

1. Load the target (llama2.c legacy checkpoint) and check it reproduces the fixture's reference
   greedy ids; it stays frozen throughout.
2. Sample stories from the target at temperature 1, from BOS and from each fixture prompt, and
   hold out more stories from BOS. One target forward per story gives, at every position, the
   residual streams at the output of the chosen layers (EAGLE-3's feature) and the final hidden
   state after the final RMSNorm (EAGLE-1's feature; the target's logits are it times the
   embedding). The held-out stories also get the target's greedy continuation at every position.
3. Train an EAGLE-1 head (fc over concat(E[x_{i+1}], f_i), one decoder layer without input norm,
   logits through the target's classifier; smooth-L1 on the next feature + 0.1 x cross-entropy)
   and an EAGLE-3 head (fc over three layers' residual streams, a decoder layer whose attention
   reads concat(norm(E[x_{i+1}]), norm(h)), final norm, own LM head; cross-entropy only, with the
   training-time test: the head runs several steps on its own outputs).
4. Measure on the held-out stories the per-depth acceptance of a greedy chain (depth d's top-1
   against the target's greedy token, given depths 1..d-1 matched), and simulate greedy
   speculative decoding on the fixture prompts with a chain and with EAGLE-2 dynamic trees
   (depth D, top-K per expansion, N nodes by path probability), the tree's D and K chosen on
   greedy continuations of held-out starts.
5. Export each head in the reference's format (model.safetensors + config.json), re-read the
   files and check they reproduce the head, and write golden vectors for forward tests.

tools/eagle/README.md documents the files. CPU only, deterministic (fixed seeds, one thread).
Run from the repository root:
    OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 tools/train_eagle.py
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

from training import safetensors
from training.llama import (ATTENTION_BLOCK, BOS, EOS, apply_rope, read_legacy, rms_norm,
                            rope_tables)
from training.runtime import keep_freed_memory, sha256
from training.teacher import (check_teacher, greedy, greedy_chains, length_batches,
                              sample_continuations)
from training.tokenizer import Tokenizer

KINDS = ("eagle1", "eagle3")
VERSION = {"eagle1": 1, "eagle3": 3}
GOLDEN_ROWS = 12
GOLDEN_CHAIN = 3


# ----------------------------------------------------------------------------------------------
# The heads


def _linear_init(out_features, in_features, gen):
    """torch.nn.Linear's default weight initialisation, U(-1/sqrt(in), 1/sqrt(in))."""
    bound = 1.0 / math.sqrt(in_features)
    return (torch.rand(out_features, in_features, generator=gen) * 2 - 1) * bound


class EagleHead(torch.nn.Module):
    """An EAGLE draft head: one Llama decoder layer of the target's shape over rows that pair a
    feature of token x_i with the embedding of x_{i+1}, at RoPE position i (tools/eagle/README.md).

    version 1 (EAGLE-1): x = fc(concat(E[tok], h)) + bias, no input norm, attention input x;
        logits = E @ out (the target's tied classifier). h is the target's final hidden state
        (64 wide) or a predicted one.
    version 3 (EAGLE-3): h = fc(f) for a target feature f (3 x 64 wide, no bias), else the
        previous row's out_hidden; attention input concat(rms(E[tok], input_norm),
        rms(h, hidden_norm)) (128 wide); logits = lm_head @ rms(out, norm).
    Both: y = h_res + o_proj(attention); out = y + mlp(rms(y, post_norm)).

    E (the target's token embedding) and the RoPE tables are frozen buffers, not parameters.
    """

    def __init__(self, version, cfg, embedding, gen, feature_layers=()):
        super().__init__()
        assert version in (1, 3)
        self.version, self.cfg = version, cfg
        self.feature_layers = tuple(feature_layers)
        d, nh, nkv, hs, hid = cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_size, cfg.hidden_dim
        self.register_buffer("embedding", embedding.detach().clone(), persistent=False)
        # positions up to seq_len + 16: a drafted row sits at most (depth - 1) after the last one
        cos, sin = rope_tables(dataclasses.replace(cfg, seq_len=cfg.seq_len + 16))
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        width = 2 * d if version == 3 else d  # attention input
        P = torch.nn.Parameter
        if version == 1:
            self.fc = P(_linear_init(d, 2 * d, gen))
            bound = 1.0 / math.sqrt(2 * d)
            self.fc_bias = P((torch.rand(d, generator=gen) * 2 - 1) * bound)
        else:
            assert len(self.feature_layers) == 3, "EAGLE-3 fuses three layers"
            self.fc = P(_linear_init(d, 3 * d, gen))
            self.input_norm = P(torch.ones(d))
            self.hidden_norm = P(torch.ones(d))
            self.norm = P(torch.ones(d))
            self.lm_head = P(embedding.detach().clone())  # starts as the target's classifier
        self.wq = P(_linear_init(nh * hs, width, gen))
        self.wk = P(_linear_init(nkv * hs, width, gen))
        self.wv = P(_linear_init(nkv * hs, width, gen))
        self.wo = P(_linear_init(d, nh * hs, gen))
        self.post_norm = P(torch.ones(d))
        self.gate = P(_linear_init(hid, d, gen))
        self.up = P(_linear_init(hid, d, gen))
        self.down = P(_linear_init(d, hid, gen))

    # -- pieces of a row ----------------------------------------------------------------------

    def project(self, h, tokens):
        """h [..., F or dim] (F: a target feature's width, dim or 3 dim), tokens [...] ->
        (residual [..., dim], attention input [..., dim or 2 dim])."""
        e = self.embedding[tokens]
        if self.version == 1:
            x = F.linear(torch.cat((e, h), -1), self.fc, self.fc_bias)
            return x, x
        if h.shape[-1] != self.cfg.dim:
            h = F.linear(h, self.fc)
        eps = self.cfg.rms_eps
        a = torch.cat((rms_norm(e, self.input_norm, eps), rms_norm(h, self.hidden_norm, eps)), -1)
        return h, a

    def qkv(self, a, positions):
        """a [..., T, width], positions [..., T] or [T] -> q [..., T, n_heads, hs] and k, v
        [..., T, n_heads, hs] (kv heads repeated: query head h reads kv head h / rep), RoPE
        applied to q and k."""
        c = self.cfg
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        q = apply_rope(F.linear(a, self.wq).unflatten(-1, (c.n_heads, c.head_size)), cos, sin)
        k = apply_rope(F.linear(a, self.wk).unflatten(-1, (c.n_kv_heads, c.head_size)), cos, sin)
        v = F.linear(a, self.wv).unflatten(-1, (c.n_kv_heads, c.head_size))
        rep = c.n_heads // c.n_kv_heads
        return q, k.repeat_interleave(rep, -2), v.repeat_interleave(rep, -2)

    def finish(self, residual, o):
        """residual [..., dim], o [..., n_heads, hs] (attention output) -> out_hidden [..., dim]."""
        y = residual + F.linear(o.flatten(-2), self.wo)
        n = rms_norm(y, self.post_norm, self.cfg.rms_eps)
        return y + F.linear(F.silu(F.linear(n, self.gate)) * F.linear(n, self.up), self.down)

    def logits(self, out):
        """out_hidden [..., dim] -> logits [..., vocab] (EAGLE-3: over the draft vocabulary)."""
        if self.version == 1:
            return out @ self.embedding.T
        return rms_norm(out, self.norm, self.cfg.rms_eps) @ self.lm_head.T

    @property
    def scale(self):
        return 1.0 / math.sqrt(self.cfg.head_size)

    # -- whole runs ---------------------------------------------------------------------------

    def attend(self, q, k, v, own_k=(), own_v=()):
        """Attention of rows 0..T-1 of sequences: q, k, v [B, T, n_heads, hs]; query i sees keys
        0..i of k (causal) and, when given, its own row i of each own_k[j] (the earlier steps of
        its chain; own_k[j], own_v[j] [B, T, n_heads, hs]). Returns [B, T, n_heads, hs].
        Queries go in blocks of ATTENTION_BLOCK against the keys they can see only."""
        B, T, nh, hs = q.shape
        qb = q.transpose(1, 2).reshape(B * nh, T, hs)
        kt = k.permute(0, 2, 3, 1).reshape(B * nh, hs, T)
        vb = v.transpose(1, 2).reshape(B * nh, T, hs)
        if own_k:
            ok = torch.stack(own_k, 2).permute(0, 3, 1, 2, 4).reshape(B * nh, T, len(own_k), hs)
            ov = torch.stack(own_v, 2).permute(0, 3, 1, 2, 4).reshape(B * nh, T, len(own_v), hs)
        outs = []
        for t0 in range(0, T, ATTENTION_BLOCK):
            t1 = min(T, t0 + ATTENTION_BLOCK)
            mask = torch.full((t1 - t0, t1), float("-inf")).triu(t0 + 1)
            s = torch.baddbmm(mask, qb[:, t0:t1], kt[:, :, :t1], alpha=self.scale)
            if own_k:
                so = torch.einsum("bnd,bnjd->bnj", qb[:, t0:t1], ok[:, t0:t1]) * self.scale
                s = torch.cat((s, so), -1)
            p = torch.softmax(s, -1)
            o = torch.bmm(p[..., :t1], vb[:, :t1])
            if own_k:
                o = o + torch.einsum("bnj,bnjd->bnd", p[..., t1:], ov[:, t0:t1])
            outs.append(o)
        return torch.cat(outs, 1).view(B, nh, T, hs).transpose(1, 2)

    def causal(self, feats, tokens):
        """Rows 0..T-1 of sequences, causal from an empty cache: feats [B, T, F],
        tokens [B, T] (row i's token, x_{i+1}), positions 0..T-1.
        Returns (out_hidden [B, T, dim], k, v [B, T, n_heads, hs])."""
        res, a = self.project(feats, tokens)
        q, k, v = self.qkv(a, torch.arange(tokens.shape[-1]))
        return self.finish(res, self.attend(q, k, v)), k, v

    def ttt(self, feats, tokens, chain_tokens, steps):
        """The training-time test (EAGLE-3's; also the chain drafting at every row at once).

        feats [B, T, F], tokens [B, T]: the causal rows (step 0). chain_tokens
        [B, T, >= steps - 1]: the token of row i at step j >= 1 is chain_tokens[:, i, j - 1]; its
        h is row i's out_hidden of step j - 1, its position i + j, and it attends to the step-0
        rows 0..i and to its own rows of steps 1..j (the drafted chain's node at depth j + 1
        above the cache row i). Returns the out_hidden of every step, [steps] x [B, T, dim]."""
        pos = torch.arange(tokens.shape[-1])
        out, k0, v0 = self.causal(feats, tokens)
        outs = [out]
        own_k, own_v = [], []
        for j in range(1, steps):
            res, a = self.project(out, chain_tokens[:, :, j - 1])
            q, k, v = self.qkv(a, pos + j)
            own_k.append(k)
            own_v.append(v)
            out = self.finish(res, self.attend(q, k0, v0, own_k, own_v))
            outs.append(out)
        return outs

    def rows(self, h, tokens, position, cache_k, cache_v, path_k, path_v):
        """Drafted rows sharing one position (one tree level): h [N, dim], tokens [N]; each
        attends to the cache rows (cache_k, cache_v [S, n_heads, hs]), to its own path rows
        (path_k, path_v [N, P, n_heads, hs], P >= 0) and to itself.
        Returns (out_hidden [N, dim], k, v [N, n_heads, hs])."""
        res, a = self.project(h, tokens)
        q, k, v = self.qkv(a, torch.full((len(tokens),), position, dtype=torch.long))
        pk = torch.cat((path_k, k[:, None]), 1)
        pv = torch.cat((path_v, v[:, None]), 1)
        s_cache = torch.einsum("nhd,shd->nhs", q, cache_k) * self.scale
        s_path = torch.einsum("nhd,nphd->nhp", q, pk) * self.scale
        att = torch.softmax(torch.cat((s_cache, s_path), -1), -1)
        S = cache_k.shape[0]
        o = (torch.einsum("nhs,shd->nhd", att[..., :S], cache_v)
             + torch.einsum("nhp,nphd->nhd", att[..., S:], pv))
        return self.finish(res, o), k, v

    # -- files --------------------------------------------------------------------------------

    def parameters_by_name(self):
        """Name -> parameter, the reference's state-dict names in file order."""
        if self.version == 1:
            p = "layers.0."
            out = {"fc.weight": self.fc, "fc.bias": self.fc_bias}
        else:
            p = "midlayer."
            out = {"fc.weight": self.fc, f"{p}input_layernorm.weight": self.input_norm,
                   f"{p}hidden_norm.weight": self.hidden_norm}
        out.update({
            f"{p}self_attn.q_proj.weight": self.wq, f"{p}self_attn.k_proj.weight": self.wk,
            f"{p}self_attn.v_proj.weight": self.wv, f"{p}self_attn.o_proj.weight": self.wo,
            f"{p}post_attention_layernorm.weight": self.post_norm,
            f"{p}mlp.gate_proj.weight": self.gate, f"{p}mlp.up_proj.weight": self.up,
            f"{p}mlp.down_proj.weight": self.down})
        if self.version == 3:
            out["norm.weight"] = self.norm
            out["lm_head.weight"] = self.lm_head
        return out

    def tensors(self):
        """Name -> tensor of the file (tools/eagle/README.md): the parameters, and for EAGLE-3
        the draft-vocabulary maps as the reference stores them. The whole vocabulary is the draft
        vocabulary here: d2t (int64, token = k + d2t[k]) all zero, t2d (bool) all true."""
        out = {k: v.detach() for k, v in self.parameters_by_name().items()}
        if self.version == 3:
            out["d2t"] = torch.zeros(self.lm_head.shape[0], dtype=torch.int64)
            out["t2d"] = torch.ones(self.embedding.shape[0], dtype=torch.bool)
        return out

    def load(self, tensors):
        """Copies the tensors of a file; names, order, shapes, dtypes and d2t/t2d checked."""
        mine = self.tensors()
        assert list(tensors) == list(mine), f"tensor names or order differ: {list(tensors)}"
        for name, t in tensors.items():
            assert t.shape == mine[name].shape and t.dtype == mine[name].dtype, f"{name}: {t.shape}"
        for name in ("d2t", "t2d"):
            assert name not in mine or torch.equal(tensors[name], mine[name]), f"{name} differs"
        with torch.no_grad():
            for name, p in self.parameters_by_name().items():
                p.copy_(tensors[name])
        return self

    def config(self, base):
        c = self.cfg
        out = {
            "architectures": [
                "LlamaForCausalLM" if self.version == 1 else "LlamaForCausalLMEagle3"],
            "model_type": "llama", "hidden_act": "silu", "hidden_size": c.dim,
            "intermediate_size": c.hidden_dim, "num_attention_heads": c.n_heads,
            "num_key_value_heads": c.n_kv_heads, "num_hidden_layers": 1,
            "rms_norm_eps": c.rms_eps, "rope_theta": c.rope_theta, "rope_scaling": None,
            "max_position_embeddings": c.seq_len, "vocab_size": c.vocab_size,
        }
        if self.version == 3:
            out["draft_vocab_size"] = self.lm_head.shape[0]
            # vLLM's key and meaning (and the reference's): the layers whose INPUT residual
            # stream is taken; the input of layer l + 1 is the output of layer l, and id n_layers
            # is the last layer's output (before the final norm)
            out["eagle_aux_hidden_state_layer_ids"] = [l + 1 for l in self.feature_layers]
        out.update({
            "bias": self.version == 1, "tie_word_embeddings": self.version == 1,
            "bos_token_id": BOS, "eos_token_id": EOS, "torch_dtype": "float32",
            "eagle_version": self.version, "rope_style": "interleaved",
            "base_model_name_or_path": base})
        return out


def parameter_count(head):
    return sum(p.numel() for p in head.parameters())


# ----------------------------------------------------------------------------------------------
# Self-distillation data


@dataclasses.dataclass
class Batch:
    """Right-padded stories: tokens [B, L] (x_0..), lengths [B], features [B, L, 3 dim] (the
    residual streams of the feature layers at each position) and final [B, L, dim] (the final
    hidden state); chains [B, L, depth] (the target's greedy continuation at each position) for
    the held-out stories."""

    tokens: torch.Tensor
    lengths: torch.Tensor
    features: torch.Tensor
    final: torch.Tensor
    chains: torch.Tensor = None

    def rows(self, version):
        """The head's step-0 rows: (feats [B, L-1, F], tokens [B, L-1]); row i = (f_i, x_{i+1})."""
        f = self.final if version == 1 else self.features
        return f[:, :-1], self.tokens[:, 1:]


@torch.no_grad()
def build_batches(target, stories, layers, batch_tokens, chain_depth=0):
    """Stories cut into length-sorted batches of at most batch_tokens padded positions, each with
    the target's features (one causal forward) and, with chain_depth > 0, greedy continuations."""
    batches = []
    for idx in length_batches(stories, batch_tokens):
        L = max(len(stories[i]) for i in idx)
        tokens = torch.zeros((len(idx), L), dtype=torch.long)
        for r, i in enumerate(idx):
            tokens[r, : len(stories[i])] = stories[i]
        lengths = torch.tensor([len(stories[i]) for i in idx])
        final, res = target.hidden_and_residuals(tokens, layers)
        chains = None
        if chain_depth:
            final2, chains = greedy_chains(target, tokens, chain_depth)
            assert torch.equal(final2, final)
        batches.append(Batch(tokens, lengths, torch.cat(res, -1), final, chains))
    return batches


def row_mask(batch, step):
    """[B, L-1] bool: rows i whose step-`step` label exists (i + 1 + step <= length - 1)."""
    L = batch.tokens.shape[1]
    i = torch.arange(L - 1)
    return i[None, :] + 1 + step <= batch.lengths[:, None] - 1


def shifted(t, j, fill=0):
    """t [B, L, ...] -> [B, L-1, ...] with row i = t[:, i + 1 + j] (fill past the end)."""
    B, L = t.shape[:2]
    out = torch.full((B, L - 1, *t.shape[2:]), fill, dtype=t.dtype)
    n = L - 1 - j
    if n > 0:
        out[:, :n] = t[:, 1 + j :]
    return out


# ----------------------------------------------------------------------------------------------
# Training


def train_head(kind, target, batches, held, args, log):
    version = VERSION[kind]
    gen = torch.Generator().manual_seed(args.seed + version)
    layers = args.eagle3_layers if version == 3 else ()
    head = EagleHead(version, target.cfg, target.tok_embeddings, gen, layers)
    steps = args.eagle1_steps if version == 1 else args.eagle3_steps
    ttt = args.eagle1_ttt if version == 1 else args.eagle3_ttt
    lr = args.eagle1_lr if version == 1 else args.eagle3_lr
    opt = torch.optim.AdamW(head.parameters(), lr=lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.0)
    E = target.tok_embeddings

    def lr_at(step):
        if step < args.warmup:
            return lr * (step + 1) / args.warmup
        cosine = 0.5 * (1 + math.cos(math.pi * (step - args.warmup) / max(1, steps - args.warmup)))
        return lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * cosine)

    log(f"training {kind}: {parameter_count(head)} parameters, {steps} steps over "
        f"{len(batches)} batches, training-time test {ttt} step(s), labels {args.labels}")
    order, cursor = torch.randperm(len(batches), generator=gen).tolist(), 0
    history, t0 = [], time.time()
    for step in range(steps):
        if cursor == len(order):
            order, cursor = torch.randperm(len(batches), generator=gen).tolist(), 0
        b = batches[order[cursor]]
        cursor += 1
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        feats, tokens = b.rows(version)
        if version == 1 and args.eagle1_noise > 0:  # the reference's uniform feature noise
            feats = feats + (torch.rand(feats.shape, generator=gen) - 0.5) * args.eagle1_noise
        chain_tokens = torch.stack([shifted(b.tokens, j) for j in range(1, ttt)], -1) \
            if ttt > 1 else None
        outs = head.ttt(feats, tokens, chain_tokens, ttt)
        total, parts = 0.0, []
        weight_sum = 0.0
        for j, out in enumerate(outs):
            mask = row_mask(b, j)
            t_final = shifted(b.final, j)[mask]  # the target's final hidden at i + 1 + j
            with torch.no_grad():
                t_logits = t_final @ E.T
            lg = head.logits(out[mask])
            if args.labels == "greedy":
                ce = F.cross_entropy(lg, t_logits.argmax(-1))
            else:
                ce = F.cross_entropy(lg, torch.softmax(t_logits, -1))
            if version == 1:
                loss_j = F.smooth_l1_loss(out[mask], t_final) + args.ce_weight * ce
            else:
                loss_j = ce
            w = args.step_decay ** j
            total = total + w * loss_j
            weight_sum += w
            parts.append(loss_j.item())
        loss = total / weight_sum
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), args.clip)
        opt.step()
        if (step + 1) % args.eval_every == 0 or step + 1 == steps:
            m = evaluate(head, held, args.eval_depth)
            history.append({"step": step + 1, "train_loss": loss.item(), "train_step_losses": parts,
                            "heldout_acceptance": m["acceptance"],
                            "heldout_top1": m["top1"], "seconds": time.time() - t0})
            log(f"  [{kind}] step {step + 1}/{steps} loss {loss.item():.3f} ("
                + " ".join(f"{p:.3f}" for p in parts) + "); held-out acceptance "
                + " ".join(f"{a:.3f}" for a in m["acceptance"])
                + f", chain length {m['expected_chain_length']:.3f} ({time.time() - t0:.0f} s)")
    return head.requires_grad_(False), history, time.time() - t0


# ----------------------------------------------------------------------------------------------
# Evaluation


@torch.no_grad()
def evaluate(head, held, depth, topk=10):
    """Greedy-chain acceptance on held-out batches. At row i (root x_{i+1}, committed x_0..x_{i+1};
    every row whose root is not its story's last token), depth d's label is y_d, the target's
    greedy continuation of x_0..x_{i+1}; the head drafts
    from the true feature f_i at depth 1 and from its own out_hidden after, fed the labels as
    tokens (equal to its drafts whenever all earlier depths matched, the only rows counted).
    Returns acceptance[d] = P(depth d top-1 right | depths < d right), top1/top5/top10[d]
    (unconditional, teacher-forced), rank_accuracy at depth 1, the expected chain length."""
    version = head.version
    hit = torch.zeros(depth, dtype=torch.float64)  # conditional hits
    seen = torch.zeros(depth, dtype=torch.float64)  # rows with depths < d right
    rank = torch.zeros(depth, topk + 1, dtype=torch.float64)
    count = 0
    for b in held:
        feats, tokens = b.rows(version)
        labels = shifted(b.chains, 0)  # [B, L-1, depth]: y_1..y_D of x_0..x_{i+1}
        outs = head.ttt(feats, tokens, labels, depth)
        mask = row_mask(b, 1)
        alive = mask.clone()
        count += int(mask.sum())
        for d, out in enumerate(outs):
            lg = head.logits(out)
            y = labels[..., d]
            target_logit = lg.gather(-1, y[..., None])[..., 0]
            r = (lg > target_logit[..., None]).sum(-1).clamp(max=topk)
            rank[d] += torch.bincount(r[mask], minlength=topk + 1)
            ok = r == 0
            seen[d] += alive.sum()
            hit[d] += (alive & ok).sum()
            alive = alive & ok
    acc = (hit / seen.clamp(min=1)).tolist()
    cum = (rank[:, :topk] / count).cumsum(1)
    expected, p = 1.0, 1.0
    for a in acc:
        p *= a
        expected += p
    return {"positions": count, "acceptance": acc, "top1": cum[:, 0].tolist(),
            "top5": cum[:, 4].tolist(), "top10": cum[:, 9].tolist(),
            "rank_accuracy_depth1": (rank[0, :topk] / count).tolist(),
            "expected_chain_length": expected}


# ----------------------------------------------------------------------------------------------
# Drafting and the greedy simulation


def draft_tree(head, cache, t, depth, top_k, nodes):
    """The EAGLE-2 dynamic tree with root x_t: cache = (out [S, dim], logits [S, V], k, v
    [S, n_heads, hs]) of the rows built from the target's features (row t-1 is the last one the
    draft may use). Depth 1: the top_k tokens of row t-1; then depth - 1 times, the top_k
    candidates of the newest level with the highest path score (sum of log-softmax along the
    path) are expanded into their top_k children each. Of all candidates the `nodes` of highest
    score are kept (ties: lower depth, then creation order, so a node's ancestors are kept).
    Returns [(token, parent index or -1, depth)], parents before children."""
    out, logits, ck, cv = cache
    ck, cv = ck[:t], cv[:t]
    V = logits.shape[-1]
    k1 = min(top_k, V)
    lp = torch.log_softmax(logits[t - 1], -1)
    top = torch.topk(lp, k1)
    cand = []  # (score, depth, order, token, parent)
    frontier = []  # candidate indices of the newest level to expand
    for s, tok in zip(top.values.tolist(), top.indices.tolist()):
        cand.append((s, 1, len(cand), tok, -1))
        frontier.append(len(cand) - 1)
    rowinfo = {}  # candidate index -> (out_hidden, path k, path v incl. its own row) once run
    empty_k, empty_v = torch.zeros((0, *ck.shape[1:])), torch.zeros((0, *cv.shape[1:]))
    for level in range(1, depth):
        if not frontier:
            break
        parents = [cand[c][4] for c in frontier]
        h = torch.stack([out[t - 1] if p == -1 else rowinfo[p][0] for p in parents])
        pk = torch.stack([empty_k if p == -1 else rowinfo[p][1] for p in parents])
        pv = torch.stack([empty_v if p == -1 else rowinfo[p][2] for p in parents])
        toks = torch.tensor([cand[c][3] for c in frontier])
        o, k, v = head.rows(h, toks, t - 1 + level, ck, cv, pk, pv)
        lps = torch.log_softmax(head.logits(o), -1)
        children = []
        for r, c in enumerate(frontier):
            rowinfo[c] = (o[r], torch.cat((pk[r], k[r][None])), torch.cat((pv[r], v[r][None])))
            top = torch.topk(lps[r], k1)
            for s, tok in zip(top.values.tolist(), top.indices.tolist()):
                cand.append((cand[c][0] + s, level + 1, len(cand), tok, c))
                children.append(len(cand) - 1)
        children.sort(key=lambda c: (-cand[c][0], cand[c][2]))
        frontier = children[:top_k]
    keep = sorted(range(len(cand)), key=lambda c: (-cand[c][0], cand[c][1], cand[c][2]))[:nodes]
    keep.sort(key=lambda c: (cand[c][1], cand[c][2]))
    index = {c: n for n, c in enumerate(keep)}
    tree = []
    for c in keep:
        parent = cand[c][4]
        assert parent == -1 or parent in index, "a kept node's parent was dropped"
        tree.append((cand[c][3], -1 if parent == -1 else index[parent], cand[c][1]))
    return tree


@torch.no_grad()
def head_cache(head, target, seq):
    """The head's rows over a whole sequence: row i = (f_i, seq[i+1]) at position i, causal.
    Returns (out [n-1, dim], logits [n-1, V], k, v [n-1, n_heads, hs])."""
    tokens = torch.tensor([seq])
    final, res = target.hidden_and_residuals(tokens[:, :-1], head.feature_layers)
    feats = final if head.version == 1 else torch.cat(res, -1)
    out, k, v = head.causal(feats, tokens[:, 1:])
    return out[0], head.logits(out[0]), k[0], v[0]


@torch.no_grad()
def greedy_sequences(target, prompts, new_tokens, max_depth):
    """Per prompt (P tokens, BOS first), the target's greedy continuation to P + new_tokens +
    max_depth + 1 tokens (KV-cache decoding): the text every greedy simulation walks."""
    return [(len(p), greedy(target, p, len(p) + new_tokens + max_depth + 1)) for p in prompts]


@torch.no_grad()
def simulate(head, target, sequences, new_tokens, depth, top_k, nodes, caches=None):
    """Greedy speculative decoding as specdec's decoder runs it: prefill prompt[:-1]; each step,
    with root x_t, the head drafts an EAGLE-2 tree from its rows 0..t-1 (the target's true
    features), the target's greedy path through the tree is accepted plus one token. Stops after
    new_tokens tokens or EOS. `sequences` are (prompt length, the target's greedy continuation)
    (a tree forward gives the same argmax along the accepted path); the head's rows over each
    are computed in one causal forward (row i depends on rows 0..i only; `caches` may hold them).
    A chain of depth d is top_k = 1, nodes = d."""
    total_steps = total_accepted = total_tokens = total_nodes = 0
    per_depth = [0] * depth
    rows = []
    for n, (P, seq) in enumerate(sequences):
        assert len(seq) >= P + new_tokens + depth + 1
        cache = caches[n] if caches is not None else head_cache(head, target, seq)
        t, emitted, steps, accepted, done = P - 1, 0, 0, 0, False
        while not done:
            tree = draft_tree(head, cache, t, depth, top_k, nodes)
            total_nodes += len(tree)
            node, m = -1, 0
            while True:  # the target's greedy path through the tree
                nxt = seq[t + 1 + m]
                hit = [n for n, (tok, parent, _) in enumerate(tree)
                       if parent == node and tok == nxt]
                if not hit:
                    break
                node, m = hit[0], m + 1
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
        rows.append({"prompt_tokens": P, "generated": emitted, "steps": steps,
                     "accepted": accepted, "mean_accepted_length": (accepted + steps) / steps})
        total_steps += steps
        total_accepted += accepted
        total_tokens += emitted
    return {"depth": depth, "top_k": top_k, "nodes": nodes,
            "mean_accepted_length": (total_accepted + total_steps) / total_steps,
            "tokens_per_step": total_tokens / total_steps, "steps": total_steps,
            "accepted": total_accepted, "tokens": total_tokens,
            "mean_tree_nodes": total_nodes / total_steps,
            "acceptance_at_depth": [c / total_steps for c in per_depth], "per_prompt": rows}


# ----------------------------------------------------------------------------------------------
# Files


def export(kind, head, out_dir, base):
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "model.safetensors")
    size = safetensors.write(path, head.tensors(), "F32", {"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(head.config(base), f, indent=2)
        f.write("\n")
    return {"path": os.path.join(kind, "model.safetensors"), "bytes": size, "sha256": sha256(path)}


def reload(kind, out_dir, target):
    """A head built from the files in out_dir (names, shapes and config checked)."""
    cfg = json.load(open(os.path.join(out_dir, "config.json")))
    version = cfg["eagle_version"]
    assert VERSION[kind] == version and cfg["rope_style"] == "interleaved"
    layers = [l - 1 for l in cfg.get("eagle_aux_hidden_state_layer_ids", ())]
    head = EagleHead(version, target.cfg, target.tok_embeddings, torch.Generator().manual_seed(0),
                     layers)
    assert head.config(cfg["base_model_name_or_path"]) == cfg, f"{out_dir}: config differs"
    tensors, dtypes, _ = safetensors.read(os.path.join(out_dir, "model.safetensors"))
    assert list(tensors) == list(head.tensors()), f"{out_dir}: tensor order differs"
    return head.load(tensors).requires_grad_(False)


@torch.no_grad()
def write_golden(kind, head, target, seq, out_dir):
    """golden.safetensors: the head run causally over the rows of seq (T = len(seq) - 1) from an
    empty cache, then a greedy chain of GOLDEN_CHAIN drafted rows (tools/eagle/README.md)."""
    T = len(seq) - 1
    tokens = torch.tensor([seq])
    final, res = target.hidden_and_residuals(tokens[:, :-1], head.feature_layers)
    feats = (final if head.version == 1 else torch.cat(res, -1))[0]
    out, k, v = head.causal(feats[None], tokens[:, 1:])
    out, k, v = out[0], k[0], v[0]
    logits = head.logits(out)
    chain_tokens, chain_out, chain_logits = [], [], []
    h, lg = out[-1], logits[-1]
    pk = torch.zeros((1, 0, *k.shape[1:]))
    pv = torch.zeros((1, 0, *v.shape[1:]))
    for j in range(GOLDEN_CHAIN):
        tok = int(lg.argmax())  # d2t is zero: draft index = token
        o, kk, vv = head.rows(h[None], torch.tensor([tok]), T + j, k, v, pk, pv)
        pk = torch.cat((pk, kk[:, None]), 1)
        pv = torch.cat((pv, vv[:, None]), 1)
        h, lg = o[0], head.logits(o[0])
        chain_tokens.append(tok)
        chain_out.append(h)
        chain_logits.append(lg)
    i32 = lambda x: torch.tensor(x, dtype=torch.int32)
    tensors = {"sequence": i32(seq), "tokens": i32(seq[1:]), "positions": i32(list(range(T))),
               "features": feats, "out_hidden": out, "logits": logits,
               "chain_tokens": i32(chain_tokens),
               "chain_positions": i32([T + j for j in range(GOLDEN_CHAIN)]),
               "chain_out_hidden": torch.stack(chain_out),
               "chain_logits": torch.stack(chain_logits)}
    path = os.path.join(out_dir, "golden.safetensors")
    size = safetensors.write(path, tensors, "F32", {"format": "pt"})
    # the same rows through the training-time path (all chain rows at once) must agree
    chain = torch.zeros((1, T, GOLDEN_CHAIN), dtype=torch.long)  # only row T-1's chain matters
    chain[0, T - 1] = torch.tensor(chain_tokens)
    outs = head.ttt(feats[None], tokens[:, 1:], chain, GOLDEN_CHAIN + 1)
    diff = max((outs[j + 1][0, -1] - chain_out[j]).abs().max().item()
               for j in range(GOLDEN_CHAIN))
    assert diff < 1e-4, f"chain rows differ between the two paths by {diff}"
    return {"path": os.path.join(kind, "golden.safetensors"), "bytes": size,
            "sha256": sha256(path), "rows": T, "chain": chain_tokens, "paths_max_abs_diff": diff}


# ----------------------------------------------------------------------------------------------


def parser():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(here)
    shared = os.path.join(os.path.dirname(repo), "shared")
    model_dir = os.environ.get("SPECDEC_MODEL_DIR", os.path.join(shared, "models"))
    data_dir = os.environ.get("SPECDEC_DATA_DIR", os.path.join(shared, "data"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--target", default=os.path.join(model_dir, "stories260K.bin"))
    ap.add_argument("--reference",
                    default=os.path.join(model_dir, "reference_greedy_once_upon_a_time.ids"))
    ap.add_argument("--tokenizer", default=os.path.join(model_dir, "tok512.bin"))
    ap.add_argument("--prompts", default=os.path.join(data_dir, "tinystories_prompts.jsonl"))
    ap.add_argument("--out-dir", default=os.path.join(here, "eagle"),
                    help="writes eagle1/ and eagle3/ (config.json, model.safetensors, "
                    "golden.safetensors) and metrics.json here")
    ap.add_argument("--kinds", default="eagle1,eagle3")
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eagle3-layers", default="0,2,4",
                    help="EAGLE-3's feature: the residual streams at the OUTPUT of these layers "
                    "(0-based; config.json names the layers whose input they are, one more)")
    ap.add_argument("--bos-stories", type=int, default=2048, help="training stories from BOS")
    ap.add_argument("--prompt-stories", type=int, default=32,
                    help="training stories per fixture prompt")
    ap.add_argument("--heldout-stories", type=int, default=128, help="held-out stories from BOS")
    ap.add_argument("--max-len", type=int, default=256,
                    help="story length cap in tokens, BOS included")
    ap.add_argument("--sample-batch", type=int, default=256)
    ap.add_argument("--batch-tokens", type=int, default=4096,
                    help="padded positions per training batch")
    ap.add_argument("--eagle1-steps", type=int, default=6000)
    ap.add_argument("--eagle3-steps", type=int, default=2000)
    ap.add_argument("--eagle1-ttt", type=int, default=1,
                    help="EAGLE-1 steps on its own features per row (1: the reference)")
    ap.add_argument("--eagle3-ttt", type=int, default=4,
                    help="EAGLE-3 training-time test steps per row")
    ap.add_argument("--eagle1-lr", type=float, default=3e-3)
    ap.add_argument("--eagle3-lr", type=float, default=3e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--clip", type=float, default=1.0, help="gradient norm clip")
    ap.add_argument("--eagle1-noise", type=float, default=0.0,
                    help="EAGLE-1: width of the uniform noise added to its input features (the "
                    "reference's augmentation; 0.2 did not help here)")
    ap.add_argument("--ce-weight", type=float, default=0.1,
                    help="EAGLE-1: cross-entropy weight next to the smooth-L1 feature loss")
    ap.add_argument("--labels", choices=("soft", "greedy"), default="greedy",
                    help="cross-entropy against the target's argmax (what greedy verification "
                    "accepts) or its whole distribution (the reference)")
    ap.add_argument("--step-decay", type=float, default=0.8,
                    help="training-time test: step j's loss weight is step_decay^j")
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--eval-depth", type=int, default=6)
    ap.add_argument("--new-tokens", type=int, default=128, help="simulation: tokens per prompt")
    ap.add_argument("--tree-nodes", type=int, default=32)
    ap.add_argument("--tree-depths", default="4,5,6,7,8")
    ap.add_argument("--tree-topks", default="2,3,4,6,8")
    ap.add_argument("--chain-depths", default="4,5,6")
    ap.add_argument("--tuning-starts", type=int, default=16,
                    help="held-out stories whose first tokens start the tree-tuning simulation")
    ap.add_argument("--tuning-prefix", type=int, default=8)
    return ap


def main():
    args = parser().parse_args()
    args.eagle3_layers = tuple(int(x) for x in args.eagle3_layers.split(","))

    keep_freed_memory()
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(args.seed)
    kinds = [k for k in args.kinds.split(",") if k]
    assert kinds and all(k in KINDS for k in kinds), f"--kinds: subset of {KINDS}"
    t_start = time.time()

    def log(msg):
        print(f"[{time.time() - t_start:7.1f} s] {msg}", flush=True)

    # 1. target
    target, rope_error = read_legacy(args.target)
    target.requires_grad_(False)
    assert rope_error < 1e-5, f"{args.target}: RoPE tables differ by {rope_error}"
    n_ref = check_teacher(target, args.reference)
    log(f"target reproduces the {n_ref} reference greedy ids")
    assert len(args.eagle3_layers) == 3 and list(args.eagle3_layers) == sorted(
        set(args.eagle3_layers)) and args.eagle3_layers[-1] < target.cfg.n_layers
    tok = Tokenizer(args.tokenizer)
    prompts = [tok.encode(json.loads(line)["prompt"]) for line in open(args.prompts)
               if line.strip()]
    log(f"{len(prompts)} prompts of {min(map(len, prompts))}..{max(map(len, prompts))} tokens")

    # 2. self-distillation data
    gen = torch.Generator().manual_seed(args.seed)
    t0 = time.time()
    train = sample_continuations(target, [BOS], args.bos_stories, args.sample_batch,
                                 args.max_len, gen)
    for p in prompts:
        if args.prompt_stories > 0:
            train += sample_continuations(target, p, args.prompt_stories, args.sample_batch,
                                          args.max_len, gen)
    heldout = sample_continuations(target, [BOS], args.heldout_stories, args.sample_batch,
                                   args.max_len, gen)
    sample_s = time.time() - t0
    log(f"sampled {len(train)} training and {len(heldout)} held-out stories in {sample_s:.0f} s "
        f"({sum(map(len, train))} + {sum(map(len, heldout))} tokens)")
    t0 = time.time()
    batches = build_batches(target, train, args.eagle3_layers, args.batch_tokens)
    held = build_batches(target, heldout, args.eagle3_layers, args.batch_tokens,
                         args.eval_depth)
    feature_s = time.time() - t0
    log(f"features: {len(batches)} training batches, {len(held)} held-out batches with greedy "
        f"continuations of depth {args.eval_depth} in {feature_s:.0f} s")
    story = heldout[0]
    n = len(story)
    b, r = next((b, r) for b in held for r in range(len(b.tokens))
                if b.lengths[r] == n and torch.equal(b.tokens[r, :n], story))
    check = [greedy(target, story[: s + 1].tolist(), s + 1 + args.eval_depth)[s + 1 :]
             for s in range(1, n - 1, 7)]
    assert check == b.chains[r, 1 : n - 1 : 7].tolist(), \
        "greedy continuations differ from KV-cache greedy decoding"
    log(f"greedy continuations match KV-cache greedy decoding at {len(check)} positions")
    tuning = [s[: args.tuning_prefix].tolist() for s in heldout[: args.tuning_starts]
              if len(s) >= args.tuning_prefix]

    max_depth = max([int(x) for x in args.tree_depths.split(",")]
                    + [int(x) for x in args.chain_depths.split(",")])
    prompt_seqs = greedy_sequences(target, prompts, args.new_tokens, max_depth)
    tuning_seqs = greedy_sequences(target, tuning, args.new_tokens, max_depth)

    summary = {"argv": sys.argv, "torch": torch.__version__, "threads": args.threads,
               "args": vars(args), "prompts": prompts, "tuning_prompts": tuning,
               "corpus": {"train_stories": len(train), "heldout_stories": len(heldout),
                          "train_tokens": sum(map(len, train)),
                          "heldout_tokens": sum(map(len, heldout)),
                          "sample_seconds": sample_s, "feature_seconds": feature_s},
               "kinds": {}}
    base = os.path.basename(args.target)
    depths = [int(x) for x in args.tree_depths.split(",")]
    topks = [int(x) for x in args.tree_topks.split(",")]
    for kind in kinds:
        head, history, train_s = train_head(kind, target, batches, held, args, log)
        m = evaluate(head, held, args.eval_depth)
        log(f"  [{kind}] held-out acceptance by depth " + " ".join(
            f"{a:.3f}" for a in m["acceptance"]) + f" (chain of {args.eval_depth}: expected "
            f"length {m['expected_chain_length']:.3f}); teacher-forced top-1 "
            + " ".join(f"{a:.3f}" for a in m["top1"]))
        t0 = time.time()
        p_caches = [head_cache(head, target, seq) for _, seq in prompt_seqs]
        t_caches = [head_cache(head, target, seq) for _, seq in tuning_seqs]
        chains = {d: simulate(head, target, prompt_seqs, args.new_tokens, d, 1, d, p_caches)
                  for d in (int(x) for x in args.chain_depths.split(","))}
        log(f"  [{kind}] fixture prompts, chains: " + ", ".join(
            f"depth {d} {s['mean_accepted_length']:.3f}" for d, s in chains.items()))
        grid = []
        for d in depths:
            for k in topks:
                s = simulate(head, target, tuning_seqs, args.new_tokens, d, k, args.tree_nodes,
                             t_caches)
                grid.append({"depth": d, "top_k": k,
                             "mean_accepted_length": s["mean_accepted_length"]})
        best = max(grid, key=lambda g: (g["mean_accepted_length"], -g["depth"], -g["top_k"]))
        log(f"  [{kind}] tree tuning on {len(tuning)} held-out starts: best depth {best['depth']}"
            f" top-k {best['top_k']} ({best['mean_accepted_length']:.3f})")
        tree = simulate(head, target, prompt_seqs, args.new_tokens, best["depth"], best["top_k"],
                        args.tree_nodes, p_caches)
        grid_prompts = []
        for d in depths:
            for k in topks:
                s = simulate(head, target, prompt_seqs, args.new_tokens, d, k, args.tree_nodes,
                             p_caches)
                grid_prompts.append({"depth": d, "top_k": k,
                                     "mean_accepted_length": s["mean_accepted_length"]})
        log(f"  [{kind}] fixture prompts, EAGLE-2 tree depth {best['depth']} top-k "
            f"{best['top_k']} {args.tree_nodes} nodes: {tree['mean_accepted_length']:.3f} "
            f"(best on the prompts {max(g['mean_accepted_length'] for g in grid_prompts):.3f}; "
            f"simulations {time.time() - t0:.0f} s)")
        out = os.path.join(args.out_dir, kind)
        files = export(kind, head, out, base)
        reread = reload(kind, out, target)
        diff = 0.0
        for b in held[:4]:
            feats, tokens = b.rows(head.version)
            chain = shifted(b.chains, 0)
            for o1, o2 in zip(head.ttt(feats, tokens, chain, 3),
                              reread.ttt(feats, tokens, chain, 3)):
                diff = max(diff, (head.logits(o1) - reread.logits(o2)).abs().max().item())
        assert diff == 0.0, f"{out}: re-read head differs by {diff}"
        golden_seq = [BOS] + [int(x) for x in open(args.reference).read().split()][:GOLDEN_ROWS]
        golden = write_golden(kind, reread, target, golden_seq, out)
        log(f"  [{kind}] wrote {files['path']} ({files['bytes']} bytes) and golden vectors; "
            f"re-read logits differ by {diff:.1e}")
        summary["kinds"][kind] = {
            "config": head.config(base), "parameters": parameter_count(head),
            "train_seconds": train_s, "history": history, "heldout": m,
            "simulation_chains": {str(d): s for d, s in chains.items()},
            "tree_tuning": {"starts": len(tuning), "grid": grid, "chosen": best},
            "tree_grid_on_prompts": grid_prompts, "simulation_tree": tree,
            "file": files, "golden": golden, "reread_max_abs_diff": diff}
    summary["total_seconds"] = time.time() - t_start
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "metrics.json"), "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    log(f"done in {summary['total_seconds']:.0f} s")


if __name__ == "__main__":
    main()
