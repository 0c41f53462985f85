// Shared by export.js, encode.js and bench.js: the reference encoders, built from the npm package
// `tiktoken` (tiktoken's own Rust core compiled to WASM; its ranks ship in
// tiktoken/encoders/<name>.json as {pat_str, special_tokens, bpe_ranks}).
//
// Encodings:
//   cl100k_base, o200k_base   as the package ships them
//   o200k_kimi                o200k_base's ranks and special tokens with Kimi-K2.5's split pattern
//                             (KIMI_PAT, verbatim from tokenization_kimi.py: character-class
//                             intersections included, which tiktoken's regex engine supports):
//                             the reference for specdec's PCRE2 translation of that pattern
"use strict";

const { Tiktoken } = require("tiktoken/lite");

const KIMI_PAT = [
  String.raw`[\p{Han}]+`,
  String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`\p{N}{1,3}`,
  String.raw` ?[^\s\p{L}\p{N}]+[\r\n]*`,
  String.raw`\s*[\r\n]+`,
  String.raw`\s+(?!\S)`,
  String.raw`\s+`,
].join("|");

const ENCODINGS = ["cl100k_base", "o200k_base", "o200k_kimi"];

// {data: {pat_str, special_tokens, bpe_ranks}, pat_str, kimi} for an encoding name.
function encodingData(name) {
  if (!ENCODINGS.includes(name)) {
    throw new Error(`unknown encoding "${name}": one of ${ENCODINGS.join(", ")}`);
  }
  const kimi = name === "o200k_kimi";
  const data = require(`tiktoken/encoders/${kimi ? "o200k_base" : name}.json`);
  return { data, pat_str: kimi ? KIMI_PAT : data.pat_str, kimi };
}

// A Tiktoken (WASM) for an encoding name; free() it when done.
function referenceEncoder(name) {
  const { data, pat_str } = encodingData(name);
  return new Tiktoken(data.bpe_ranks, data.special_tokens, pat_str);
}

// The package's compact bpe_ranks -> [[base64, rank], ...]. Each line is
// "<tag> <offset> <base64> <base64> ..." (the i-th token has rank offset + i) or, as in a
// .tiktoken file, "<base64> <rank>".
function decodeBpeRanks(bpeRanks) {
  const out = [];
  for (const line of bpeRanks.split("\n")) {
    if (line.length === 0) continue;
    const fields = line.split(" ");
    if (fields.length === 2) {
      out.push([fields[0], Number.parseInt(fields[1], 10)]);
      continue;
    }
    const offset = Number.parseInt(fields[1], 10);
    if (!Number.isInteger(offset)) throw new Error(`bad bpe_ranks line: ${line.slice(0, 60)}`);
    for (let i = 2; i < fields.length; ++i) out.push([fields[i], offset + i - 2]);
  }
  return out;
}

module.exports = { KIMI_PAT, ENCODINGS, encodingData, referenceEncoder, decodeBpeRanks };
