#!/usr/bin/env python3
"""Distil a small draft model for speculative decoding from the stories260K fixture.

1. Load the teacher (llama2.c legacy checkpoint) into the Llama of training/llama.py and check
   it reproduces the fixture's reference greedy ids.
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
import os
import sys
import time

import numpy as np
import torch

from training.llama import BOS, Config, Llama, read_legacy, write_legacy
from training.runtime import adamw, warmup_cosine
from training.teacher import (PROMPT_LEN, length_batches, load_teacher, pad_batch, sample_stories,
                              teacher_log_probs)

# ----------------------------------------------------------------------------------------------
# Batching


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
    opt = adamw(student, cfg, args.lr, args.weight_decay)
    lr_at = warmup_cosine(args.lr, args.warmup, args.steps, args.min_lr_ratio)

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
    teacher, n_ref, rope_error = load_teacher(args.teacher, args.reference)
    tcfg = teacher.cfg
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
