"""The llama2.c tokenizer (tokenizer.bin format), encoding as llama2.c does: BOS, a space prepended
to non-empty text ("dummy prefix"), one symbol per UTF-8 character found in the vocabulary (else one
byte token per byte), then repeatedly merge the adjacent pair whose merged piece scores highest
(the leftmost pair on ties). Matches specdec::tokenizer::encode."""

import re
import struct

from training.llama import BOS, EOS

BYTE_PIECE = re.compile(rb"<0x([0-9A-Fa-f]{2})>")


class Tokenizer:
    """A llama2.c vocabulary: pieces (bytes), merge scores, byte tokens."""

    def __init__(self, path):
        raw = open(path, "rb").read()
        assert len(raw) >= 4, f"{path}: shorter than its header"
        (self.max_token_length,) = struct.unpack_from("<i", raw, 0)
        offset = 4
        self.pieces, self.scores = [], []
        while offset < len(raw):
            assert offset + 8 <= len(raw), f"{path}: truncated at byte {offset}"
            score, length = struct.unpack_from("<fi", raw, offset)
            offset += 8
            assert 0 <= length and offset + length <= len(raw), f"{path}: bad piece at {offset}"
            self.pieces.append(raw[offset : offset + length])
            self.scores.append(score)
            offset += length
        self.byte_token = {}  # byte value -> id of its "<0xNN>" token
        self.lookup = {}  # piece -> id, for the pieces encode may produce (first id wins)
        for i, piece in enumerate(self.pieces):
            m = BYTE_PIECE.fullmatch(piece)
            if m:
                self.byte_token.setdefault(int(m.group(1), 16), i)
            elif i not in (0, BOS, EOS):  # <unk>, BOS and EOS are never produced by encode
                self.lookup.setdefault(piece, i)

    def __len__(self):
        return len(self.pieces)

    def encode(self, text, bos=True):
        """text (str) -> token ids, BOS first when `bos`."""
        out = [BOS] if bos else []
        if not text:
            return out
        data = b" " + text.encode("utf-8")
        # (id, piece, mergeable) per symbol: one per UTF-8 character in the vocabulary, else bytes
        symbols = []
        i = 0
        while i < len(data):
            n = 1
            while i > 0 and n < 4 and i + n < len(data) and (data[i + n] & 0xC0) == 0x80:
                n += 1
            piece = data[i : i + n]
            if piece in self.lookup:
                symbols.append((self.lookup[piece], piece, True))
            else:
                for b in piece:
                    assert b in self.byte_token, f"byte {b} has no token"
                    symbols.append((self.byte_token[b], bytes([b]), False))
            i += n
        return out + self.merge(symbols)

    def merge(self, symbols):
        """llama2.c's merging of `symbols` [(id, piece bytes, mergeable)]: repeatedly the adjacent
        pair whose merged piece scores highest (the leftmost on ties). Returns the ids."""
        while True:
            best = None  # (score, index, id)
            for j in range(len(symbols) - 1):
                (_, a, ma), (_, b, mb) = symbols[j], symbols[j + 1]
                if not (ma and mb) or len(a) + len(b) > self.max_token_length:
                    continue
                merged = self.lookup.get(a + b)
                if merged is None or not self.scores[merged] > -1e10:
                    continue
                if best is None or self.scores[merged] > best[0]:
                    best = (self.scores[merged], j, merged)
            if best is None:
                break
            _, j, merged = best
            symbols[j : j + 2] = [(merged, symbols[j][1] + symbols[j + 1][1], True)]
        return [s[0] for s in symbols]

    def decode(self, ids):
        """token ids -> text as llama2.c prints it (control tokens empty, the dummy prefix dropped
        after BOS, byte tokens as their byte)."""
        out = bytearray()
        prev = None
        for t in ids:
            piece = self.pieces[t]
            if t in (BOS, EOS):
                piece = b""
            elif BYTE_PIECE.fullmatch(piece):
                piece = bytes([int(piece[3:5], 16)])
            elif prev == BOS and piece.startswith(b" "):
                piece = piece[1:]
            out += piece
            prev = t
        return out.decode("utf-8", errors="replace")
