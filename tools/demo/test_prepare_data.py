#!/usr/bin/env python3
"""demo.prepare_data: prepare_data.py --unseen-dir on a small corpus (--max-bytes 300000).

The unseen directory holds a copy of a corpus file (left out: the target trained on it), a new
file (its prompts are windows of its own token stream), a file in __pycache__ (not read) and a
file that is not UTF-8 (skipped, with the reason). --extra-train-fraction 0.5 over 16 new files
writes the chosen documents' stream to data/extra_train_ids.bin and takes the unseen prompts
from the others only. A missing --unseen-dir, a fraction of 1 and a fraction without
--unseen-dir are exit 2 with their names. Standard library only; a few seconds.
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

        # --extra-train-fraction: a share of the documents, by a hash of the path, becomes the
        # target's extra training stream; the prompts come from the others only.
        many = os.path.join(work, "many")
        os.makedirs(many)
        for i in range(16):
            with open(os.path.join(many, "mod_%02d.py" % i), "w", encoding="utf-8") as f:
                f.write("".join("def f%d_%d(x):\n    return x * %d + %d\n\n" % (i, j, i, j)
                                for j in range(60)))
        out3 = os.path.join(work, "out3")
        with contextlib.redirect_stdout(io.StringIO()):
            rc = prepare_data.main(["--out", out3, "--max-bytes", "300000", "--ranks", "512",
                                    "--prompts", "20", "--unseen-dir", many,
                                    "--unseen-prompts", "40", "--extra-train-fraction", "0.5"])
        check(rc == 0, "prepare_data --extra-train-fraction exit %s" % rc)
        docs, _ = build_corpus.unseen_documents([many], corpus)
        extra = [d for d in docs if prepare_data.extra_train_document(d.path, 0.5)]
        rest = [d for d in docs if not prepare_data.extra_train_document(d.path, 0.5)]
        check(0 < len(extra) < 16, "%d of 16 documents in the extra split" % len(extra))
        enc3 = bpe.load_tokenizer(os.path.join(out3, "tokenizer"))
        meta3 = json.load(open(os.path.join(out3, "data", "meta.json")))
        eos = meta3["special_ids"]["eos"]
        want = []
        for d in extra:
            want += enc3.encode_ordinary(d.text) + [eos]
        raw = open(os.path.join(out3, "data", "extra_train_ids.bin"), "rb").read()
        got = [int.from_bytes(raw[i:i + 2], "little") for i in range(0, len(raw), 2)]
        check(got == want, "extra_train_ids.bin is not the extra documents' stream")
        x = meta3["unseen"].get("extra_train", {})
        check(x.get("documents") == len(extra) and x.get("stream_tokens") == len(want),
              "meta extra_train %s" % x)
        check(meta3["unseen"]["documents"] == len(rest), "meta unseen %s" % meta3["unseen"])
        rest_paths = {d.path for d in rest}
        for line in open(os.path.join(out3, "data", "prompts_unseen.jsonl")):
            doc = json.loads(line)["doc"]
            check(doc in rest_paths, "an unseen prompt from %s, a document the target trains on"
                  % doc)

        def refused(args, text, what):
            err = io.StringIO()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                rc = prepare_data.main(["--out", os.path.join(work, "out2"), "--max-bytes",
                                        "300000", "--ranks", "512"] + args)
            check(rc == 2 and text in err.getvalue(),
                  "%s: exit %s, stderr %r" % (what, rc, err.getvalue()))

        refused(["--unseen-dir", os.path.join(work, "missing")],
                "missing: not a directory (--unseen-dir)", "missing --unseen-dir")
        refused(["--unseen-dir", many, "--extra-train-fraction", "1"],
                "--extra-train-fraction 1.0: needs 0 <= F < 1", "fraction 1")
        refused(["--extra-train-fraction", "0.5"], "--extra-train-fraction needs --unseen-dir",
                "fraction without --unseen-dir")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        print("test_prepare_data: %d failed" % len(failures))
        return 1
    print("test_prepare_data: unseen prompts, the corpus copy left out, the extra training "
          "split, bad input refused")
    return 0


if __name__ == "__main__":
    sys.exit(main())
