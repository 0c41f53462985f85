"""Byte-level BPE for the demo model: training, tiktoken's encoder, and the tokenizer files.

Ranks (tiktoken's): the 256 single bytes are ranks 0..255 in byte order, then each merge learned
in order. The vocabulary is the ranks plus Kimi-K2.5's 256-id special block on top
(special_tokens: [BOS] = ranks, [EOS] = ranks + 1, <|im_end|> = ranks + 2, ..., [PAD] =
ranks + 255, the others "<|reserved_token_<id>|>"): the ids >= ranks of
byte_level_special_tokens(ranks + 256), which replicates include/specdec/io/tokenizer_files.hpp's
function of that name (its ids below the block, reserved names over a 256-byte vocabulary, are
ranks here). 3840 ranks -> vocabulary 4096, [BOS] 3840, [EOS] 3841, [PAD] 4095.

Split pattern (PATTERN, pat_str of tokenizer_config.json), alternatives in order, with
W = [ \t\n\r\f\x0b] (ASCII whitespace) and P = [^ \t\n\r\f\x0bA-Za-z0-9]:
  [^\r\nA-Za-z0-9]?[A-Za-z]+       a word with one leading character that is not a newline,
                                   letter or digit: " self", ".append", "_name", "(x"
  [0-9]{1,3}                       digits, three at most
   ?P+(?:W*[\r\n][ \t]*)?          punctuation (and every non-ASCII character) with one leading
                                   space, and the line break and indentation after it: "):\n    "
  W*[\r\n][ \t]*                   whitespace through the last line break, then the indentation
  W+(?![^ \t\n\r\f\x0b])           whitespace, less its last character when a non-space follows
                                   (a word or punctuation takes that one as its leading space)
  W+                               the rest: one space before digits, a tab before punctuation
Every character is in exactly one of letters, digits, W and P, so the alternatives cover any text
and no match is empty. The classes are ASCII, spelled out, so Python's re (on str) and the C++
tokenizer (PCRE2 with UTF + UCP, after tokenizer_pattern.hpp's translation, which leaves this
pattern unchanged) find the same pieces on any text: no \s (Python's holds U+001C..U+001F, which
PCRE2's UCP \s does not), no \v (PCRE2: any vertical space; Python: U+000B alone), no \w \d \b.
Chosen by held-out compression on the stdlib at 3840 ranks (bytes/token): this 3.39; without the
line break in the punctuation piece 3.30; line break and indentation apart (cl100k's pattern in
ASCII) 3.19; " ?[A-Za-z]+" words 3.14; "_" as a letter +0.00.

Training (train): counts of the pieces of the training documents (a piece never crosses a
document), then merges: each step merges the most frequent adjacent pair over all pieces, ties to
the smallest (bytes of left, bytes of right); pair counts are updated incrementally for the pieces
holding the pair, the best pair found with a lazily updated heap. A pair whose bytes are already
a token (x + yz after xy + z) merges into that token and takes no new rank.

Encoding (Encoder): tiktoken's algorithm. Each piece that is a token maps to its rank; any other
is byte-pair merged: repeatedly merge the adjacent pair whose concatenation has the lowest rank,
the leftmost of equal ranks. encode() first matches special tokens' texts (leftmost, the longest
at one position; tiktoken's encode(allowed_special="all"), the C++ Tokenizer::encode),
encode_ordinary() treats them as text. Pieces are cached.

Files (write_tokenizer(dir, ...), read by io/tokenizer.hpp's Tokenizer::load):
  tiktoken.model          "<base64 bytes> <rank>" a line, ranks 0..N-1
  tokenizer_config.json   added_tokens_decoder (special_tokens), bos_token,
                          eos_token, pad_token, pat_str

CLI:
  bpe.py train --input FILE... --ranks N --out DIR    (each FILE: documents joined with "\\x1c\\n")
  bpe.py encode --tokenizer DIR --input FILE [--ordinary]   ids as a JSON array
Standard library only; the same inputs give byte-identical outputs.
"""

from __future__ import annotations

import argparse
import base64
import heapq
import json
import os
import re
import sys
from collections import Counter

_W = r"[ \t\n\r\f\x0b]"
PATTERN = (
    r"[^\r\nA-Za-z0-9]?[A-Za-z]+"
    r"|[0-9]{1,3}"
    rf"| ?[^ \t\n\r\f\x0bA-Za-z0-9]+(?:{_W}*[\r\n][ \t]*)?"
    rf"|{_W}*[\r\n][ \t]*"
    rf"|{_W}+(?![^ \t\n\r\f\x0b])"
    rf"|{_W}+"
)

KIMI_VOCAB = 163840
KIMI_BLOCK = 256
# Kimi-K2.5's named special tokens at their ids (tokenizer_files.hpp kimi_named_special_tokens).
KIMI_NAMED_SPECIAL_TOKENS = [
    ("[BOS]", 163584),
    ("[EOS]", 163585),
    ("<|im_end|>", 163586),
    ("<|im_user|>", 163587),
    ("<|im_assistant|>", 163588),
    ("<|im_system|>", 163594),
    ("<|im_middle|>", 163601),
    ("<think>", 163606),
    ("</think>", 163607),
    ("[PAD]", 163839),
]


class BpeError(Exception):
    """Text the pattern does not cover, a vocabulary that cannot be trained or loaded."""


def byte_level_special_tokens(vocab_size: int) -> list[tuple[str, int]]:
    """(content, id) for ids [256, vocab_size): Kimi's block at the top, the rest reserved."""
    if vocab_size < 256 + KIMI_BLOCK or vocab_size >= 2**31:
        raise BpeError(f"vocab_size {vocab_size}: needs 256 byte ids + Kimi's 256-id block")
    names = [""] * (vocab_size - 256)
    for content, kimi_id in KIMI_NAMED_SPECIAL_TOKENS:
        names[kimi_id - KIMI_VOCAB + vocab_size - 256] = content
    return [(n or f"<|reserved_token_{256 + i}|>", 256 + i) for i, n in enumerate(names)]


def special_tokens(num_ranks: int) -> list[tuple[str, int]]:
    """The BPE tokenizer's specials: Kimi's block, ids [num_ranks, num_ranks + 256), as
    byte_level_special_tokens(num_ranks + 256) names them (its ids below num_ranks are ranks)."""
    return [(c, i) for c, i in byte_level_special_tokens(num_ranks + KIMI_BLOCK) if i >= num_ranks]


def special_ids(num_ranks: int) -> dict[str, int]:
    return dict(special_tokens(num_ranks))


def split(text: str, pattern: re.Pattern | None = None) -> list[str]:
    """The pieces of text, which must cover it (as the C++ split requires)."""
    pat = pattern or _COMPILED
    pieces = pat.findall(text) if pat.groups == 0 else [m.group() for m in pat.finditer(text)]
    if sum(map(len, pieces)) != len(text):
        pos = 0
        for m in pat.finditer(text):
            if m.start() != pos:
                break
            pos = m.end()
        raise BpeError(f"the split pattern leaves text unmatched at character {pos}: "
                       f"{text[pos:pos + 16]!r}")
    return pieces


_COMPILED = re.compile(PATTERN)


def count_pieces(documents, pattern: re.Pattern | None = None) -> Counter:
    """Piece (UTF-8 bytes) -> count over the documents (str)."""
    counts: Counter = Counter()
    for doc in documents:
        counts.update(split(doc, pattern))
    return Counter({p.encode("utf-8"): n for p, n in counts.items()})


def train(piece_counts: dict[bytes, int], num_ranks: int, log=None) -> list[bytes]:
    """tokens[rank] for ranks 0..num_ranks-1, learned from piece counts (see the docstring)."""
    if num_ranks < 256:
        raise BpeError(f"--ranks {num_ranks}: at least the 256 single bytes")
    tokens = [bytes([b]) for b in range(256)]
    token_id = {t: i for i, t in enumerate(tokens)}
    words: list[list[int]] = []
    freqs: list[int] = []
    for piece in sorted(piece_counts):
        if len(piece) >= 2:
            words.append(list(piece))
            freqs.append(piece_counts[piece])
    pair_count: dict[tuple[int, int], int] = {}
    where: dict[tuple[int, int], set[int]] = {}
    for wi, w in enumerate(words):
        f = freqs[wi]
        for p in zip(w, w[1:]):
            pair_count[p] = pair_count.get(p, 0) + f
            s = where.get(p)
            if s is None:
                where[p] = {wi}
            else:
                s.add(wi)
    heap = [(-n, tokens[a], tokens[b], a, b) for (a, b), n in pair_count.items()]
    heapq.heapify(heap)
    merges = 0
    while len(tokens) < num_ranks:
        # Entries hold a count >= the pair's (counts of old pairs only fall between pushes).
        while heap:
            neg, _, _, a, b = heap[0]
            n = pair_count.get((a, b), 0)
            if n == -neg:
                break
            heapq.heappop(heap)
            if n > 0:
                heapq.heappush(heap, (-n, tokens[a], tokens[b], a, b))
        if not heap or -heap[0][0] < 2:
            raise BpeError(f"only {len(tokens)} ranks: no pair occurs twice (a corpus too small "
                           f"for --ranks {num_ranks})")
        neg, _, _, a, b = heapq.heappop(heap)
        merged = tokens[a] + tokens[b]
        c = token_id.get(merged)
        if c is None:
            c = len(tokens)
            tokens.append(merged)
            token_id[merged] = c
        merges += 1
        grown = set()
        for wi in where.pop((a, b), ()):
            w = words[wi]
            n = len(w)
            i = 0
            out = []
            hit = False
            while i < n:
                if i + 1 < n and w[i] == a and w[i + 1] == b:
                    out.append(c)
                    i += 2
                    hit = True
                else:
                    out.append(w[i])
                    i += 1
            if not hit:
                continue
            f = freqs[wi]
            delta: dict[tuple[int, int], int] = {}
            for p in zip(w, w[1:]):
                delta[p] = delta.get(p, 0) - 1
            for p in zip(out, out[1:]):
                delta[p] = delta.get(p, 0) + 1
            for p, d in delta.items():
                if d == 0:
                    continue
                m = pair_count.get(p, 0) + d * f
                if m > 0:
                    pair_count[p] = m
                else:
                    pair_count.pop(p, None)
                if d > 0:
                    grown.add(p)
                    s = where.get(p)
                    if s is None:
                        where[p] = {wi}
                    else:
                        s.add(wi)
            words[wi] = out
        pair_count.pop((a, b), None)
        for p in grown:
            n = pair_count.get(p, 0)
            if n > 0:
                heapq.heappush(heap, (-n, tokens[p[0]], tokens[p[1]], p[0], p[1]))
        if log and merges % 500 == 0:
            log(f"  merge {merges}: {len(tokens)} ranks, count {-neg}, {merged!r}")
    return tokens


class Encoder:
    """tiktoken's encoder over tokens[rank] and (content, id) special tokens."""

    def __init__(self, tokens: list[bytes], specials: list[tuple[str, int]],
                 pattern: str = PATTERN):
        self.tokens = tokens
        self.ranks = {t: i for i, t in enumerate(tokens)}
        if len(self.ranks) != len(tokens):
            raise BpeError("a byte string appears twice among the ranks")
        self.pattern = pattern
        self.regex = re.compile(pattern)
        self.specials = dict(specials)
        self.special_bytes = {i: c.encode("utf-8") for c, i in specials}
        alts = sorted(self.specials, key=lambda s: (-len(s), s))
        self.special_regex = re.compile("|".join(map(re.escape, alts))) if alts else None
        self.vocab_size = max([len(tokens)] + [i + 1 for i in self.special_bytes])
        self._cache: dict[str, tuple[int, ...]] = {}

    def _merge(self, piece: bytes) -> tuple[int, ...]:
        ranks = self.ranks
        inf = len(self.tokens)
        bounds = list(range(len(piece) + 1))
        pair = [ranks.get(piece[i : i + 2], inf) for i in range(len(piece) - 1)]
        while pair:
            best = min(pair)
            if best == inf:
                break
            i = pair.index(best)
            del bounds[i + 1]
            del pair[i]
            if i < len(pair):
                pair[i] = ranks.get(piece[bounds[i] : bounds[i + 2]], inf)
            if i > 0:
                pair[i - 1] = ranks.get(piece[bounds[i - 1] : bounds[i + 1]], inf)
        return tuple(ranks[piece[bounds[i] : bounds[i + 1]]] for i in range(len(bounds) - 1))

    def encode_piece(self, piece: str) -> tuple[int, ...]:
        ids = self._cache.get(piece)
        if ids is None:
            b = piece.encode("utf-8")
            r = self.ranks.get(b)
            ids = (r,) if r is not None else self._merge(b)
            self._cache[piece] = ids
        return ids

    def encode_ordinary(self, text: str) -> list[int]:
        out: list[int] = []
        cache = self._cache
        for piece in split(text, self.regex):
            ids = cache.get(piece)
            if ids is None:
                ids = self.encode_piece(piece)
            out.extend(ids)
        return out

    def encode(self, text: str) -> list[int]:
        if self.special_regex is None:
            return self.encode_ordinary(text)
        out: list[int] = []
        pos = 0
        for m in self.special_regex.finditer(text):
            out.extend(self.encode_ordinary(text[pos : m.start()]))
            out.append(self.specials[m.group()])
            pos = m.end()
        out.extend(self.encode_ordinary(text[pos:]))
        return out

    def decode_bytes(self, ids) -> bytes:
        n = len(self.tokens)
        return b"".join(self.tokens[i] if i < n else self.special_bytes[i] for i in ids)

    def decode(self, ids) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")


def tokenizer_config(num_ranks: int, pattern: str) -> str:
    """tokenizer_config.json's text: write_byte_level_tokenizer's layout, special_tokens(num_ranks)
    in added_tokens_decoder, "pat_str" added."""
    specials = special_tokens(num_ranks)
    lines = ['{\n  "added_tokens_decoder": {\n']
    for k, (content, i) in enumerate(specials):
        sep = ",\n" if k + 1 < len(specials) else "\n"
        lines.append(f'    "{i}": {{"content": {json.dumps(content)}, "special": true}}{sep}')
    lines.append('  },\n  "bos_token": "[BOS]",\n  "eos_token": "[EOS]",\n'
                 f'  "pad_token": "[PAD]",\n  "pat_str": {json.dumps(pattern)}\n}}\n')
    return "".join(lines)


def write_tokenizer(out_dir: str, tokens: list[bytes], pattern: str = PATTERN) -> None:
    """out_dir/tiktoken.model and out_dir/tokenizer_config.json (vocab = ranks + 256)."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tiktoken.model"), "w", encoding="ascii", newline="\n") as f:
        for rank, t in enumerate(tokens):
            f.write(f"{base64.b64encode(t).decode('ascii')} {rank}\n")
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8",
              newline="\n") as f:
        f.write(tokenizer_config(len(tokens), pattern))


def load_tokenizer(tok_dir: str) -> Encoder:
    """An Encoder from write_tokenizer's files (ranks in order 0..N-1)."""
    tokens = []
    with open(os.path.join(tok_dir, "tiktoken.model"), encoding="ascii") as f:
        for line in f:
            line = line.rstrip("\r\n")
            if not line:
                continue
            b64, rank = line.split(" ")
            if int(rank) != len(tokens):
                raise BpeError(f"{tok_dir}/tiktoken.model: rank {rank} out of order")
            tokens.append(base64.b64decode(b64))
    with open(os.path.join(tok_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    specials = [(v["content"], int(k)) for k, v in config["added_tokens_decoder"].items()]
    return Encoder(tokens, specials, config.get("pat_str", PATTERN))


def read_documents(path: str) -> list[str]:
    with open(path, encoding="utf-8", newline="") as f:
        return f.read().split("\x1c\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="learn ranks from documents, write the tokenizer files")
    t.add_argument("--input", nargs="+", required=True)
    t.add_argument("--ranks", type=int, default=3840)
    t.add_argument("--out", required=True)
    e = sub.add_parser("encode", help="print the ids of a file's text as a JSON array")
    e.add_argument("--tokenizer", required=True)
    e.add_argument("--input", required=True)
    e.add_argument("--ordinary", action="store_true", help="special tokens' texts as text")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "train":
            docs = [d for path in args.input for d in read_documents(path)]
            tokens = train(count_pieces(docs), args.ranks,
                           log=lambda s: print(s, file=sys.stderr))
            write_tokenizer(args.out, tokens)
            print(f"wrote {len(tokens)} ranks (vocab {len(tokens) + KIMI_BLOCK}) to {args.out}")
        else:
            enc = load_tokenizer(args.tokenizer)
            with open(args.input, encoding="utf-8", newline="") as f:
                text = f.read()
            ids = enc.encode_ordinary(text) if args.ordinary else enc.encode(text)
            print(json.dumps(ids))
    except BpeError as err:
        print(f"bpe: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
