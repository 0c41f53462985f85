// Throughput of the reference encoder (npm `tiktoken`: tiktoken's Rust core in WASM) on the corpus
// repeated to about 1 MB, the text specdec's benchmarks/bench_tokenizer.cpp times, so the two
// can be read side by side. Prints MB/s (1 MB = 1e6 bytes of UTF-8) of encode(text, "all"):
// the median of `reps` runs after one warm-up.
// Usage: node bench.js <corpus.txt> [encoding ...]   (default: cl100k_base o200k_base o200k_kimi)
"use strict";

const fs = require("fs");
const { ENCODINGS, referenceEncoder } = require("./common");

function main() {
  const [corpusPath, ...names] = process.argv.slice(2);
  if (!corpusPath) {
    console.error("usage: node bench.js <corpus.txt> [encoding ...]");
    process.exit(2);
  }
  const corpus = fs.readFileSync(corpusPath, "utf8");
  const copies = Math.max(1, Math.ceil(1e6 / Buffer.byteLength(corpus, "utf8")));
  const text = corpus.repeat(copies);
  const bytes = Buffer.byteLength(text, "utf8");
  const reps = 7;
  for (const name of names.length ? names : ENCODINGS) {
    const enc = referenceEncoder(name);
    let ids = enc.encode(text, "all");
    const times = [];
    for (let i = 0; i < reps; ++i) {
      const t0 = process.hrtime.bigint();
      ids = enc.encode(text, "all");
      times.push(Number(process.hrtime.bigint() - t0) / 1e9);
    }
    enc.free();
    times.sort((a, b) => a - b);
    const s = times[Math.floor(reps / 2)];
    console.log(`reference ${name}: ${(bytes / 1e6 / s).toFixed(2)} MB/s ` +
                `(${bytes} bytes, ${ids.length} ids, median of ${reps}: ${(s * 1e3).toFixed(1)} ms)`);
  }
}

main();
