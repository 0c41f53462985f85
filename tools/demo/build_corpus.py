"""The demo corpus: the Python standard library's own source, one document per file.

Source: every *.py file under the stdlib directory (default: sysconfig.get_paths()["stdlib"] of
the interpreter running this; Debian's python3: /usr/lib/python3.X, from libpython3.X-minimal,
libpython3.X-stdlib, python3-distutils, python3-lib2to3; pass --stdlib for another), except
files under a directory named test, tests, idle_test or test_* (the stdlib's test suites),
site-packages, dist-packages and __pycache__. Symbolic links are not followed.

Normalization: each file is decoded as UTF-8 (a file that does not decode is skipped and listed in
the manifest) and every '\\r' is dropped; nothing else changes (tabs, form feeds and trailing
spaces stay). A document holding DOC_SEPARATOR's character is skipped and listed as well.

Split by file: held-out = files whose sha256(relative path, UTF-8) as an integer is 0 mod 50
(about 2%), train = the rest. Documents are in relative-path order.

--max-bytes N (small corpora for tests) keeps, in sha256(relative path) order, train files while
their sizes sum to at most N and held-out files while theirs sum to at most N / 50, each split at
least one file.

Outputs (write_corpus(out_dir, corpus)):
  corpus/manifest.json  the source directory, the running Python's version, the Debian packages
                        owning the files (dpkg), the rules above, and per file: relative path,
                        bytes, sha256, split; the skipped files with the reason
  corpus/train.txt      the train documents joined with DOC_SEPARATOR ("\\x1c\\n": the ASCII file
  corpus/heldout.txt    separator and a newline, in no document), so text.split(DOC_SEPARATOR)
                        gives the documents back exactly

unseen_documents(dirs, corpus): the *.py files under other directories (e.g. Debian's
/usr/lib/python3/dist-packages), normalized the same way, without the ones whose text equals a
corpus document's: text the target never trained on, for prompts (prepare_data.py --unseen-dir).

Standard library only; the same files give byte-identical outputs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import sysconfig
from dataclasses import dataclass, field

DOC_SEPARATOR = "\x1c\n"
HELDOUT_MODULUS = 50
DEFAULT_MIN_BYTES = 5_000_000
EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


class CorpusError(Exception):
    """A corpus that cannot be built (too little text, a missing directory)."""


@dataclass
class Document:
    path: str  # relative to the stdlib directory, '/'-separated
    text: str  # normalized
    size: int  # bytes of the file as read
    sha256: str  # of the file as read
    split: str  # "train" | "heldout"


@dataclass
class Corpus:
    stdlib_dir: str
    train: list[Document] = field(default_factory=list)
    heldout: list[Document] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    found_bytes: int = 0  # decodable files before --max-bytes
    max_bytes: int | None = None


def path_hash(rel: str) -> int:
    return int(hashlib.sha256(rel.encode("utf-8")).hexdigest(), 16)


def is_heldout(rel: str) -> bool:
    return path_hash(rel) % HELDOUT_MODULUS == 0


def excluded_dir(name: str) -> bool:
    return name in EXCLUDED_DIRS or name.startswith("test_")


def default_stdlib_dir() -> str:
    return sysconfig.get_paths()["stdlib"]


def source_files(stdlib_dir: str, skip_dir=excluded_dir) -> list[str]:
    """The relative paths of the *.py files under stdlib_dir, sorted; directories for which
    skip_dir(name) holds are not entered."""
    rels = []
    for root, dirs, files in os.walk(stdlib_dir):
        dirs[:] = sorted(d for d in dirs if not skip_dir(d))
        for name in files:
            full = os.path.join(root, name)
            if name.endswith(".py") and os.path.isfile(full) and not os.path.islink(full):
                rels.append(os.path.relpath(full, stdlib_dir).replace(os.sep, "/"))
    return sorted(rels)


def debian_packages(stdlib_dir: str, rels: list[str]) -> list[dict]:
    """The dpkg packages owning the files rels (under stdlib_dir): package, version, file count."""
    info = "/var/lib/dpkg/info"
    if not os.path.isdir(info):
        return []
    wanted = {os.path.join(stdlib_dir, r) for r in rels}
    owners: dict[str, int] = {}
    for name in sorted(os.listdir(info)):
        if not name.endswith(".list"):
            continue
        try:
            with open(os.path.join(info, name), encoding="utf-8", errors="replace") as f:
                n = sum(1 for line in f if line.rstrip("\n") in wanted)
        except OSError:
            continue
        if n:
            package = name[: -len(".list")].split(":")[0]
            owners[package] = owners.get(package, 0) + n
    versions: dict[str, str] = {}
    try:
        with open("/var/lib/dpkg/status", encoding="utf-8", errors="replace") as f:
            current = None
            for line in f:
                if line.startswith("Package: "):
                    current = line[len("Package: ") :].strip()
                elif current in owners and line.startswith("Version: "):
                    versions[current] = line[len("Version: ") :].strip()
    except OSError:
        pass
    return [{"package": p, "version": versions.get(p), "files": n}
            for p, n in sorted(owners.items())]


def read_document(root: str, rel: str, split: str) -> Document | str:
    """root/rel as a normalized Document, or why it is skipped."""
    with open(os.path.join(root, rel), "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"not UTF-8: {e}"
    text = text.replace("\r", "")
    if DOC_SEPARATOR[0] in text:
        return "holds the document separator U+001C"
    return Document(path=rel, text=text, size=len(raw), sha256=hashlib.sha256(raw).hexdigest(),
                    split=split)


def build_corpus(
    stdlib_dir: str | None = None,
    max_bytes: int | None = None,
    min_bytes: int = DEFAULT_MIN_BYTES,
) -> Corpus:
    stdlib_dir = os.path.abspath(stdlib_dir or default_stdlib_dir())
    if not os.path.isdir(stdlib_dir):
        raise CorpusError(f"{stdlib_dir}: not a directory (the Python standard library)")
    corpus = Corpus(stdlib_dir=stdlib_dir, max_bytes=max_bytes)
    docs = []
    for rel in source_files(stdlib_dir):
        doc = read_document(stdlib_dir, rel, "heldout" if is_heldout(rel) else "train")
        if isinstance(doc, str):
            corpus.skipped.append({"path": rel, "reason": doc})
            continue
        corpus.found_bytes += doc.size
        docs.append(doc)
    if corpus.found_bytes < min_bytes:
        raise CorpusError(
            f"{stdlib_dir}: only {corpus.found_bytes} bytes of UTF-8 .py source outside the test "
            f"suites ({len(docs)} files), fewer than the {min_bytes} needed: is this the "
            f"standard library (Debian: libpython3.X-stdlib)? Pass --stdlib DIR"
        )
    if max_bytes is not None:
        keep = set()
        for split, budget in (("train", max_bytes), ("heldout", max_bytes // HELDOUT_MODULUS)):
            total = 0
            for d in sorted((d for d in docs if d.split == split), key=lambda d: path_hash(d.path)):
                if total + d.size > budget and total > 0:
                    break
                keep.add(d.path)
                total += d.size
        docs = [d for d in docs if d.path in keep]
    corpus.train = [d for d in docs if d.split == "train"]
    corpus.heldout = [d for d in docs if d.split == "heldout"]
    if not corpus.train or not corpus.heldout:
        raise CorpusError(f"{stdlib_dir}: no {'train' if not corpus.train else 'held-out'} files")
    return corpus


def unseen_documents(dirs: list[str], corpus: Corpus) -> tuple[list[Document], list[dict]]:
    """The *.py files under dirs (paths 'dir/rel', split "unseen"; only __pycache__ is not
    entered), without those whose normalized text is a corpus document's (either split), and the
    skipped files with the reason."""
    seen = {d.text for d in corpus.train + corpus.heldout}
    docs, skipped = [], []
    for top in dirs:
        top = os.path.abspath(top)
        if not os.path.isdir(top):
            raise CorpusError(f"{top}: not a directory (--unseen-dir)")
        for rel in source_files(top, lambda name: name == "__pycache__"):
            path = f"{top}/{rel}"
            doc = read_document(top, rel, "unseen")
            if isinstance(doc, str):
                skipped.append({"path": path, "reason": doc})
            elif doc.text in seen:
                skipped.append({"path": path, "reason": "the text of a corpus document"})
            else:
                doc.path = path
                seen.add(doc.text)  # a second copy of the same file adds nothing
                docs.append(doc)
    return docs, skipped


def join_documents(docs: list[Document]) -> str:
    return DOC_SEPARATOR.join(d.text for d in docs)


def write_corpus(out_dir: str, corpus: Corpus) -> dict:
    """Writes out_dir/corpus/{manifest.json,train.txt,heldout.txt}; returns the manifest."""
    cdir = os.path.join(out_dir, "corpus")
    os.makedirs(cdir, exist_ok=True)
    docs = sorted(corpus.train + corpus.heldout, key=lambda d: d.path)
    manifest = {
        "source": "Python standard library source (*.py)",
        "stdlib_dir": corpus.stdlib_dir,
        "python_version": sys.version.split()[0],
        "debian_packages": debian_packages(corpus.stdlib_dir, [d.path for d in docs]),
        "excluded_dirs": sorted(EXCLUDED_DIRS) + ["test_*"],
        "normalization": "UTF-8; '\\r' dropped",
        "document_separator": DOC_SEPARATOR,
        "heldout_rule": f"sha256(relative path) % {HELDOUT_MODULUS} == 0",
        "found_bytes": corpus.found_bytes,
        "max_bytes": corpus.max_bytes,
        "train": {
            "files": len(corpus.train),
            "bytes": sum(len(d.text.encode("utf-8")) for d in corpus.train),
        },
        "heldout": {
            "files": len(corpus.heldout),
            "bytes": sum(len(d.text.encode("utf-8")) for d in corpus.heldout),
        },
        "files": [
            {"path": d.path, "bytes": d.size, "sha256": d.sha256, "split": d.split} for d in docs
        ],
        "skipped": corpus.skipped,
    }
    with open(os.path.join(cdir, "manifest.json"), "w", encoding="utf-8", newline="\n") as f:
        json.dump(manifest, f, indent=1, ensure_ascii=False)
        f.write("\n")
    for name, split_docs in (("train.txt", corpus.train), ("heldout.txt", corpus.heldout)):
        with open(os.path.join(cdir, name), "w", encoding="utf-8", newline="") as f:
            f.write(join_documents(split_docs))
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="writes OUT/corpus/")
    ap.add_argument("--stdlib", help="the standard library directory (default: sysconfig's)")
    ap.add_argument("--max-bytes", type=int, help="a small corpus (see the module docstring)")
    ap.add_argument("--min-bytes", type=int, default=DEFAULT_MIN_BYTES,
                    help="refuse a source with fewer bytes (default %(default)s)")
    args = ap.parse_args(argv)
    try:
        corpus = build_corpus(args.stdlib, args.max_bytes, args.min_bytes)
    except CorpusError as e:
        print(f"build_corpus: {e}", file=sys.stderr)
        return 2
    m = write_corpus(args.out, corpus)
    print(f"corpus: {m['train']['files']} train files ({m['train']['bytes']} bytes), "
          f"{m['heldout']['files']} held-out ({m['heldout']['bytes']} bytes), "
          f"{len(m['skipped'])} skipped, from {m['stdlib_dir']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
