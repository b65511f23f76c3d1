#!/usr/bin/env python3
"""Train Medusa-1 and Hydra draft heads for the stories260K fixture by self-distillation.

1. Load the target (llama2.c legacy checkpoint) and check it reproduces the fixture's reference
   greedy ids; it stays frozen throughout.
2. Sample stories from the target at temperature 1, from BOS and from each fixture prompt (KV
   cache, batched). For every position s whose prefix holds at least one sampled token, keep the
   target's final hidden state h_s (after the final RMSNorm: the LM head's input) and the target's
   greedy continuation y_1..y_{K+1} of the prefix (y_1 = argmax of the target's logits at s).
3. Train K Medusa-1 heads (head i: residual SiLU blocks on h_s, then its own LM head initialised
   from the target's classifier; label y_{i+2}) and K Hydra heads (head i: an MLP over
   concat(h_s, E[y_1], ..., E[y_{i+1}]) with E the target's frozen token embedding, teacher-forced;
   label y_{i+2}). Cross-entropy against the greedy labels, AdamW, warmup and cosine decay.
4. Measure on held-out stories (never trained on) the per-head top-1/5/10 accuracy, build a sparse
   tree the Medusa way (greedily add the path with the highest product of per-head rank
   accuracies) and simulate greedy speculative decoding on the fixture prompts (chain and tree):
   mean accepted length = (accepted drafts + steps) / steps.
5. Export each kind in the reference repositories' format (safetensors + config.json, the tree as
   a list of top-k index paths), re-read the files and check they reproduce the heads' logits.

tools/heads/README.md documents the files. CPU only, deterministic (fixed seeds, one thread).
Run from the repository root:
    OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 tools/train_heads.py
"""

import argparse
import heapq
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

from training import safetensors
from training.llama import BOS, EOS, read_legacy
from training.runtime import keep_freed_memory, sha256
from training.teacher import check_teacher, greedy, greedy_chains, sample_continuations
from training.tokenizer import Tokenizer

KINDS = ("medusa", "hydra")
FILES = {"medusa": "medusa_lm_head.safetensors", "hydra": "hydra_lm_head.safetensors"}


# ----------------------------------------------------------------------------------------------
# Heads


def _bias_init(n, fan_in, gen):
    """torch.nn.Linear's default bias initialisation, U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / math.sqrt(fan_in)
    return (torch.rand(n, generator=gen) * 2 - 1) * bound


class MedusaHeads(torch.nn.Module):
    """K Medusa-1 heads on the target's final hidden state h [N, dim]:
    head i: x = h; x = x + SiLU(W_il x + b_il) for l < L; logits_i = U_i x (no bias).
    W_il start at zero (each block starts as the identity), U_i as the target's classifier."""

    def __init__(self, num_heads, num_layers, classifier, gen):
        super().__init__()
        vocab, dim = classifier.shape
        self.num_heads, self.num_layers, self.dim, self.vocab = num_heads, num_layers, dim, vocab
        self.w = torch.nn.Parameter(torch.zeros(num_heads, num_layers, dim, dim))
        self.b = torch.nn.Parameter(
            torch.stack([_bias_init(dim, dim, gen) for _ in range(num_heads * num_layers)])
            .view(num_heads, num_layers, dim))
        self.lm = torch.nn.Parameter(classifier.detach().clone().expand(num_heads, vocab, dim)
                                     .contiguous())

    def forward(self, h):
        """h [N, dim] -> logits [K, N, vocab]."""
        x = h.expand(self.num_heads, *h.shape)
        for layer in range(self.num_layers):
            x = x + F.silu(torch.baddbmm(self.b[:, layer, None], x,
                                         self.w[:, layer].transpose(1, 2)))
        return torch.bmm(x, self.lm.transpose(1, 2))

    def head(self, i, h, tokens_before=None):
        """Head i alone: h [N, dim] -> logits [N, vocab] (tokens_before: unused, see Hydra)."""
        x = h
        for layer in range(self.num_layers):
            x = x + F.silu(x @ self.w[i, layer].T + self.b[i, layer])
        return x @ self.lm[i].T

    def tensors(self):
        """Name -> tensor, FasterDecoding/Medusa's medusa_lm_head state dict (ResBlocks then the
        LM head of each head, `{head}.{index}...`)."""
        out = {}
        for i in range(self.num_heads):
            for layer in range(self.num_layers):
                out[f"{i}.{layer}.linear.weight"] = self.w[i, layer]
                out[f"{i}.{layer}.linear.bias"] = self.b[i, layer]
            out[f"{i}.{self.num_layers}.weight"] = self.lm[i]
        return out

    def load(self, tensors):
        with torch.no_grad():
            for i in range(self.num_heads):
                for layer in range(self.num_layers):
                    self.w[i, layer].copy_(tensors[f"{i}.{layer}.linear.weight"])
                    self.b[i, layer].copy_(tensors[f"{i}.{layer}.linear.bias"])
                self.lm[i].copy_(tensors[f"{i}.{self.num_layers}.weight"])
        return self

    def config(self, base):
        return {"medusa_num_heads": self.num_heads, "medusa_num_layers": self.num_layers,
                "base_model_name_or_path": base, "hidden_size": self.dim,
                "vocab_size": self.vocab}


class HydraHeads(torch.nn.Module):
    """K Hydra heads (zankner/Hydra's "mlp" head architecture with grounded_heads): head i reads
    u_i = concat(h, E[t_0], E[t_1], ..., E[t_i]) [(i + 2) dim], where t_0 is the token the target
    chose after h (the root of the draft tree) and t_1..t_i the tokens drafted by heads 0..i-1 on
    the path, E the target's token embedding (frozen, not in the file):
        x = R_i u_i + r_i + SiLU(A_i u_i + a_i)          (first block, widening residual)
        x = x + SiLU(W_il x + b_il)                       (blocks l = 1..L-1)
        logits_i = U_i x + c_i
    A_i and W_il start at zero, R_i as [I 0 ... 0] (the block starts as the identity on h), U_i as
    the target's classifier, c_i at zero."""

    def __init__(self, num_heads, num_layers, embedding, gen):
        super().__init__()
        vocab, dim = embedding.shape
        self.num_heads, self.num_layers, self.dim, self.vocab = num_heads, num_layers, dim, vocab
        self.embedding = embedding.detach()  # frozen, a buffer of the target's
        self.a = torch.nn.ParameterList()
        self.a_bias = torch.nn.ParameterList()
        self.r = torch.nn.ParameterList()
        self.r_bias = torch.nn.ParameterList()
        for i in range(num_heads):
            width = (i + 2) * dim
            self.a.append(torch.nn.Parameter(torch.zeros(dim, width)))
            self.a_bias.append(torch.nn.Parameter(_bias_init(dim, width, gen)))
            r = torch.zeros(dim, width)
            r[:, :dim] = torch.eye(dim)
            self.r.append(torch.nn.Parameter(r))
            self.r_bias.append(torch.nn.Parameter(torch.zeros(dim)))
        rest = max(0, num_layers - 1)
        self.w = torch.nn.Parameter(torch.zeros(num_heads, rest, dim, dim))
        self.b = torch.nn.Parameter(
            torch.stack([_bias_init(dim, dim, gen) for _ in range(num_heads * rest)])
            .view(num_heads, rest, dim) if rest else torch.zeros(num_heads, 0, dim))
        self.lm = torch.nn.Parameter(embedding.detach().clone().expand(num_heads, vocab, dim)
                                     .contiguous())
        self.lm_bias = torch.nn.Parameter(torch.zeros(num_heads, vocab))

    def head(self, i, h, tokens_before):
        """Head i: h [N, dim], tokens_before [N, i + 1] (t_0..t_i) -> logits [N, vocab]."""
        assert tokens_before.shape[-1] == i + 1
        u = torch.cat((h, self.embedding[tokens_before].flatten(-2)), -1)
        x = F.linear(u, self.r[i], self.r_bias[i]) + F.silu(F.linear(u, self.a[i], self.a_bias[i]))
        for layer in range(self.num_layers - 1):
            x = x + F.silu(F.linear(x, self.w[i, layer], self.b[i, layer]))
        return F.linear(x, self.lm[i], self.lm_bias[i])

    def forward(self, h, chains):
        """h [N, dim], chains [N, >= K] (t_0 = y_1, ...) -> logits [K, N, vocab]."""
        return torch.stack([self.head(i, h, chains[:, : i + 1]) for i in range(self.num_heads)])

    def tensors(self):
        """Name -> tensor, zankner/Hydra's hydra_head state dict for hydra_head_arch "mlp" with
        grounded_heads (hydra_mlp.{head}.{block}..., hydra_lm_head.{head}...)."""
        out = {}
        for i in range(self.num_heads):
            out[f"hydra_mlp.{i}.0.linear.weight"] = self.a[i]
            out[f"hydra_mlp.{i}.0.linear.bias"] = self.a_bias[i]
            out[f"hydra_mlp.{i}.0.res_connection.weight"] = self.r[i]
            out[f"hydra_mlp.{i}.0.res_connection.bias"] = self.r_bias[i]
            for layer in range(1, self.num_layers):
                out[f"hydra_mlp.{i}.{layer}.linear.weight"] = self.w[i, layer - 1]
                out[f"hydra_mlp.{i}.{layer}.linear.bias"] = self.b[i, layer - 1]
        for i in range(self.num_heads):
            out[f"hydra_lm_head.{i}.weight"] = self.lm[i]
            out[f"hydra_lm_head.{i}.bias"] = self.lm_bias[i]
        return out

    def load(self, tensors):
        with torch.no_grad():
            for i in range(self.num_heads):
                self.a[i].copy_(tensors[f"hydra_mlp.{i}.0.linear.weight"])
                self.a_bias[i].copy_(tensors[f"hydra_mlp.{i}.0.linear.bias"])
                self.r[i].copy_(tensors[f"hydra_mlp.{i}.0.res_connection.weight"])
                self.r_bias[i].copy_(tensors[f"hydra_mlp.{i}.0.res_connection.bias"])
                for layer in range(1, self.num_layers):
                    self.w[i, layer - 1].copy_(tensors[f"hydra_mlp.{i}.{layer}.linear.weight"])
                    self.b[i, layer - 1].copy_(tensors[f"hydra_mlp.{i}.{layer}.linear.bias"])
                self.lm[i].copy_(tensors[f"hydra_lm_head.{i}.weight"])
                self.lm_bias[i].copy_(tensors[f"hydra_lm_head.{i}.bias"])
        return self

    def config(self, base):
        return {"hydra_num_heads": self.num_heads, "hydra_num_layers": self.num_layers,
                "hydra_head_arch": "mlp", "grounded_heads": True, "hidden_state_offset": 0,
                "base_model_name_or_path": base, "hidden_size": self.dim,
                "vocab_size": self.vocab}


def make_heads(kind, num_heads, num_layers, target, gen):
    emb = target.tok_embeddings.detach()
    if kind == "medusa":
        return MedusaHeads(num_heads, num_layers, emb, gen)
    return HydraHeads(num_heads, num_layers, emb, gen)


def all_logits(heads, h, chains):
    """[K, N, vocab] logits of every head, teacher-forced on the greedy chains for Hydra."""
    return heads(h) if isinstance(heads, MedusaHeads) else heads(h, chains)


# ----------------------------------------------------------------------------------------------
# Self-distillation data


def build_dataset(target, stories, starts, depth, batch_tokens):
    """Per story, the rows of positions starts[i]..len-2: (h [N, dim], chains [N, depth]), the
    final hidden state and the target's greedy continuation y_1..y_depth at each position."""
    order = sorted(range(len(stories)), key=lambda i: len(stories[i]))
    hs, cs = [None] * len(stories), [None] * len(stories)
    i = 0
    while i < len(order):
        j = i + 1
        while j < len(order) and (j - i + 1) * (len(stories[order[j]]) - 1) <= batch_tokens:
            j += 1
        idx = order[i:j]
        T = len(stories[idx[-1]]) - 1
        inputs = torch.zeros((len(idx), T), dtype=torch.long)
        for r, k in enumerate(idx):
            inputs[r, : len(stories[k]) - 1] = stories[k][:-1]
        h, c = greedy_chains(target, inputs, depth)
        for r, k in enumerate(idx):
            n = len(stories[k]) - 1
            hs[k], cs[k] = h[r, starts[k] : n].clone(), c[r, starts[k] : n].clone()
        i = j
    return torch.cat(hs), torch.cat(cs)


# ----------------------------------------------------------------------------------------------
# Training and evaluation


def loss_fn(logits, chains, weights):
    """Weighted mean over heads of the cross-entropy of head i against y_{i+2}."""
    K = logits.shape[0]
    losses = torch.stack([F.cross_entropy(logits[i], chains[:, i + 1]) for i in range(K)])
    return (losses * weights).sum() / weights.sum(), losses


@torch.no_grad()
def evaluate(heads, h, chains, topk, batch=8192):
    """Per head: the rank of the label y_{i+2} among the head's logits (0 = top-1). Returns
    {"top1", "top5", "top10": [K], "rank_accuracy": [K][topk] (P(rank == k)), "loss": [K]}."""
    K = heads.num_heads
    counts = torch.zeros(K, topk, dtype=torch.float64)
    loss = torch.zeros(K, dtype=torch.float64)
    for start in range(0, len(h), batch):
        lg = all_logits(heads, h[start : start + batch], chains[start : start + batch])
        for i in range(K):
            label = chains[start : start + batch, i + 1]
            target_logit = lg[i].gather(-1, label[:, None])
            rank = (lg[i] > target_logit).sum(-1)
            counts[i] += torch.bincount(rank.clamp(max=topk), minlength=topk + 1)[:topk]
            loss[i] += F.cross_entropy(lg[i], label, reduction="sum").item()
    acc = counts / len(h)
    cum = acc.cumsum(1)
    return {"top1": cum[:, 0].tolist(), "top5": cum[:, min(4, topk - 1)].tolist(),
            "top10": cum[:, min(9, topk - 1)].tolist(), "rank_accuracy": acc.tolist(),
            "loss": (loss / len(h)).tolist()}


def train_heads(kind, target, data, heldout, args, log):
    gen = torch.Generator().manual_seed(args.seed + (1 if kind == "medusa" else 2))
    layers = args.medusa_layers if kind == "medusa" else args.hydra_layers
    heads = make_heads(kind, args.num_heads, layers, target, gen)
    h_train, c_train = data
    opt = torch.optim.AdamW(heads.parameters(), lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=args.weight_decay)
    weights = torch.tensor([args.head_decay ** i for i in range(args.num_heads)])
    steps = args.medusa_steps if kind == "medusa" else args.hydra_steps

    def lr_at(step):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        cosine = 0.5 * (1 + math.cos(math.pi * (step - args.warmup) / max(1, steps - args.warmup)))
        return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * cosine)

    log(f"training {kind}: {args.num_heads} heads x {layers} layers, "
        f"{sum(p.numel() for p in heads.parameters())} parameters, {steps} steps of "
        f"{args.batch} positions")
    perm, cursor = torch.randperm(len(h_train), generator=gen), 0
    history, t0 = [], time.time()
    for step in range(steps):
        if cursor + args.batch > len(perm):
            perm, cursor = torch.randperm(len(h_train), generator=gen), 0
        idx = perm[cursor : cursor + args.batch]
        cursor += args.batch
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss, _ = loss_fn(all_logits(heads, h_train[idx], c_train[idx]), c_train[idx], weights)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if (step + 1) % args.eval_every == 0 or step + 1 == steps:
            m = evaluate(heads, *heldout, args.topk)
            history.append({"step": step + 1, "train_loss": loss.item(), **{
                k: m[k] for k in ("loss", "top1", "top5")}})
            log(f"  [{kind}] step {step + 1}/{steps} loss {loss.item():.3f}; held-out top-1 "
                + " ".join(f"{a:.3f}" for a in m["top1"]) + ", top-5 "
                + " ".join(f"{a:.3f}" for a in m["top5"]) + f" ({time.time() - t0:.0f} s)")
    return heads.requires_grad_(False), history, time.time() - t0


# ----------------------------------------------------------------------------------------------
# Trees and the greedy simulation


def sparse_tree(rank_accuracy, nodes):
    """The Medusa sparse tree: starting from the root, repeatedly add the path [k_1, ..., k_d]
    (k_j: rank in head j-1's top-k) with the highest expected acceptance prod_j acc[j-1][k_j]
    among the children of the paths already in the tree. Returns (paths sorted by depth then
    lexicographically, their expected acceptance; the expected accepted length 1 + sum)."""
    acc = rank_accuracy
    K, topk = len(acc), len(acc[0])
    heap = [(-acc[0][k], (k,)) for k in range(topk)]
    heapq.heapify(heap)
    chosen = {}
    while heap and len(chosen) < nodes:
        neg, path = heapq.heappop(heap)
        chosen[path] = -neg
        if len(path) < K:
            for k in range(topk):
                heapq.heappush(heap, (neg * acc[len(path)][k], path + (k,)))
    paths = sorted(chosen, key=lambda p: (len(p), p))
    return [list(p) for p in paths], [chosen[p] for p in paths], 1 + sum(chosen.values())


def chain_tree(depth):
    return [[0] * d for d in range(1, depth + 1)]


@torch.no_grad()
def simulate(heads, target, prompts, tree, new_tokens):
    """Greedy speculative decoding on `prompts` with `heads` drafting `tree` (top-k index paths),
    as specdec's decoder runs it: prefill prompt[:-1]; each step the heads read the hidden state
    of the token before the root (the last committed token) and draft the tree, the target's
    greedy path through it is accepted plus one token. Stops after new_tokens tokens or EOS.
    The target's greedy continuation is computed once per prompt; a tree forward gives the same
    argmax along the accepted path. Returns totals and per-prompt numbers."""
    depth = max(len(p) for p in tree)
    children = {}
    for p in tree:
        children.setdefault(tuple(p[:-1]), []).append(p[-1])
    total_steps = total_accepted = total_tokens = 0
    per_depth = [0] * depth
    rows = []
    for prompt in prompts:
        P = len(prompt)
        seq = greedy(target, prompt, P + new_tokens + depth + 1)
        hidden = target.hidden(torch.tensor([seq[:-1]]))[0]
        t, emitted, steps, accepted, done = P - 1, 0, 0, 0, False
        while not done:
            h = hidden[t - 1 : t]
            tokens = {(): seq[t]}  # path -> drafted token; () is the root
            top = {}

            def token(path):
                if path not in tokens:
                    parent = path[:-1]
                    if parent not in top:
                        before = [tokens[parent[:j]] for j in range(len(parent) + 1)]
                        lg = heads.head(len(parent), h, torch.tensor([before]))[0]
                        top[parent] = lg.topk(max(children[parent]) + 1).indices.tolist()
                    tokens[path] = top[parent][path[-1]]
                return tokens[path]

            path = ()
            while path in children:  # walk the target's greedy path through the tree
                nxt = seq[t + 1 + len(path)]
                hit = [k for k in children[path] if token(path + (k,)) == nxt]
                if not hit:
                    break
                path = path + (hit[0],)
            m = len(path)
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
    return {"mean_accepted_length": (total_accepted + total_steps) / total_steps,
            "tokens_per_step": total_tokens / total_steps, "steps": total_steps,
            "accepted": total_accepted, "tokens": total_tokens,
            "acceptance_at_depth": [c / total_steps for c in per_depth], "per_prompt": rows}


# ----------------------------------------------------------------------------------------------
# Files


def export(kind, heads, out_dir, dtype, base, tree):
    """Writes config.json, the safetensors file and tree.json into out_dir; returns file info."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, FILES[kind])
    size = safetensors.write(path, heads.tensors(), dtype, {"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(heads.config(base), f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "tree.json"), "w") as f:
        f.write("[" + ", ".join(json.dumps(p) for p in tree) + "]\n")
    return {"path": os.path.join(kind, FILES[kind]), "bytes": size, "sha256": sha256(path),
            "dtype": dtype}


def reload(kind, out_dir, target):
    """Builds heads from the files in out_dir (checks that the tensor names are exactly those
    the config implies)."""
    cfg = json.load(open(os.path.join(out_dir, "config.json")))
    tensors, _, _ = safetensors.read(os.path.join(out_dir, FILES[kind]))
    n, layers = ((cfg["medusa_num_heads"], cfg["medusa_num_layers"]) if kind == "medusa"
                 else (cfg["hydra_num_heads"], cfg["hydra_num_layers"]))
    heads = make_heads(kind, n, layers, target, torch.Generator().manual_seed(0))
    expected = {k: tuple(v.shape) for k, v in heads.tensors().items()}
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    assert got == expected, f"{out_dir}: tensors {sorted(set(got) ^ set(expected))} differ"
    return heads.load(tensors).requires_grad_(False)


def convert(args):
    """Rewrites the heads in args.convert with tensors in args.dtype into args.out_dir."""
    os.makedirs(args.out_dir, exist_ok=True)
    for kind, name in FILES.items():
        src = os.path.join(args.convert, name)
        if not os.path.exists(src):
            continue
        tensors, _, metadata = safetensors.read(src)
        size = safetensors.write(os.path.join(args.out_dir, name), tensors, args.dtype, metadata)
        for extra in ("config.json", "tree.json"):
            if os.path.exists(os.path.join(args.convert, extra)):
                with open(os.path.join(args.convert, extra)) as f, \
                        open(os.path.join(args.out_dir, extra), "w") as g:
                    g.write(f.read())
        print(f"wrote {os.path.join(args.out_dir, name)} ({args.dtype}, {size} bytes)")
        return
    sys.exit(f"{args.convert}: no {' or '.join(FILES.values())}")


# ----------------------------------------------------------------------------------------------


def main():
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
    ap.add_argument("--out-dir", default=os.path.join(here, "heads"),
                    help="writes medusa/ and hydra/ (config.json, safetensors, tree.json) and "
                    "metrics.json here")
    ap.add_argument("--kinds", default="medusa,hydra")
    ap.add_argument("--dtype", choices=safetensors.DTYPES, default="F32",
                    help="tensor type of the exported files")
    ap.add_argument("--convert", metavar="DIR", default=None,
                    help="only rewrite the heads file in DIR with --dtype tensors into --out-dir")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--num-heads", type=int, default=4)
    ap.add_argument("--medusa-layers", type=int, default=4)
    ap.add_argument("--hydra-layers", type=int, default=4)
    ap.add_argument("--bos-stories", type=int, default=2048, help="training stories from BOS")
    ap.add_argument("--prompt-stories", type=int, default=32,
                    help="training stories per fixture prompt")
    ap.add_argument("--heldout-stories", type=int, default=128, help="held-out stories from BOS")
    ap.add_argument("--max-len", type=int, default=256,
                    help="story length cap in tokens, BOS included")
    ap.add_argument("--sample-batch", type=int, default=256)
    ap.add_argument("--chain-batch-tokens", type=int, default=4096)
    ap.add_argument("--medusa-steps", type=int, default=4000)
    ap.add_argument("--hydra-steps", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=1024, help="positions per optimiser step")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--head-decay", type=float, default=0.8,
                    help="head i's loss weight is head_decay^i")
    ap.add_argument("--eval-every", type=int, default=1000)
    ap.add_argument("--topk", type=int, default=10, help="ranks measured per head for the tree")
    ap.add_argument("--tree-nodes", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=128, help="simulation: tokens per prompt")
    args = ap.parse_args()
    if args.convert:
        return convert(args)

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
    K = args.num_heads
    assert args.max_len - 2 + K + 1 <= target.cfg.seq_len
    log(f"target reproduces the {n_ref} reference greedy ids")
    tok = Tokenizer(args.tokenizer)
    prompts = [tok.encode(json.loads(line)["prompt"]) for line in open(args.prompts)
               if line.strip()]
    log(f"{len(prompts)} prompts of {min(map(len, prompts))}..{max(map(len, prompts))} tokens")

    # 2. self-distillation data
    gen = torch.Generator().manual_seed(args.seed)
    t0 = time.time()
    train = sample_continuations(target, [BOS], args.bos_stories, args.sample_batch,
                                 args.max_len, gen)
    starts = [1] * len(train)
    for p in prompts:
        if args.prompt_stories > 0:
            train += sample_continuations(target, p, args.prompt_stories, args.sample_batch,
                                          args.max_len, gen)
            starts += [len(p)] * args.prompt_stories
    heldout = sample_continuations(target, [BOS], args.heldout_stories, args.sample_batch,
                                   args.max_len, gen)
    sample_s = time.time() - t0
    log(f"sampled {len(train)} training and {len(heldout)} held-out stories in {sample_s:.0f} s "
        f"({sum(map(len, train)) + sum(map(len, heldout))} tokens)")
    t0 = time.time()
    data = build_dataset(target, train, starts, K + 1, args.chain_batch_tokens)
    held = build_dataset(target, heldout, [1] * len(heldout), K + 1, args.chain_batch_tokens)
    chain_s = time.time() - t0
    log(f"hidden states and greedy continuations: {len(data[0])} training and {len(held[0])} "
        f"held-out positions in {chain_s:.0f} s")
    check = [greedy(target, heldout[0][: s + 1].tolist(), s + 2 + K)[s + 1 :]
             for s in range(1, len(heldout[0]) - 1, 7)]
    assert check == held[1][: len(heldout[0]) - 2][::7].tolist(), \
        "greedy continuations differ from KV-cache greedy decoding"
    log(f"greedy continuations match KV-cache greedy decoding at {len(check)} positions")

    summary = {"argv": sys.argv, "torch": torch.__version__, "threads": args.threads,
               "args": vars(args),
               "prompts": prompts,
               "corpus": {"train_stories": len(train), "heldout_stories": len(heldout),
                          "train_positions": len(data[0]), "heldout_positions": len(held[0]),
                          "sample_seconds": sample_s, "chain_seconds": chain_s},
               "kinds": {}}
    base = os.path.basename(args.target)
    for kind in kinds:
        heads, history, train_s = train_heads(kind, target, data, held, args, log)
        m = evaluate(heads, *held, args.topk)
        tree, values, expected = sparse_tree(m["rank_accuracy"], args.tree_nodes)
        chain = chain_tree(K)
        sim_chain = simulate(heads, target, prompts, chain, args.new_tokens)
        sim_tree = simulate(heads, target, prompts, tree, args.new_tokens)
        log(f"  [{kind}] held-out top-1 " + " ".join(f"{a:.3f}" for a in m["top1"])
            + ", top-5 " + " ".join(f"{a:.3f}" for a in m["top5"]) + ", top-10 "
            + " ".join(f"{a:.3f}" for a in m["top10"]))
        log(f"  [{kind}] fixture prompts x {args.new_tokens} tokens, greedy: mean accepted "
            f"length {sim_chain['mean_accepted_length']:.3f} (chain of {K}), "
            f"{sim_tree['mean_accepted_length']:.3f} (tree of {len(tree)} nodes, expected "
            f"{expected:.3f})")
        out = os.path.join(args.out_dir, kind)
        files = export(kind, heads, out, args.dtype, base, tree)
        reread = reload(kind, out, target)
        probe = slice(0, 4096)
        diff = (all_logits(reread, held[0][probe], held[1][probe])
                - all_logits(heads, held[0][probe], held[1][probe])).abs().max().item()
        assert args.dtype != "F32" or diff == 0.0, f"{out}: re-read heads differ by {diff}"
        log(f"  [{kind}] wrote {files['path']} ({files['bytes']} bytes, {args.dtype}); re-read "
            f"logits differ by {diff:.1e}")
        summary["kinds"][kind] = {
            "config": heads.config(base),
            "parameters": sum(p.numel() for p in heads.parameters()),
            "train_seconds": train_s, "history": history, "heldout": m,
            "tree": tree, "tree_expected_acceptance": values,
            "tree_expected_accepted_length": expected,
            "simulation_chain": sim_chain, "simulation_tree": sim_tree,
            "file": files, "reread_max_abs_diff": diff}
    summary["total_seconds"] = time.time() - t_start
    with open(os.path.join(args.out_dir, "metrics.json"), "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    log(f"done in {summary['total_seconds']:.0f} s")


if __name__ == "__main__":
    main()
