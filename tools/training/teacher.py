"""The frozen target as a teacher: the check that it reproduces the fixture's reference greedy ids,
temperature-1 sampling of stories with the KV cache, and batching of variable-length stories."""

import torch

from training.llama import BOS, EOS

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
