"""Byte-level BPE vocabularies in llama2.c's tokenizer.bin layout, trained the SentencePiece way,
and a fast encoder equivalent to training.tokenizer.Tokenizer.encode.

Layout (as tok512.bin): ids 0, 1, 2 = "<unk>", "\\n<s>\\n", "\\n</s>\\n" (BOS = 1, EOS = 2), score
0; ids 3..258 = the byte tokens "<0x00>".."<0xFF>", score 0; then the merged pieces in merge order
with scores 0, -1, -2, ... (first merge highest); then every character of the training text as a
single-character piece, most frequent first, scores continuing downwards. The llama2.c encoder
starts from one symbol per character (byte tokens only for characters outside the vocabulary) and
merges the pair whose merged piece scores highest, so it replays the merges in training order.

Training: each text gets the dummy prefix space and is cut into chunks where a space starts a new
chunk (" word") and every newline is a chunk of its own; with split_by_script (SentencePiece's
default split_by_unicode_script, which tok512.bin follows: none of its merged pieces mixes letters
with punctuation) a chunk is cut further where the script changes (letters of one script vs.
everything else: punctuation, digits, symbols), the leading space staying with the first part
(' "', 'Hello', '!'). Merges are learnt within these parts, weighted by their frequency, the most
frequent adjacent pair first (ties: the lexicographically smallest pair), until the vocabulary is
full. A merge whose piece is already in the vocabulary (reached by another split) is applied but
adds no token.
"""

import collections
import re
import struct
import unicodedata

from training.llama import BOS

SPECIALS = ["<unk>", "\n<s>\n", "\n</s>\n"]
CHUNK = re.compile(r"\n| [^ \n]*|[^ \n]+")


def chunks(text):
    """The chunks of text (the dummy prefix already added): " word", "\\n", and a leading run
    without a space after a newline."""
    out = CHUNK.findall(text)
    assert "".join(out) == text
    return out


def script(ch):
    """SentencePiece-style script class of a character: the script of a letter (the first word of
    its Unicode name: LATIN, GREEK, ...), None for combining marks (they join the previous
    character), COMMON for everything else (punctuation, digits, symbols, spaces)."""
    cat = unicodedata.category(ch)
    if cat.startswith("L"):
        return unicodedata.name(ch, "LETTER").split()[0]
    if cat.startswith("M"):
        return None
    return "COMMON"


def script_parts(chunk):
    """A chunk cut where the script changes; a leading space stays with the first part."""
    parts = []
    start = 1 if chunk.startswith(" ") and len(chunk) > 1 else 0
    prev = None
    begin = 0
    for i in range(start, len(chunk)):
        s = script(chunk[i])
        if s is None:
            continue
        if prev is not None and s != prev:
            parts.append(chunk[begin:i])
            begin = i
        prev = s
    parts.append(chunk[begin:])
    return parts


def chunk_counts(texts, split_by_script=True):
    """Chunk (or script part of a chunk) -> frequency over texts, each with the dummy prefix space
    (empty texts skipped)."""
    counts = collections.Counter()
    for t in texts:
        if t:
            counts.update(chunks(" " + t))
    if split_by_script:
        parts = collections.Counter()
        for c, n in counts.items():
            for p in script_parts(c):
                parts[p] += n
        counts = parts
    return counts


def train_bpe(texts, vocab_size, split_by_script=True):
    """Learns a vocabulary of vocab_size tokens from texts (str). Returns (pieces, scores, info):
    pieces as bytes in id order, scores as floats, info a dict of statistics (characters, merges,
    merges that re-reached an existing piece, the frequency of the last merge)."""
    counts = chunk_counts(texts, split_by_script)
    char_freq = collections.Counter()
    for c, n in counts.items():
        for ch in c:
            char_freq[ch] += n
    chars = sorted(char_freq, key=lambda ch: (-char_freq[ch], ch))
    n_merges = vocab_size - len(SPECIALS) - 256 - len(chars)
    assert n_merges >= 0, f"{len(chars)} distinct characters do not fit in {vocab_size} tokens"

    words = [list(c) for c in counts]  # symbols of each distinct chunk
    freq = [counts[c] for c in counts]
    pairs = collections.Counter()  # adjacent pair -> weighted count
    where = collections.defaultdict(set)  # adjacent pair -> ids of the chunks that hold it
    for w, syms in enumerate(words):
        for a, b in zip(syms, syms[1:]):
            pairs[a, b] += freq[w]
            where[a, b].add(w)

    known = set(chars)
    merged = []  # new pieces (str), in merge order
    repeats = 0
    last_count = None
    while len(merged) < n_merges:
        live = [(p, n) for p, n in pairs.items() if n > 0]
        assert live, f"no pair left to merge after {len(merged)} of {n_merges} merges"
        (a, b), n = min(live, key=lambda pn: (-pn[1], pn[0]))
        last_count = n
        piece = a + b
        for w in sorted(where.pop((a, b))):
            syms = words[w]
            f = freq[w]
            for x, y in zip(syms, syms[1:]):
                pairs[x, y] -= f
            out = []
            i = 0
            while i < len(syms):
                if i + 1 < len(syms) and syms[i] == a and syms[i + 1] == b:
                    out.append(piece)
                    i += 2
                else:
                    out.append(syms[i])
                    i += 1
            words[w] = out
            for x, y in zip(out, out[1:]):
                pairs[x, y] += f
                where[x, y].add(w)
        del pairs[a, b]
        if piece in known:
            repeats += 1
            continue
        known.add(piece)
        merged.append(piece)
    pieces = [s.encode() for s in SPECIALS] + [f"<0x{b:02X}>".encode() for b in range(256)]
    scores = [0.0] * len(pieces)
    for k, s in enumerate(merged + chars):
        pieces.append(s.encode("utf-8"))
        scores.append(-float(k))
    assert len(pieces) == vocab_size and len(set(pieces)) == vocab_size
    info = {"split_by_script": split_by_script, "chunks": sum(counts.values()),
            "distinct_chunks": len(counts),
            "characters": len(chars), "merges": len(merged), "repeated_merges": repeats,
            "last_merge_count": last_count,
            "character_frequencies": {ch: char_freq[ch] for ch in chars}}
    return pieces, scores, info


def write_tokenizer(path, pieces, scores):
    """Writes llama2.c's tokenizer.bin: int32 max_token_length, then per token float32 score,
    int32 length, bytes. Returns the size in bytes."""
    parts = [struct.pack("<i", max(len(p) for p in pieces))]
    for p, s in zip(pieces, scores):
        parts.append(struct.pack("<fi", s, len(p)) + p)
    data = b"".join(parts)
    with open(path, "wb") as f:
        f.write(data)
    return len(data)


class ChunkEncoder:
    """llama2.c encoding (training.tokenizer.Tokenizer.encode) computed chunk by chunk with a
    cache. Exact when no piece can span a chunk boundary, i.e. no merged piece holds a space after
    its first byte or a newline (asserted): every merge then stays inside one chunk, and each chunk
    evolves as it would alone (highest score first, leftmost on ties)."""

    def __init__(self, tok):
        self.tok = tok
        for p in tok.lookup:
            assert len(p) == 1 or (b" " not in p[1:] and b"\n" not in p), \
                f"piece {p!r} could span chunks"
        self.cache = {}

    def chunk(self, text):
        """Token ids of one chunk (str), no prefix added."""
        ids = self.cache.get(text)
        if ids is not None:
            return ids
        tok = self.tok
        symbols = []  # (id, piece bytes, mergeable)
        for ch in text:
            piece = ch.encode("utf-8")
            if piece in tok.lookup:
                symbols.append((tok.lookup[piece], piece, True))
            else:
                symbols += [(tok.byte_token[b], bytes([b]), False) for b in piece]
        ids = tok.merge(symbols)
        self.cache[text] = ids
        return ids

    def encode(self, text, bos=True):
        out = [BOS] if bos else []
        if text:
            for c in chunks(" " + text):
                out += self.chunk(c)
        return out

    def byte_fallbacks(self, text):
        """Characters of text that are not single pieces (they encode as byte tokens)."""
        return collections.Counter(ch for ch in text if ch.encode("utf-8") not in self.tok.lookup)
