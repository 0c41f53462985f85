"""ctest demo.tokenizer_matches: the demo's BPE tokenizer gives the same ids in Python and in C++.

  check_tokenizer.py --kimi <specdec-kimi> --work DIR

1. prepare_data.py --out DIR/data --max-bytes 300000 --ranks 1024 (a small stdlib corpus, its
   tokenizer, streams and prompts; the stdlib of the interpreter running this script);
2. specdec-kimi tokenize --tokenizer DIR/data/tokenizer --json must give
   data/{heldout,train}_ids.bin for the documents each followed by the text "[EOS]", and
   bpe.Encoder.encode's ids (special tokens' texts matched) on: the held-out and train texts
   (corpus/*.txt), a stress text (CJK, emoji and ZWJ sequences, combining marks, Unicode spaces
   and line separators, C0 controls, tabs, CRLF, long runs that take the C++ heap merge), a
   pseudo-random mix of those characters (it finds a \s in the pattern: Python's \s holds
   U+001F, PCRE2's does not), and special tokens' texts ("[EOS]<|im_end|>" -> the [EOS],
   <|im_end|> ids of bpe.special_ids); tokenize --decode of the stress ids gives its text back;
3. init-random --config-only's tokenizer_config.json (C++ write_byte_level_tokenizer, vocab 512)
   must equal bpe.tokenizer_config(256) less its "pat_str": the special tokens replicated exactly.
Exit 0: all equal; 1: a difference (the first differing id, with its context); 77 (ctest: skipped):
specdec-kimi is built without PCRE2, so has no tokenize.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
from array import array

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bpe  # noqa: E402
import prepare_data  # noqa: E402

SKIP = 77
RANKS = 1024

STRESS = (
    "def f(x):\n\treturn x\t# tab\r\n"
    "crlf line\r\n\r\n  \r\n"
    "caf\u00e9 na\u00efve M\u00fcller \u0391\u03bb\u03c6\u03b1 "
    "\u041f\u0440\u0438\u0432\u0435\u0442\n"
    "\u4e2d\u6587\u5b57\u7b26\uff0c\u6807\u70b9\u3002\u300c\u5f15\u53f7\u300d "
    "\u3072\u3089\u304c\u306a \u30ab\u30bf\u30ab\u30ca \ud55c\uad6d\uc5b4\n"
    "emoji \U0001F600\U0001F44D\U0001F3FD \U0001F468\u200d\U0001F469\u200d\U0001F467 "
    "\U0001F1EF\U0001F1F5 x\U0001F600y\n"
    "combining e\u0301 a\u0308\u0323 \u0928\u092e\u0938\u094d\u0924\u0947 "
    "\u0645\u0631\u062d\u0628\u0627 \u05e9\u05dc\u05d5\u05dd \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\n"
    "spaces: a\u00a0b \u00a0 c\u2028d\u2029e\u0085f\u180eg\u3000h\ufeffi\u200bj\u2009k\u202fl\n"
    "controls: \x00 \x01\x1c\x1d\x1e\x1f \x0b\x0c \x7f end\n"
    "digits 1234567890123 \uff11\uff12\uff13 \u0663\u0664\u0665 \u00b2\u00bd 3.14e-10 0x1F\n"
    "math \U0001D518\U0001D52B\U0001D526\U0001D520\U0001D52C\U0001D521\U0001D522\n"
    "[EOS <|im_end [BO S] <|reserved_token_1|> special-like\n"
    + "#" * 300 + "\n" + " " * 300 + "x\n" + "a" * 500 + " " + "_" * 250 + "\n"
    + "\t" * 40 + "(" + "\n" * 30 + "    \n   \t \n" + "\u00e9" * 120 + "\n"
    + "end without newline   "
)

POOL = (
    list("abcXYZ_019 \t\n\r\f\x0b.,:;()[]{}#'\"\\=+-*/<>|")
    + ["\u00a0", "\u2028", "\u2029", "\u0085", "\u180e", "\u3000", "\ufeff", "\u200b", "\x1c",
       "\x1f", "\x00", "\u00e9", "e\u0301", "\u4e2d", "\u3002", "\uff11", "\u0663",
       "\U0001F600", "\U0001F3FD", "\u200d", "\U0001D518", "\u0928\u094d", "\u0645",
       "[EOS]", "<|im_end|>", "    ", "\r\n", "if ", "self.", "return "]
)


def fuzz_text(n: int, seed: int = 7) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(POOL) for _ in range(n))


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8", errors="replace")


def kimi_ids(kimi: str, tok_dir: str, path: str) -> list[int]:
    p = run([kimi, "tokenize", "--tokenizer", tok_dir, "--input", path, "--json"])
    if p.returncode != 0:
        if "built without PCRE2" in p.stdout + p.stderr:
            print(f"SKIPPED: {kimi} is built without PCRE2: {p.stderr.strip()}")
            sys.exit(SKIP)
        raise RuntimeError(f"tokenize {path} failed ({p.returncode}): {p.stdout}{p.stderr}")
    return json.loads(p.stdout)["ids"]


def compare(name: str, enc: bpe.Encoder, text: str, kimi: str, tok_dir: str, work: str) -> bool:
    path = os.path.join(work, f"{name}.txt")
    with open(path, "wb") as f:
        f.write(text.encode("utf-8"))
    want = enc.encode(text)
    got = kimi_ids(kimi, tok_dir, path)
    if got == want:
        print(f"ok   {name}: {len(want)} ids for {len(text.encode('utf-8'))} bytes")
        return True
    i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    ctx = max(0, i - 8)
    print(f"FAIL {name}: C++ {len(got)} ids, Python {len(want)}; first difference at id {i}\n"
          f"  C++    {got[ctx:i + 8]}\n  Python {want[ctx:i + 8]}\n"
          f"  C++    pieces {[enc.decode_bytes([t]) for t in got[ctx:i + 8]]}\n"
          f"  Python pieces {[enc.decode_bytes([t]) for t in want[ctx:i + 8]]}")
    return False


def compare_stream(name: str, out: str, kimi: str, tok_dir: str, work: str) -> bool:
    """data/<name>_ids.bin == C++ ids of the documents each followed by the text "[EOS]"."""
    with open(os.path.join(out, "corpus", f"{name}.txt"), encoding="utf-8", newline="") as f:
        docs = f.read().split("\x1c\n")
    if any("[EOS]" in d for d in docs):
        print(f"ok   {name} stream: not checked (a document holds the text [EOS])")
        return True
    path = os.path.join(work, f"{name}_eos.txt")
    with open(path, "wb") as f:
        f.write("".join(d + "[EOS]" for d in docs).encode("utf-8"))
    stream = array("H")
    with open(os.path.join(out, "data", f"{name}_ids.bin"), "rb") as f:
        stream.frombytes(f.read())
    if sys.byteorder == "big":
        stream.byteswap()
    got = kimi_ids(kimi, tok_dir, path)
    if got == list(stream):
        print(f"ok   {name} stream: data/{name}_ids.bin is C++'s ids ({len(got)} ids, "
              f"{len(docs)} [EOS])")
        return True
    i = next((k for k, (a, b) in enumerate(zip(got, stream)) if a != b), min(len(got), len(stream)))
    print(f"FAIL {name} stream: C++ {len(got)} ids, data/{name}_ids.bin {len(stream)}; first "
          f"difference at id {i}: C++ {got[max(0, i - 8):i + 8]}, "
          f"file {list(stream[max(0, i - 8):i + 8])}")
    return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kimi", required=True, help="the specdec-kimi binary")
    ap.add_argument("--work", required=True, help="a scratch directory (replaced)")
    args = ap.parse_args(argv)
    work = os.path.abspath(args.work)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    out = os.path.join(work, "data")
    rc = prepare_data.main(["--out", out, "--max-bytes", "300000", "--min-bytes", "300000",
                            "--ranks", str(RANKS), "--prompts", "200", "--heldout-prompts", "8"])
    if rc != 0:
        print(f"FAIL prepare_data.py exited {rc}")
        return 1
    tok_dir = os.path.join(out, "tokenizer")
    enc = bpe.load_tokenizer(tok_dir)
    ok = True
    for name in ("heldout", "train"):
        with open(os.path.join(out, "corpus", f"{name}.txt"), encoding="utf-8", newline="") as f:
            ok &= compare(name, enc, f.read(), args.kimi, tok_dir, work)
    for name in ("heldout", "train"):
        ok &= compare_stream(name, out, args.kimi, tok_dir, work)
    ok &= compare("stress", enc, STRESS, args.kimi, tok_dir, work)
    ok &= compare("fuzz", enc, fuzz_text(20000), args.kimi, tok_dir, work)

    ids = bpe.special_ids(RANKS)
    specials = "[EOS]<|im_end|>"
    special_path = os.path.join(work, "special.txt")
    with open(special_path, "w", encoding="utf-8") as f:
        f.write(specials)
    got = kimi_ids(args.kimi, tok_dir, special_path)
    want = [ids["[EOS]"], ids["<|im_end|>"]]
    if got != want or enc.encode(specials) != want:
        print(f"FAIL special: {specials!r} -> C++ {got}, Python {enc.encode(specials)}, "
              f"want {want} ([EOS], <|im_end|> of special_ids)")
        ok = False
    else:
        print(f"ok   special: {specials!r} -> {got}")
    ok &= compare("specials", enc, "x[BOS]y [PAD]\n<|im_user|>hi<|im_middle|> [EOS][EOS]"
                  f"<|reserved_token_{RANKS + 20}|>", args.kimi, tok_dir, work)

    ids_path = os.path.join(work, "stress_ids.json")
    with open(ids_path, "w") as f:
        json.dump(enc.encode(STRESS), f)
    p = run([args.kimi, "tokenize", "--tokenizer", tok_dir, "--input", ids_path, "--decode",
             "--json"])
    if p.returncode != 0 or json.loads(p.stdout)["text"] != STRESS:
        print(f"FAIL decode: tokenize --decode of the stress ids is not the stress text "
              f"({p.returncode}): {p.stdout[:200]}{p.stderr}")
        ok = False
    else:
        print("ok   decode: the stress ids decode to the stress text")

    cpp_dir = os.path.join(work, "init-random")
    p = run([args.kimi, "init-random", "--preset", "tiny", "--out", cpp_dir, "--config-only"])
    cpp_config = os.path.join(cpp_dir, "tokenizer_config.json")
    if p.returncode != 0 or not os.path.exists(cpp_config):
        print(f"FAIL init-random --config-only ({p.returncode}): {p.stdout}{p.stderr}")
        return 1
    with open(cpp_config, encoding="utf-8", newline="") as f:
        cpp_text = f.read()
    py_text = bpe.tokenizer_config(256, "P").replace(',\n  "pat_str": "P"', "")
    if cpp_text != py_text:
        print("FAIL config: bpe.tokenizer_config(256) differs from the C++ writer's (vocab 512)")
        ok = False
    else:
        print("ok   config: bpe.tokenizer_config(256) is the C++ writer's text (vocab 512)")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
