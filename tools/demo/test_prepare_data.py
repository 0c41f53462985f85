#!/usr/bin/env python3
"""demo.prepare_data: prepare_data.py --unseen-dir on a small corpus (--max-bytes 300000).

The unseen directory holds a copy of a corpus file (left out: the target trained on it), a new
file (its prompts are windows of its own token stream), a file in __pycache__ (not read) and a
file that is not UTF-8 (skipped, with the reason). A missing --unseen-dir is exit 2 with its
name. Standard library only; a few seconds.
"""

import contextlib
import io
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bpe  # noqa: E402
import build_corpus  # noqa: E402
import prepare_data  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAILED: " + what)


def main():
    work = tempfile.mkdtemp(prefix="specdec_prepare_data_")
    try:
        corpus = build_corpus.build_corpus(None, 300000)
        unseen = os.path.join(work, "unseen")
        os.makedirs(os.path.join(unseen, "pkg", "__pycache__"))
        copied = corpus.train[0]
        shutil.copy(os.path.join(corpus.stdlib_dir, copied.path),
                    os.path.join(unseen, "pkg", "copy.py"))
        new_text = "".join("def handler_%d(event, ctx):\n    return event.get(%d, ctx)\n\n"
                           % (i, i) for i in range(400))
        with open(os.path.join(unseen, "pkg", "new.py"), "w", encoding="utf-8") as f:
            f.write(new_text)
        with open(os.path.join(unseen, "pkg", "__pycache__", "cached.py"), "w") as f:
            f.write("def never_read():\n    pass\n" * 200)
        with open(os.path.join(unseen, "pkg", "latin1.py"), "wb") as f:
            f.write(b"# caf\xe9\nx = 1\n")

        out = os.path.join(work, "out")
        with contextlib.redirect_stdout(io.StringIO()):
            rc = prepare_data.main(["--out", out, "--max-bytes", "300000", "--ranks", "512",
                                    "--prompts", "20", "--unseen-dir", unseen,
                                    "--unseen-prompts", "30"])
        check(rc == 0, "prepare_data exit %s" % rc)
        meta = json.load(open(os.path.join(out, "data", "meta.json")))
        u = meta.get("unseen", {})
        check(u.get("documents") == 1, "unseen documents %s, want 1 (new.py)" % u.get("documents"))
        check(u.get("skipped") == 2 and u.get("skipped_as_corpus_text") == 1,
              "unseen skipped %s (as corpus text %s), want 2 (1)"
              % (u.get("skipped"), u.get("skipped_as_corpus_text")))
        check(meta["prompts"].get("unseen") == 30, "prompts %s" % meta["prompts"])
        enc = bpe.load_tokenizer(os.path.join(out, "tokenizer"))
        stream = enc.encode_ordinary(new_text)
        rows = [json.loads(line) for line in open(os.path.join(out, "data",
                                                               "prompts_unseen.jsonl"))]
        check(len(rows) == 30, "%d unseen prompts, want 30" % len(rows))
        for r in rows:
            ids, k = r["input_ids"], r["token"]
            check(r["doc"].endswith("/pkg/new.py"), "prompt from %s" % r["doc"])
            check(48 <= len(ids) <= 96, "prompt of %d tokens" % len(ids))
            check(ids == stream[k:k + len(ids)], "prompt at token %d is not new.py's stream" % k)
            check(r["text"] == enc.decode(ids), "prompt text is not its ids' text")

        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            rc = prepare_data.main(["--out", os.path.join(work, "out2"), "--max-bytes", "300000",
                                    "--ranks", "512", "--unseen-dir",
                                    os.path.join(work, "missing")])
        check(rc == 2 and "missing: not a directory (--unseen-dir)" in err.getvalue(),
              "missing --unseen-dir: exit %s, stderr %r" % (rc, err.getvalue()))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        print("test_prepare_data: %d failed" % len(failures))
        return 1
    print("test_prepare_data: unseen prompts, the corpus copy left out, bad input refused")
    return 0


if __name__ == "__main__":
    sys.exit(main())
