"""The demo model's data: corpus, tokenizer, token streams and prompts, in one run.

  prepare_data.py --out DIR [--ranks 3840] [--stdlib DIR] [--max-bytes N] [--min-bytes N]
                  [--prompts N] [--heldout-prompts N] [--unseen-dir DIR]... [--unseen-prompts N]
                  [--extra-train-fraction F]

writes into DIR:
  corpus/{manifest.json,train.txt,heldout.txt}   build_corpus.py (the stdlib's *.py, split by file)
  tokenizer/{tiktoken.model,tokenizer_config.json}   bpe.py, trained on corpus/train.txt's
                                documents: --ranks ranks, vocabulary ranks + 256 (Kimi's special
                                block on top; 3840 -> 4096)
  data/train_ids.bin            the train documents' ids (bpe.Encoder.encode_ordinary: a special
  data/heldout_ids.bin          token's text in a document stays text), uint16 little-endian, each
                                document followed by the [EOS] id (3841 at vocabulary 4096); no
                                [BOS]
  data/prompts_train.jsonl      PROMPTS_TRAIN windows of 48..96 tokens of train documents, one
  data/prompts_heldout.jsonl    a line: {"input_ids": [...], "text": ..., "doc": path,
                                "token": index in the document}; PROMPTS_HELDOUT of held-out ones
  data/prompts_unseen.jsonl     with --unseen-dir: --unseen-prompts windows of the *.py files under
                                those directories that are no corpus document
                                (build_corpus.unseen_documents), e.g. Debian's
                                /usr/lib/python3/dist-packages: text the target never trained on,
                                for the draft's training continuations (the target's continuations
                                of its own training text are easier to predict than of new text)
  data/extra_train_ids.bin      with --extra-train-fraction F > 0: the token stream (as
                                train_ids.bin) of the share F of those documents chosen by a hash
                                of each path (extra_train_document), for the target to train on
                                beside the stdlib (train_target.py --extra-ids); prompts_unseen
                                then comes from the other documents only
  data/meta.json                vocabulary, ranks, special ids, token and byte counts, bytes per
                                token, the split pattern, the prompt rules
A window starts at the first token of a non-blank line (after its indentation: the split pattern
ends a piece there) and ends inside its document. The starts are a sample, without repeats, of all
such tokens with 96 tokens of their document after them, drawn by random.Random(PROMPT_SEED) (one
generator per list); the lengths are drawn by the same generator, in document order.
Standard library only; the same stdlib files give byte-identical outputs. Timings go to stdout.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from array import array

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bpe  # noqa: E402
import build_corpus  # noqa: E402

PROMPTS_TRAIN = 6000
PROMPTS_HELDOUT = 64
PROMPT_MIN_TOKENS = 48
PROMPT_MAX_TOKENS = 96
PROMPT_SEED = 1234


def line_starts(ids: list[int], tokens: list[bytes]) -> list[int]:
    """Indices of the tokens that begin a non-blank line's text (after its indentation)."""
    out = []
    at_line_start = True  # only spaces / tabs since the last '\n' (or the document's start)
    for k, i in enumerate(ids):
        t = tokens[i]
        if at_line_start and t[0] not in b" \t\n\r\f\x0b":
            out.append(k)
        nl = t.rfind(b"\n")
        tail = t if nl < 0 else t[nl + 1 :]
        at_line_start = (at_line_start or nl >= 0) and not tail.strip(b" \t")
    return out


def sample_prompts(docs, doc_ids, enc: bpe.Encoder, count: int) -> list[dict]:
    cands = []
    for d, ids in enumerate(doc_ids):
        last = len(ids) - PROMPT_MAX_TOKENS
        cands.extend((d, k) for k in line_starts(ids, enc.tokens) if k <= last)
    rng = random.Random(PROMPT_SEED)
    picks = sorted(rng.sample(range(len(cands)), min(count, len(cands))))
    prompts = []
    for p in picks:
        d, k = cands[p]
        window = doc_ids[d][k : k + rng.randint(PROMPT_MIN_TOKENS, PROMPT_MAX_TOKENS)]
        prompts.append({"input_ids": window, "text": enc.decode(window), "doc": docs[d].path,
                        "token": k})
    return prompts


def extra_train_document(path: str, fraction: float) -> bool:
    """Whether the --unseen-dir document at `path` goes to the target's extra training text: a
    stable hash of the path below `fraction` (the same files split the same way on any machine)."""
    digest = hashlib.sha256(path.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") / 2.0 ** 64 < fraction


def write_ids(path: str, doc_ids: list[list[int]], eos: int) -> int:
    a = array("H")
    for ids in doc_ids:
        a.extend(ids)
        a.append(eos)
    if sys.byteorder == "big":
        a.byteswap()
    with open(path, "wb") as f:
        a.tofile(f)
    return len(a)


def write_jsonl(path: str, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--ranks", type=int, default=3840, help="256 bytes + merges (default 3840)")
    ap.add_argument("--stdlib", help="the standard library directory (default: sysconfig's)")
    ap.add_argument("--max-bytes", type=int, help="a small corpus (build_corpus.py)")
    ap.add_argument("--min-bytes", type=int, default=build_corpus.DEFAULT_MIN_BYTES,
                    help="refuse a source with fewer bytes (default %(default)s)")
    ap.add_argument("--prompts", type=int, default=PROMPTS_TRAIN)
    ap.add_argument("--heldout-prompts", type=int, default=PROMPTS_HELDOUT)
    ap.add_argument("--unseen-dir", action="append", default=[],
                    help="a directory of *.py files for data/prompts_unseen.jsonl (repeatable)")
    ap.add_argument("--unseen-prompts", type=int, default=PROMPTS_TRAIN)
    ap.add_argument("--extra-train-fraction", type=float, default=0.0,
                    help="the share of --unseen-dir's documents the target trains on "
                         "(data/extra_train_ids.bin; default 0)")
    args = ap.parse_args(argv)
    if not 0.0 <= args.extra_train_fraction < 1.0:
        print(f"prepare_data: --extra-train-fraction {args.extra_train_fraction}: needs 0 <= F < 1 "
              "(some documents must stay unseen for prompts_unseen.jsonl)", file=sys.stderr)
        return 2
    if args.extra_train_fraction > 0 and not args.unseen_dir:
        print("prepare_data: --extra-train-fraction needs --unseen-dir (the documents it splits)",
              file=sys.stderr)
        return 2
    vocab = args.ranks + bpe.KIMI_BLOCK
    if args.ranks < 256 or vocab > 1 << 16:
        print(f"prepare_data: --ranks {args.ranks}: needs 256 <= ranks <= {(1 << 16) - 256} "
              "(uint16 ids)", file=sys.stderr)
        return 2
    clock = time.perf_counter()

    def lap(what: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        print(f"{what}: {now - clock:.1f} s", flush=True)
        clock = now

    try:
        corpus = build_corpus.build_corpus(args.stdlib, args.max_bytes, args.min_bytes)
    except build_corpus.CorpusError as e:
        print(f"prepare_data: {e}", file=sys.stderr)
        return 2
    manifest = build_corpus.write_corpus(args.out, corpus)
    print(f"corpus: {manifest['train']['files']} train files ({manifest['train']['bytes']} "
          f"bytes), {manifest['heldout']['files']} held-out ({manifest['heldout']['bytes']} "
          f"bytes), {len(manifest['skipped'])} skipped, from {corpus.stdlib_dir}")
    lap("corpus")

    counts = bpe.count_pieces(d.text for d in corpus.train)
    lap(f"split: {sum(counts.values())} pieces, {len(counts)} distinct")
    try:
        tokens = bpe.train(counts, args.ranks)
    except bpe.BpeError as e:
        print(f"prepare_data: {e}", file=sys.stderr)
        return 2
    tok_dir = os.path.join(args.out, "tokenizer")
    bpe.write_tokenizer(tok_dir, tokens)
    lap(f"train: {args.ranks} ranks, vocabulary {vocab}")

    enc = bpe.load_tokenizer(tok_dir)
    specials = bpe.special_ids(args.ranks)
    eos = specials["[EOS]"]
    data_dir = os.path.join(args.out, "data")
    os.makedirs(data_dir, exist_ok=True)
    def write_split(name: str, docs: list) -> tuple[list[list[int]], dict]:
        """data/{name}_ids.bin from docs; their ids and the split's counts for meta.json."""
        doc_ids = [enc.encode_ordinary(d.text) for d in docs]
        stream = write_ids(os.path.join(data_dir, f"{name}_ids.bin"), doc_ids, eos)
        text_tokens = stream - len(doc_ids)
        text_bytes = sum(len(d.text.encode("utf-8")) for d in docs)
        with_special = sum(1 for d in docs if enc.special_regex.search(d.text))
        lap(f"encode {name}: {len(docs)} files, {text_tokens} tokens, "
            f"{text_bytes / text_tokens:.3f} bytes/token")
        return doc_ids, {
            "documents": len(docs),
            "text_bytes": text_bytes,
            "text_tokens": text_tokens,
            "stream_tokens": stream,
            "bytes_per_token": round(text_bytes / text_tokens, 4),
            "documents_holding_special_text": with_special,
        }

    splits = {}
    for name, docs in (("train", corpus.train), ("heldout", corpus.heldout)):
        doc_ids, meta_split = write_split(name, docs)
        splits[name] = (docs, doc_ids, meta_split)

    prompt_sets = [("train", args.prompts), ("heldout", args.heldout_prompts)]
    unseen_meta = None
    if args.unseen_dir:
        try:
            docs, skipped = build_corpus.unseen_documents(args.unseen_dir, corpus)
        except build_corpus.CorpusError as e:
            print(f"prepare_data: {e}", file=sys.stderr)
            return 2
        owners = build_corpus.debian_packages("/", [d.path.lstrip("/") for d in docs])
        extra, kept = [], []
        for d in docs:
            (extra if extra_train_document(d.path, args.extra_train_fraction) else kept).append(d)
        docs = kept
        if not docs:
            print(f"prepare_data: --extra-train-fraction {args.extra_train_fraction} left no "
                  "--unseen-dir document for prompts_unseen.jsonl; lower it", file=sys.stderr)
            return 2
        doc_ids = [enc.encode_ordinary(d.text) for d in docs]
        splits["unseen"] = (docs, doc_ids, None)
        prompt_sets.append(("unseen", args.unseen_prompts))
        unseen_meta = {
            "dirs": [os.path.abspath(d) for d in args.unseen_dir],
            "debian_packages": owners,
            "documents": len(docs),
            "text_bytes": sum(len(d.text.encode("utf-8")) for d in docs),
            "text_tokens": sum(len(ids) for ids in doc_ids),
            "skipped": len(skipped),
            "skipped_as_corpus_text": sum(1 for k in skipped
                                          if k["reason"] == "the text of a corpus document"),
        }
        if extra:
            _, meta_split = write_split("extra_train", extra)
            unseen_meta["extra_train"] = {"fraction": args.extra_train_fraction, **meta_split}
        lap(f"encode unseen: {len(docs)} files, {unseen_meta['text_tokens']} tokens, "
            f"{len(skipped)} skipped")

    prompt_counts = {}
    for name, count in prompt_sets:
        docs, doc_ids, _ = splits[name]
        rows = sample_prompts(docs, doc_ids, enc, count)
        write_jsonl(os.path.join(data_dir, f"prompts_{name}.jsonl"), rows)
        prompt_counts[name] = len(rows)
    lap("prompts: " + ", ".join(f"{n} {name}" for name, n in prompt_counts.items()))

    meta = {
        "vocab_size": vocab,
        "ranks": args.ranks,
        "special_ids": {
            "bos": specials["[BOS]"],
            "eos": eos,
            "pad": specials["[PAD]"],
            "im_end": specials["<|im_end|>"],
        },
        "ids_file_format": "uint16 little-endian; each document followed by eos; no bos",
        "pattern": bpe.PATTERN,
        "train": splits["train"][2],
        "heldout": splits["heldout"][2],
        "prompts": {
            **prompt_counts,
            "tokens": [PROMPT_MIN_TOKENS, PROMPT_MAX_TOKENS],
            "seed": PROMPT_SEED,
            "start": "the first token of a non-blank line of a document",
        },
        "corpus": {
            "stdlib_dir": corpus.stdlib_dir,
            "python_version": manifest["python_version"],
            "max_bytes": corpus.max_bytes,
        },
    }
    if unseen_meta is not None:
        meta["unseen"] = unseen_meta
    with open(os.path.join(data_dir, "meta.json"), "w", encoding="utf-8", newline="\n") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out}/{{corpus,tokenizer,data}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
