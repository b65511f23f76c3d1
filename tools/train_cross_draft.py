#!/usr/bin/env python3
"""Train a draft model with another vocabulary than the stories260K fixture's, and a same-vocabulary
baseline of the same size trained with the same recipe.

1. Load the teacher (llama2.c legacy checkpoint) and check it reproduces the fixture's reference
   greedy ids, as train_draft.py does.
2. Sample the same corpus as train_draft.py (temperature 1 from BOS, same seed and counts) and
   decode every story to text with the teacher's tokenizer (tok512.bin).
3. Train a byte-level BPE tokenizer of 1,024 tokens on the training stories' text (the
   SentencePiece way, see training/bpe.py), laid out like tok512.bin; check that
   decode(encode(text)) == text on the held-out text.
4. Re-tokenise every story with it (BOS first, the original end token, if any, last; cut at the
   length cap).
5. Train two students of the same shape with the same recipe: cross-entropy on the sampled tokens
   (sequence-level distillation: the teacher's per-token distributions are over the other
   vocabulary). A: the new vocabulary, on the re-tokenised corpus; B: the teacher's vocabulary, on
   the teacher's tokens. Report held-out cross-entropy per token and per byte of text, top-1
   accuracy on the sampled tokens and, for B, KL to the teacher and top-1 agreement with its argmax.
6. Write the tokenizer and both students (llama2.c formats) and re-read each model to check it
   reproduces the torch logits.

CPU only, deterministic (fixed seeds, one thread by default). Run from the repository root:
    OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 tools/train_cross_draft.py
"""

import argparse
import collections
import dataclasses
import json
import math
import os
import sys
import time

import numpy as np
import torch

from train_draft import evaluate as evaluate_distill
from train_draft import greedy_agreement, parse_shape, plan_batches
from training.bpe import ChunkEncoder, train_bpe, write_tokenizer
from training.llama import BOS, EOS, Llama, read_legacy, write_legacy
from training.runtime import adamw, keep_freed_memory, sha256, warmup_cosine
from training.teacher import (length_batches, load_teacher, pad_batch, sample_stories,
                              teacher_log_probs)
from training.tokenizer import Tokenizer

TOKENIZER_FILE = "tok1024.bin"
CROSS_FILE = "stories_draft_tok1024.bin"
SAME_FILE = "stories_draft_same_vocab.bin"

# ----------------------------------------------------------------------------------------------
# Training and evaluation


def ce_loss(logits, targets, mask):
    """Token-averaged cross-entropy on the sampled tokens."""
    s_logp = torch.log_softmax(logits, -1)
    ce = -s_logp.gather(-1, targets[..., None])[..., 0]
    m = mask.float()
    return (ce * m).sum() / m.sum()


@torch.no_grad()
def evaluate_ce(student, seqs, nbytes, batch_tokens):
    """Held-out cross-entropy on the sampled tokens (per token, per byte of text) and top-1
    accuracy of next-token prediction, over all positions."""
    ce = top1 = 0.0
    count = 0
    for idx in length_batches(seqs, batch_tokens):
        inputs, targets, mask = pad_batch(seqs, idx)
        s_logp = torch.log_softmax(student(inputs), -1)
        for r, i in enumerate(idx):
            n = len(seqs[i]) - 1
            q = s_logp[r, :n]
            ce += -q.gather(-1, targets[r, :n, None]).sum().item()
            top1 += (q.argmax(-1) == targets[r, :n]).sum().item()
            count += n
    total_bytes = sum(nbytes)
    return {"ce_per_token": ce / count, "ce_per_byte": ce / total_bytes,
            "bits_per_byte": ce / total_bytes / math.log(2), "top1_accuracy": top1 / count,
            "positions": count, "bytes": total_bytes}


def train_student(cfg, embedding, train, heldout, heldout_bytes, args, log, name):
    """AdamW with warmup and cosine decay (train_draft.py's recipe) on cross-entropy. embedding:
    the initial token embedding [vocab, dim], or None for random."""
    gen = torch.Generator().manual_seed(args.seed + 1000 + cfg.dim * 31 + cfg.n_layers)
    student = Llama(cfg).init_random(gen)
    if embedding is not None:
        with torch.no_grad():
            student.tok_embeddings.copy_(embedding)
    opt = adamw(student, cfg, args.lr, args.weight_decay)
    lr_at = warmup_cosine(args.lr, args.warmup, args.steps, args.min_lr_ratio)

    plan = []
    t0 = time.time()
    tokens_seen = 0
    epochs = 0
    history = []
    losses = []
    for step in range(args.steps):
        if not plan:
            plan = plan_batches(train, args.batch_tokens, gen)
            epochs += 1
        idx = plan.pop()
        inputs, targets, mask = pad_batch(train, idx)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss = ce_loss(student(inputs), targets, mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), args.clip)
        opt.step()
        tokens_seen += int(mask.sum())
        losses.append(loss.item())
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            m = evaluate_ce(student, heldout, heldout_bytes, args.batch_tokens)
            recent = losses[-args.eval_every:]
            history.append({"step": step + 1, "train_ce_recent": sum(recent) / len(recent),
                            "seconds": time.time() - t0, "tokens_seen": tokens_seen, **m})
            log(f"  [{name}] step {step + 1}/{args.steps} loss {loss.item():.4f} held-out CE "
                f"{m['ce_per_token']:.4f}/token {m['ce_per_byte']:.4f}/byte top-1 "
                f"{m['top1_accuracy']:.4f} ({time.time() - t0:.0f} s, "
                f"{tokens_seen / 1e6:.2f}M tokens)")
    return student, history, time.time() - t0, tokens_seen, epochs


def check_file(student, path, heldout):
    """Writes the student, re-reads it and returns (bytes, max |logit diff|) on held-out text."""
    size = write_legacy(student, path)
    reread, rope_err = read_legacy(path)
    assert rope_err == 0.0, f"{path}: RoPE tables differ by {rope_err}"
    inputs, _, _ = pad_batch(heldout, list(range(min(16, len(heldout)))))
    with torch.no_grad():
        diff = (reread(inputs) - student(inputs)).abs().max().item()
    assert diff <= 1e-6, f"{path}: re-read logits differ by {diff}"
    return size, diff


def text_bytes(tok, ids):
    """Bytes of the text a token sequence spells (control tokens none, the dummy prefix dropped,
    byte tokens one byte)."""
    return len(tok.decode(ids).encode("utf-8"))


def end_token_stats(seqs):
    c = collections.Counter(int(s[-1]) if int(s[-1]) in (BOS, EOS) else -1 for s in seqs)
    return {"eos": c[EOS], "bos": c[BOS], "cut": c[-1]}


# ----------------------------------------------------------------------------------------------


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(here)
    model_dir = os.environ.get("SPECDEC_MODEL_DIR",
                               os.path.join(os.path.dirname(repo), "shared", "models"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--teacher", default=os.path.join(model_dir, "stories260K.bin"))
    ap.add_argument("--tokenizer", default=os.path.join(model_dir, "tok512.bin"),
                    help="the teacher's tokenizer")
    ap.add_argument("--reference",
                    default=os.path.join(model_dir, "reference_greedy_once_upon_a_time.ids"))
    ap.add_argument("--out-dir", default=None,
                    help="where the files go (default tools/draft/cross, with --quick "
                    "/tmp/cross_draft_quick)")
    ap.add_argument("--seed", type=int, default=260)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--train-stories", type=int, default=2560)
    ap.add_argument("--heldout-stories", type=int, default=192)
    ap.add_argument("--max-len", type=int, default=512,
                    help="story length cap in tokens, BOS included (both vocabularies)")
    ap.add_argument("--sample-batch", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=1024, help="size of the new vocabulary")
    ap.add_argument("--split-by-script", action=argparse.BooleanOptionalAction, default=True,
                    help="BPE: no piece mixes letters with punctuation/digits (SentencePiece's "
                    "split_by_unicode_script, as in tok512.bin)")
    ap.add_argument("--shape", default="32:2:4:2:86",
                    help="student shape, dim:layers:heads:kv_heads:hidden (both students)")
    ap.add_argument("--init-embedding", choices=("teacher-pca", "random"), default="teacher-pca",
                    help="student token embeddings: the teacher's projected on its top principal "
                    "directions (new tokens: the mean over the teacher tokens of their text), or "
                    "random")
    ap.add_argument("--steps", type=int, default=1200, help="optimiser steps per student")
    ap.add_argument("--batch-tokens", type=int, default=4096, help="padded positions per batch")
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--min-lr-ratio", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--eval-every", type=int, default=300)
    ap.add_argument("--check-stories", type=int, default=16,
                    help="held-out stories on which the chunked encoder is checked against "
                    "training/tokenizer.py's (slow) encoder, for both vocabularies")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 64 + 16 stories, 40 steps, output in /tmp")
    args = ap.parse_args()
    if args.quick:
        args.train_stories, args.heldout_stories, args.sample_batch = 64, 16, 64
        args.steps, args.warmup, args.eval_every, args.check_stories = 40, 10, 20, 4
    if args.out_dir is None:
        args.out_dir = "/tmp/cross_draft_quick" if args.quick else os.path.join(here, "draft",
                                                                                "cross")
    os.makedirs(args.out_dir, exist_ok=True)

    keep_freed_memory()
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(args.seed)
    t_start = time.time()
    timings = {}

    def log(msg):
        print(f"[{time.time() - t_start:7.1f} s] {msg}", flush=True)

    # 1. teacher
    teacher, n_ref, rope_error = load_teacher(args.teacher, args.reference)
    tcfg = teacher.cfg
    tok512 = Tokenizer(args.tokenizer)
    assert len(tok512) == tcfg.vocab_size
    log(f"teacher {tcfg.short()}, {tcfg.parameter_count()} parameters; reproduces the {n_ref} "
        f"reference greedy ids; RoPE tables match to {rope_error:.1e}")

    # 2. corpus: train_draft.py's (same generator, same order), decoded to text
    gen = torch.Generator().manual_seed(args.seed)
    max_len = min(args.max_len, tcfg.seq_len)
    t0 = time.time()
    train, _ = sample_stories(teacher, args.train_stories, args.sample_batch, max_len, gen, None)
    heldout, heldout_logps = sample_stories(teacher, args.heldout_stories, args.sample_batch,
                                            max_len, gen, torch.float32)
    timings["sample"] = time.time() - t0
    lens = np.array([len(s) for s in train + heldout])
    capped = int((lens == max_len).sum())
    log(f"sampled {len(lens)} stories in {timings['sample']:.0f} s: {int(lens.sum())} tokens, "
        f"length mean {lens.mean():.0f}, {capped} cut at {max_len}")
    few = list(range(min(8, len(heldout))))
    full = teacher_log_probs(teacher, [heldout[i] for i in few], args.batch_tokens)
    cache_diff = max((full[j] - heldout_logps[i]).abs().max().item() for j, i in enumerate(few))
    assert cache_diff < 1e-3, f"KV-cache and full-sequence teacher log-probs differ by {cache_diff}"
    train_text = [tok512.decode(s.tolist()) for s in train]
    heldout_text = [tok512.decode(s.tolist()) for s in heldout]
    replaced = sum(t.count("\ufffd") for t in train_text + heldout_text)
    log(f"decoded to text: {sum(len(t.encode()) for t in train_text)} + "
        f"{sum(len(t.encode()) for t in heldout_text)} bytes (train + held-out); "
        f"{replaced} invalid UTF-8 sequences replaced by U+FFFD")

    # 3. tokenizer
    t0 = time.time()
    pieces, scores, bpe_info = train_bpe(train_text, args.vocab, args.split_by_script)
    tok_path = os.path.join(args.out_dir, TOKENIZER_FILE)
    tok_size = write_tokenizer(tok_path, pieces, scores)
    tok_new = Tokenizer(tok_path)
    assert tok_new.pieces == pieces and len(tok_new) == args.vocab
    timings["bpe"] = time.time() - t0
    log(f"BPE: {bpe_info['characters']} characters, {bpe_info['merges']} merges "
        f"({bpe_info['repeated_merges']} more re-reached an existing piece), last merge count "
        f"{bpe_info['last_merge_count']}, max piece {tok_new.max_token_length} bytes; wrote "
        f"{tok_path} ({tok_size} bytes) in {timings['bpe']:.0f} s")

    enc512, enc_new = ChunkEncoder(tok512), ChunkEncoder(tok_new)
    t0 = time.time()
    n_check = min(args.check_stories, len(heldout_text))
    for t in heldout_text[:n_check]:
        assert enc512.encode(t) == tok512.encode(t), "chunked encoder differs (tok512)"
        assert enc_new.encode(t) == tok_new.encode(t), "chunked encoder differs (new vocabulary)"
    timings["encoder_check"] = time.time() - t0
    log(f"chunked encoder = reference encoder on {n_check} held-out stories, both vocabularies "
        f"({timings['encoder_check']:.0f} s)")

    t0 = time.time()
    stats = {}
    for name, enc, tok in (("tok512", enc512, tok512), ("new", enc_new, tok_new)):
        for split, texts in (("train", train_text), ("heldout", heldout_text)):
            ids = [enc.encode(t) for t in texts]
            roundtrip = sum(tok.decode(i) == t for i, t in zip(ids, texts))
            fallback = collections.Counter()
            for t in texts:
                fallback.update(enc.byte_fallbacks(t))
            nbytes = sum(len(t.encode()) for t in texts)
            ntok = sum(len(i) - 1 for i in ids)  # BOS excluded
            stats[f"{name}_{split}"] = {
                "stories": len(texts), "roundtrip_exact": roundtrip, "bytes": nbytes,
                "tokens": ntok, "mean_tokens_per_story": ntok / len(texts),
                "bytes_per_token": nbytes / ntok,
                "byte_fallback_characters": {repr(c): n for c, n in fallback.most_common()}}
            log(f"{name:6s} {split:7s}: {ntok / len(texts):.1f} tokens per story (BOS excluded), "
                f"{nbytes / ntok:.3f} bytes/token, round trip exact {roundtrip}/{len(texts)}, "
                f"byte fallback {dict(fallback.most_common(8))}")
    assert stats["new_heldout"]["roundtrip_exact"] == len(heldout_text)
    assert stats["new_train"]["roundtrip_exact"] == len(train_text)
    sampled = sum(len(s) - 2 if int(s[-1]) in (BOS, EOS) else len(s) - 1 for s in heldout)
    stats["teacher_sampled_heldout_tokens_per_story"] = sampled / len(heldout)

    # 4. re-tokenised corpus
    def retokenise(stories, texts):
        out = []
        for s, t in zip(stories, texts):
            ids = enc_new.encode(t)
            if int(s[-1]) in (BOS, EOS):
                ids.append(int(s[-1]))
            out.append(torch.tensor(ids[:max_len], dtype=torch.long))
        return out

    train_new, heldout_new = retokenise(train, train_text), retokenise(heldout, heldout_text)
    timings["tokenise"] = time.time() - t0
    heldout_bytes_512 = [text_bytes(tok512, s.tolist()) for s in heldout]
    heldout_bytes_new = [text_bytes(tok_new, s.tolist()) for s in heldout_new]
    corpus = {
        "train_stories": len(train), "heldout_stories": len(heldout),
        "teacher_tokens": int(lens.sum()), "teacher_mean_length": float(lens.mean()),
        "teacher_capped": capped,
        "teacher_train_positions": int(sum(len(s) - 1 for s in train)),
        "teacher_heldout_positions": int(sum(len(s) - 1 for s in heldout)),
        "teacher_end_tokens": end_token_stats(train + heldout),
        "new_train_positions": int(sum(len(s) - 1 for s in train_new)),
        "new_heldout_positions": int(sum(len(s) - 1 for s in heldout_new)),
        "new_mean_length": float(np.mean([len(s) for s in train_new + heldout_new])),
        "new_capped": int(sum(len(s) == max_len for s in train_new + heldout_new)),
        "new_end_tokens": end_token_stats(train_new + heldout_new),
        "heldout_text_bytes_teacher_tokens": sum(heldout_bytes_512),
        "heldout_text_bytes_new_tokens": sum(heldout_bytes_new),
        "invalid_utf8_replaced": replaced,
        "teacher_kv_cache_vs_full_max_abs_diff": cache_diff,
    }
    log(f"re-tokenised: {corpus['new_train_positions']} training positions (teacher's "
        f"{corpus['teacher_train_positions']}), {corpus['new_capped']} cut at {max_len}; held-out "
        f"text {corpus['heldout_text_bytes_new_tokens']} bytes "
        f"(teacher tokens spell {corpus['heldout_text_bytes_teacher_tokens']})")

    # teacher's own cross-entropy on its held-out samples
    t_ce = sum(-heldout_logps[i].gather(-1, heldout[i][1:, None]).sum().item()
               for i in range(len(heldout)))
    teacher_ref = {"ce_per_token": t_ce / corpus["teacher_heldout_positions"],
                   "ce_per_byte": t_ce / sum(heldout_bytes_512)}
    log(f"teacher's own held-out CE {teacher_ref['ce_per_token']:.4f}/token "
        f"{teacher_ref['ce_per_byte']:.4f}/byte")

    # 5. students
    u, s, _ = torch.linalg.svd(teacher.tok_embeddings.detach(), full_matrices=False)
    shape512 = parse_shape(args.shape, tcfg.vocab_size, tcfg.seq_len)
    shape_new = parse_shape(args.shape, args.vocab, tcfg.seq_len)
    assert shape512.dim <= s.numel(), "teacher-pca needs a student no wider than the teacher"
    proj = u[:, : shape512.dim] * s[: shape512.dim]  # teacher embeddings, projected
    emb512 = emb_new = None
    if args.init_embedding == "teacher-pca":
        emb512 = proj
        rows = []
        for i, p in enumerate(tok_new.pieces):
            if i < 3 + 256:  # <unk>, BOS, EOS and the byte tokens: the same ids in both
                assert p == tok512.pieces[i]
                ids = [i]
            else:
                ids = enc512.chunk(p.decode("utf-8"))
            rows.append(proj[ids].mean(0))
        emb_new = torch.stack(rows)

    students = {}
    for key, cfg, emb, tr, ho, hb, fname in (
            ("A_cross_vocab", shape_new, emb_new, train_new, heldout_new, heldout_bytes_new,
             CROSS_FILE),
            ("B_same_vocab", shape512, emb512, train, heldout, heldout_bytes_512, SAME_FILE)):
        log(f"training {key}: {cfg.short()}, vocab {cfg.vocab_size}, "
            f"{cfg.parameter_count()} parameters")
        student, history, train_s, seen, epochs = train_student(cfg, emb, tr, ho, hb, args, log,
                                                                key)
        path = os.path.join(args.out_dir, fname)
        size, diff = check_file(student, path, ho)
        r = {"file": fname, "bytes": size, "sha256": sha256(path), "reread_max_abs_diff": diff,
             "shape": dataclasses.asdict(cfg), "parameters": cfg.parameter_count(),
             "size_ratio": tcfg.parameter_count() / cfg.parameter_count(),
             "train_seconds": train_s, "train_tokens": seen, "epochs_started": epochs,
             "train_positions": int(sum(len(x) - 1 for x in tr)),
             "heldout": history[-1], "history": history}
        if key.startswith("B"):
            d = evaluate_distill(student, heldout, heldout_logps, args.batch_tokens)
            r["heldout_kl"] = d["kl"]
            r["heldout_top1_agreement"] = d["top1"]
            r["heldout_expected_acceptance"] = d["accept"]
            r["reference_greedy_top1_agreement"] = greedy_agreement(student, teacher,
                                                                    args.reference)
        timings[f"train_{key}"] = train_s
        students[key] = r
        m = r["heldout"]
        extra = (f", KL {r['heldout_kl']:.4f}, top-1 agreement {r['heldout_top1_agreement']:.4f}, "
                 f"accept {r['heldout_expected_acceptance']:.4f}" if "heldout_kl" in r else "")
        log(f"  -> {key}: CE {m['ce_per_token']:.4f}/token {m['ce_per_byte']:.4f}/byte, top-1 "
            f"{m['top1_accuracy']:.4f}{extra}; {train_s:.0f} s; wrote {path} ({size} bytes), "
            f"re-read logits match (max |diff| {diff:.1e})")

    timings["total"] = time.time() - t_start
    summary = {
        "argv": sys.argv, "torch": torch.__version__, "threads": args.threads,
        "args": vars(args),
        "teacher_parameters": tcfg.parameter_count(),
        "teacher_heldout": teacher_ref,
        "tokenizer": {"file": TOKENIZER_FILE, "bytes": tok_size, "sha256": sha256(tok_path),
                      "tokens": len(tok_new), "max_token_length": tok_new.max_token_length,
                      "first_merges": [p.decode() for p in pieces[259:291]],
                      **{k: v for k, v in bpe_info.items() if k != "character_frequencies"},
                      "character_frequencies": {repr(c): n for c, n in
                                                bpe_info["character_frequencies"].items()}},
        "tokenisation": stats,
        "corpus": corpus,
        "students": students,
        "timings_seconds": timings,
    }
    with open(os.path.join(args.out_dir, "metrics.json"), "w") as f:
        json.dump(summary, f, indent=1, ensure_ascii=True)
    a, b = students["A_cross_vocab"]["heldout"], students["B_same_vocab"]["heldout"]
    log(f"done: held-out CE per byte A {a['ce_per_byte']:.4f}, B {b['ce_per_byte']:.4f}, teacher "
        f"{teacher_ref['ce_per_byte']:.4f}; total {timings['total']:.0f} s")


if __name__ == "__main__":
    main()
