// Writes an encoding of the npm package `tiktoken` as a specdec tokenizer directory:
//   <out_dir>/tiktoken.model          "<base64 bytes> <rank>" per token, by rank
//   <out_dir>/tokenizer_config.json   added_tokens_decoder (the encoding's special tokens) and
//                                     pat_str; o200k_kimi writes no pat_str (specdec's default,
//                                     Kimi's pattern, applies)
// and checks every token's bytes against the WASM encoder's own decode_single_token_bytes.
// Usage: node export.js <cl100k_base | o200k_base | o200k_kimi> <out_dir>
"use strict";

const fs = require("fs");
const path = require("path");
const { encodingData, referenceEncoder, decodeBpeRanks } = require("./common");

function main() {
  const [name, outDir] = process.argv.slice(2);
  if (!name || !outDir) {
    console.error("usage: node export.js <encoding> <out_dir>");
    process.exit(2);
  }
  const { data, kimi } = encodingData(name);
  const ranks = decodeBpeRanks(data.bpe_ranks).sort((a, b) => a[1] - b[1]);
  const enc = referenceEncoder(name);
  try {
    ranks.forEach(([b64, rank], i) => {
      if (rank !== i) throw new Error(`${name}: ranks are not 0..N-1 (rank ${rank} at ${i})`);
      const mine = Buffer.from(b64, "base64");
      const theirs = Buffer.from(enc.decode_single_token_bytes(rank));
      if (!mine.equals(theirs)) throw new Error(`${name}: rank ${rank}: ${b64} decodes differently`);
    });
  } finally {
    enc.free();
  }
  const added = {};
  for (const [content, id] of Object.entries(data.special_tokens)) {
    added[String(id)] = { content, special: true };
  }
  const config = { added_tokens_decoder: added };
  if (!kimi) config.pat_str = data.pat_str;
  fs.mkdirSync(outDir, { recursive: true });
  fs.writeFileSync(path.join(outDir, "tiktoken.model"),
                   ranks.map(([b64, rank]) => `${b64} ${rank}\n`).join(""));
  fs.writeFileSync(path.join(outDir, "tokenizer_config.json"), JSON.stringify(config, null, 1));
  console.log(`${name}: ${ranks.length} ranks, ${Object.keys(added).length} special tokens -> ${outDir}`);
}

main();
