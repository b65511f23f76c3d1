#!/usr/bin/env python3
"""Trains a parallel draft model (PARD, arXiv 2504.18583) for the stories260K fixture: the
distilled draft model of tools/draft (stories_draft.bin) fine-tuned to predict K tokens in one
forward, from the root and K - 1 mask tokens appended after it.

The mask token is an id of the vocabulary the text never uses (tok512's <unk>, id 0), so the file
stays a plain llama2.c draft of the target's vocabulary; the proposer is told the id
(`--mask-token`). Input [x_0 .. x_t, m, .., m] (K - 1 masks at positions t + 1 .. t + K - 1),
causal attention: x_t's row drafts x_{t+1} (the ordinary next-token row), mask j's row drafts
x_{t+1+j}. Training: stories the teacher samples at temperature 1 (as tools/train_draft.py);
each step a batch of stories, the next-token rows and, at random anchors t, a block of K - 1
masks whose rows attend to x_0 .. x_t and to the masks before them; every row's loss is
KL(p_teacher || q) against the teacher's distribution at that position given the true story (the
mask rows learn the teacher's distribution of x_{t+1+j} averaged over the tokens between).

    OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 tools/train_pard.py
"""

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from training.llama import (BOS, apply_rope, read_legacy, rms_norm,  # noqa: E402
                            write_legacy)
from training.runtime import keep_freed_memory, sha256, warmup_cosine  # noqa: E402
from training.teacher import (greedy, length_batches, load_teacher, pad_batch,  # noqa: E402
                              sample_stories)
from training.tokenizer import Tokenizer  # noqa: E402


def pard_forward(m, tokens, t, K, mask_id):
    """tokens [B, L] (causal rows), t [B, A] anchors: returns (logits of the L rows [B, L, V],
    logits of the A blocks of K - 1 mask rows [B, A, K - 1, V]); mask j of block (b, a) sits at
    position t + j (j = 1 .. K - 1) and sees tokens 0 .. t and masks 1 .. j of its block."""
    c = m.cfg
    B, L = tokens.shape
    A = t.shape[1]
    nh, nkv, hs = c.n_heads, c.n_kv_heads, c.head_size
    rep = nh // nkv
    scale = 1.0 / math.sqrt(hs)
    x = m.tok_embeddings[tokens]
    xm = m.tok_embeddings[torch.full((B, A, K - 1), mask_id, dtype=torch.long)]
    cos, sin = m.rope_cos[:L], m.rope_sin[:L]
    mpos = t[..., None] + torch.arange(1, K)
    mcos, msin = m.rope_cos[mpos], m.rope_sin[mpos]
    causal = torch.full((L, L), float("-inf")).triu(1)
    ctx_mask = torch.where(torch.arange(L)[None, None, :] <= t[..., None], 0.0,
                           float("-inf"))[:, :, None, None, :]  # [B, A, 1, 1, L]
    own_mask = torch.full((K - 1, K - 1), float("-inf")).triu(1)
    for layer in range(c.n_layers):
        h = rms_norm(x, m.rms_att[layer], c.rms_eps)
        q = apply_rope((h @ m.wq[layer].T).view(B, L, nh, hs), cos, sin)
        k = apply_rope((h @ m.wk[layer].T).view(B, L, nkv, hs), cos, sin)
        v = (h @ m.wv[layer].T).view(B, L, nkv, hs)
        k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
        s = torch.einsum("blhd,bjhd->bhlj", q, k) * scale + causal
        o = torch.einsum("bhlj,bjhd->blhd", torch.softmax(s, -1), v).reshape(B, L, c.dim)
        hm = rms_norm(xm, m.rms_att[layer], c.rms_eps)
        qm = apply_rope((hm @ m.wq[layer].T).view(B, A, K - 1, nh, hs), mcos, msin)
        km = apply_rope((hm @ m.wk[layer].T).view(B, A, K - 1, nkv, hs), mcos, msin)
        vm = (hm @ m.wv[layer].T).view(B, A, K - 1, nkv, hs)
        km, vm = km.repeat_interleave(rep, 3), vm.repeat_interleave(rep, 3)
        sc = torch.einsum("baihd,bjhd->bahij", qm, k) * scale + ctx_mask
        so = torch.einsum("baihd,bajhd->bahij", qm, km) * scale + own_mask
        p = torch.softmax(torch.cat((sc, so), -1), -1)
        om = (torch.einsum("bahij,bjhd->baihd", p[..., :L], v)
              + torch.einsum("bahij,bajhd->baihd", p[..., L:], vm)).reshape(B, A, K - 1, c.dim)
        x = x + o @ m.wo[layer].T
        xm = xm + om @ m.wo[layer].T
        for which in (0, 1):
            y = x if which == 0 else xm
            n = rms_norm(y, m.rms_ffn[layer], c.rms_eps)
            y = y + (F.silu(n @ m.w1[layer].T) * (n @ m.w3[layer].T)) @ m.w2[layer].T
            if which == 0:
                x = y
            else:
                xm = y
    E = m.tok_embeddings
    return (rms_norm(x, m.rms_final, c.rms_eps) @ E.T,
            rms_norm(xm, m.rms_final, c.rms_eps) @ E.T)


def gather(t, idx):
    """t [B, L, ...], idx [B, ...] -> t[b, idx[b, ...]] (indices clamped)."""
    idx = idx.clamp(max=t.shape[1] - 1)
    flat = idx.reshape(idx.shape[0], -1)
    out = torch.stack([t[b, flat[b]] for b in range(t.shape[0])])
    return out.reshape(*idx.shape, *t.shape[2:])


def kl(teacher_logp, logits):
    """KL(p || q) per row."""
    return (teacher_logp.exp() * (teacher_logp - torch.log_softmax(logits, -1))).sum(-1)


@torch.no_grad()
def evaluate(m, teacher, stories, K, mask_id, batch_tokens):
    """Held-out agreement with the teacher's argmax of each row (the ordinary row, then mask
    rows 1..K-1), the mask rows anchored at every position; and the expected greedy chain length
    of K drafts when each row's agreement is taken as independent, 1 + sum of cumulative
    products (a proxy; the C++ tests measure the real one)."""
    hit = torch.zeros(K, dtype=torch.float64)
    seen = torch.zeros(K, dtype=torch.float64)
    for idx in length_batches(stories, batch_tokens):
        inputs, _, valid = pad_batch(stories, idx)
        B, L = inputs.shape
        t_logits = teacher(inputs)
        t = torch.arange(0, L).expand(B, -1)
        logits, mlogits = pard_forward(m, inputs, t, K, mask_id)
        hit[0] += ((logits.argmax(-1) == t_logits.argmax(-1)) & valid).sum()
        seen[0] += valid.sum()
        for j in range(1, K):
            pos = t + j
            ok = pos < valid.sum(1, keepdim=True)
            agree = mlogits[:, :, j - 1].argmax(-1) == gather(t_logits, pos).argmax(-1)
            hit[j] += (agree & ok).sum()
            seen[j] += ok.sum()
    acc = (hit / seen.clamp(min=1)).tolist()
    expected, p = 1.0, 1.0
    for a in acc:
        p *= a
        expected += p
    return {"agreement": acc, "expected_chain_length_independent": expected}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    shared = os.path.join(os.path.dirname(os.path.dirname(here)), "shared")
    model_dir = os.environ.get("SPECDEC_MODEL_DIR", os.path.join(shared, "models"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--teacher", default=os.path.join(model_dir, "stories260K.bin"))
    ap.add_argument("--reference",
                    default=os.path.join(model_dir, "reference_greedy_once_upon_a_time.ids"))
    ap.add_argument("--tokenizer", default=os.path.join(model_dir, "tok512.bin"))
    ap.add_argument("--student", default=os.path.join(here, "draft", "stories_draft.bin"))
    ap.add_argument("--out", default=os.path.join(here, "draft", "pard", "stories_pard.bin"))
    ap.add_argument("--mask-token", type=int, default=0, help="the mask id (tok512's <unk>)")
    ap.add_argument("--k", type=int, default=8, help="tokens per forward: the root's row + K-1 masks")
    ap.add_argument("--seed", type=int, default=504)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--stories", type=int, default=2048)
    ap.add_argument("--heldout", type=int, default=128)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--sample-batch", type=int, default=256)
    ap.add_argument("--batch-tokens", type=int, default=4096)
    ap.add_argument("--anchors", type=int, default=32, help="mask blocks per story per step")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--min-lr-ratio", type=float, default=0.05)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--eval-every", type=int, default=500)
    args = ap.parse_args()

    keep_freed_memory()
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(args.seed)
    t_start = time.time()

    def log(msg):
        print(f"[{time.time() - t_start:7.1f} s] {msg}", flush=True)

    teacher, n_ref, _ = load_teacher(args.teacher, args.reference)
    log(f"teacher reproduces the {n_ref} reference greedy ids")
    student, rope_error = read_legacy(args.student)
    assert rope_error < 1e-5
    assert student.cfg.vocab_size == teacher.cfg.vocab_size
    tok = Tokenizer(args.tokenizer)
    K, mask_id = args.k, args.mask_token
    gen = torch.Generator().manual_seed(args.seed)
    train, _ = sample_stories(teacher, args.stories, args.sample_batch, args.max_len, gen, None)
    held, _ = sample_stories(teacher, args.heldout, args.sample_batch, args.max_len, gen, None)
    used = sum(int((s == mask_id).sum()) for s in train + held)
    assert used == 0, f"the mask id {mask_id} occurs {used} times in the sampled text"
    log(f"sampled {len(train)} + {len(held)} stories ({sum(map(len, train))} tokens); mask id "
        f"{mask_id} ({tok.pieces[mask_id]!r}) never occurs")

    before = evaluate(student, teacher, held, K, mask_id, args.batch_tokens)
    log("before: agreement " + " ".join(f"{a:.3f}" for a in before["agreement"]))
    params = [p for p in student.parameters()]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    lr_at = warmup_cosine(args.lr, args.warmup, args.steps, args.min_lr_ratio)
    batches = length_batches(train, args.batch_tokens)
    order, cursor = torch.randperm(len(batches), generator=gen).tolist(), 0
    history, t0 = [], time.time()
    for step in range(args.steps):
        if cursor == len(order):
            order, cursor = torch.randperm(len(batches), generator=gen).tolist(), 0
        inputs, _, valid = pad_batch(train, batches[order[cursor]])
        cursor += 1
        B, L = inputs.shape
        with torch.no_grad():
            t_logp = torch.log_softmax(teacher(inputs), -1)
        lengths = valid.sum(1)
        u = torch.rand((B, args.anchors), generator=gen, dtype=torch.float64)
        t = (u * lengths[:, None].double()).long()  # anchors 0 .. length - 1
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        logits, mlogits = pard_forward(student, inputs, t, K, mask_id)
        ar = (kl(t_logp, logits) * valid).sum() / valid.sum()
        pos = t[..., None] + torch.arange(1, K)  # mask j drafts x_{t+1+j}: the teacher's row t + j
        ok = pos < lengths[:, None, None]
        mk = (kl(gather(t_logp, pos), mlogits) * ok).sum() / ok.sum().clamp(min=1)
        loss = ar + mk
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, args.clip)
        opt.step()
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            e = evaluate(student, teacher, held, K, mask_id, args.batch_tokens)
            history.append({"step": step + 1, "loss": loss.item(), "next_token_kl": ar.item(),
                            "mask_kl": mk.item(), "heldout": e, "seconds": time.time() - t0})
            log(f"step {step + 1}/{args.steps} KL next {ar.item():.3f} masks {mk.item():.3f}; "
                "held-out agreement " + " ".join(f"{a:.3f}" for a in e["agreement"]))
    student.requires_grad_(False)
    after = evaluate(student, teacher, held, K, mask_id, args.batch_tokens)
    size = write_legacy(student, args.out)
    reread, _ = read_legacy(args.out)
    probe = torch.tensor([[BOS, 403, 407, 261, 378]])
    diff = (reread(probe) - student(probe)).abs().max().item()
    assert diff == 0.0, f"{args.out}: re-read model differs by {diff}"
    # The same drafts through the inference path (root + K - 1 masks, causal, with a cache) as
    # through the training path.
    ref = greedy(teacher, [BOS, 403, 407, 261, 378], 5 + 24)
    cache = student.new_cache(1, 64)
    n = len(ref) - K
    student(torch.tensor([ref[: n - 1]]), 0, cache)
    infer = student(torch.tensor([[ref[n - 1]] + [mask_id] * (K - 1)]), n - 1, cache)[0]
    logits, mlogits = pard_forward(student, torch.tensor([ref[:n]]), torch.tensor([[n - 1]]), K,
                                   mask_id)
    train_path = torch.cat((logits[0, n - 1 : n], mlogits[0, 0]), 0)
    paths = (infer - train_path).abs().max().item()
    assert paths < 1e-4, f"the inference and training paths differ by {paths}"
    summary = {"argv": sys.argv, "torch": torch.__version__, "args": vars(args),
               "mask_piece": tok.pieces[mask_id].decode("utf-8", "replace"), "corpus_tokens": sum(map(len, train)),
               "before": before, "after": after, "history": history,
               "file": {"path": os.path.relpath(args.out, here), "bytes": size,
                        "sha256": sha256(args.out)},
               "paths_max_abs_diff": paths, "total_seconds": time.time() - t_start}
    with open(os.path.join(os.path.dirname(args.out), "metrics.json"), "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    log(f"wrote {args.out} ({size} bytes); agreement " +
        " ".join(f"{a:.3f}" for a in after["agreement"]) + f"; done in {summary['total_seconds']:.0f} s")


if __name__ == "__main__":
    main()
