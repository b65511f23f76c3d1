"""The frozen target as a teacher: the check that it reproduces the fixture's reference greedy ids,
temperature-1 sampling of stories with the KV cache (from BOS or from a prompt), the target's greedy
continuation at every position of a sequence, and batching of variable-length stories."""

import math

import torch
import torch.nn.functional as F

from training.llama import ATTENTION_BLOCK, BOS, EOS, apply_rope, read_legacy, rms_norm

PROMPT_LEN = 4  # the reference ids file starts with the 4 prompt ids of "Once upon a time"
PROMPT = [BOS, 403, 407, 261, 378]


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
def load_teacher(path, reference_path):
    """Reads the teacher (frozen), asserts its RoPE tables match its theta and that it reproduces
    the reference greedy ids (check_teacher). Returns (model, reference ids checked, RoPE
    error)."""
    teacher, rope_error = read_legacy(path)
    teacher.requires_grad_(False)
    assert rope_error < 1e-5, (f"{path}: RoPE tables differ from theta "
                               f"{teacher.cfg.rope_theta} by {rope_error}")
    return teacher, check_teacher(teacher, reference_path), rope_error


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
    at each position but the last, as computed while sampling (in logp_dtype; with logp_dtype None
    they are not kept and log_probs is None -- the stories are the same either way)."""
    stories, log_probs = [], []
    for first in range(0, count, batch):
        b = min(batch, count - first)
        rows = torch.arange(b)  # story index of each live cache row
        cache = model.new_cache(b, max_len)
        tokens = torch.full((b, max_len), BOS, dtype=torch.long)
        logps = (None if logp_dtype is None else
                 torch.empty((b, max_len - 1, model.cfg.vocab_size), dtype=logp_dtype))
        lengths = torch.full((b,), max_len, dtype=torch.long)
        current = torch.full((b,), BOS, dtype=torch.long)
        done = torch.zeros((b,), dtype=torch.bool)  # per live row: has it ended?
        for pos in range(max_len - 1):
            logp = torch.log_softmax(model(current[:, None], pos, cache)[:, 0], -1)
            if logps is not None:
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
            if logps is not None:
                log_probs.append(logps[i, : n - 1].clone())
    return stories, (None if logp_dtype is None else log_probs)


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


@torch.no_grad()
def sample_continuations(model, prompt, count, batch, max_len, gen):
    """Samples `count` continuations of `prompt` (token ids starting with BOS) at temperature 1.
    Returns LongTensors that start with the prompt and end with the first EOS or BOS sampled, or
    are cut at max_len tokens."""
    P = len(prompt)
    assert 1 <= P < max_len <= model.cfg.seq_len, f"prompt of {P} tokens, max_len {max_len}"
    out = []
    for first in range(0, count, batch):
        b = min(batch, count - first)
        rows = torch.arange(b)  # continuation index of each live cache row
        cache = model.new_cache(b, max_len)
        tokens = torch.full((b, max_len), BOS, dtype=torch.long)
        tokens[:, :P] = torch.tensor(prompt)
        lengths = torch.full((b,), max_len, dtype=torch.long)
        done = torch.zeros((b,), dtype=torch.bool)  # per live row: has it ended?
        logits = model(tokens[:, :P], 0, cache)[:, -1]
        current = None  # the tokens sampled last step, one per live row
        for pos in range(P - 1, max_len - 1):
            if current is not None:
                logits = model(current[:, None], pos, cache)[:, 0]
            nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)[:, 0]
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
        out += [tokens[i, : int(lengths[i])].clone() for i in range(b)]
    return out


@torch.no_grad()
def greedy_chains(model, tokens, depth):
    """The target's greedy continuation from every position of a batch of sequences.

    tokens [B, T] -> (hidden [B, T, dim], chains [B, T, depth]): hidden[:, s] is the final hidden
    state at position s (after the final RMSNorm) and chains[:, s] = y_1..y_depth, the tokens
    greedy decoding appends to tokens[:, :s + 1] (y_1 = argmax of the logits at s, y_j = argmax
    after y_1..y_{j-1}). Right padding does not change the rows of the real positions.

    One causal forward gives hidden and y_1; then each further token is one forward of T queries,
    query s at position s + j - 1 holding y_{j-1}, attending to the keys of positions 0..s of the
    sequence and to its own chain y_1..y_{j-1} (a tree of T chains scored in parallel)."""
    c = model.cfg
    B, T = tokens.shape
    nh, nkv, hs = c.n_heads, c.n_kv_heads, c.head_size
    rep = nh // nkv
    assert T - 1 + depth - 1 < c.seq_len, "context overflow"
    scale = 1.0 / math.sqrt(hs)
    cache = model.new_cache(B, T)
    hidden = model.hidden(tokens, 0, cache)
    y = (hidden @ model.tok_embeddings.T).argmax(-1)
    chains = [y]
    mask = torch.full((T, T), float("-inf")).triu(1)  # query s sees sequence keys 0..s
    chain_kv = [([], []) for _ in range(c.n_layers)]  # per layer, per step: [B, T, nkv, hs]
    for j in range(1, depth):
        cos, sin = model.rope_cos[j : j + T], model.rope_sin[j : j + T]  # query s at s + j
        x = model.tok_embeddings[y]
        for layer in range(c.n_layers):
            h = rms_norm(x, model.rms_att[layer], c.rms_eps)
            q = apply_rope((h @ model.wq[layer].T).view(B, T, nh, hs), cos, sin)
            k = apply_rope((h @ model.wk[layer].T).view(B, T, nkv, hs), cos, sin)
            v = (h @ model.wv[layer].T).view(B, T, nkv, hs)
            ks, vs = chain_kv[layer]
            ks.append(k)
            vs.append(v)
            kc, vc = torch.stack(ks, 3), torch.stack(vs, 3)  # [B, T, nkv, j, hs]
            q = q.view(B, T, nkv, rep, hs)  # query head g * rep + r reads kv head g
            kb, vb = cache[layer]  # [B, nkv, T, hs]
            qs = q.permute(0, 2, 3, 1, 4)  # [B, nkv, rep, T, hs]
            att_own = torch.einsum("btgrd,btgjd->bgrtj", q, kc) * scale
            outs = []
            for t0 in range(0, T, ATTENTION_BLOCK):  # queries t0..t1-1 see keys 0..t1-1 at most
                t1 = min(T, t0 + ATTENTION_BLOCK)
                kt, vt = kb[:, :, None, :t1], vb[:, :, None, :t1]
                att = torch.matmul(qs[:, :, :, t0:t1], kt.transpose(-1, -2)) * scale
                att = torch.cat((att + mask[t0:t1, :t1], att_own[:, :, :, t0:t1]), -1)
                att = torch.softmax(att, -1)
                o = (torch.matmul(att[..., :t1], vt)
                     + torch.einsum("bgrtj,btgjd->bgrtd", att[..., t1:], vc[:, t0:t1]))
                outs.append(o)
            o = torch.cat(outs, 3).permute(0, 3, 1, 2, 4).reshape(B, T, c.dim)
            x = x + o @ model.wo[layer].T
            h = rms_norm(x, model.rms_ffn[layer], c.rms_eps)
            x = x + (F.silu(h @ model.w1[layer].T) * (h @ model.w3[layer].T)) @ model.w2[layer].T
        y = (rms_norm(x, model.rms_final, c.rms_eps) @ model.tok_embeddings.T).argmax(-1)
        chains.append(y)
    return hidden, torch.stack(chains, -1)
