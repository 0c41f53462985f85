// Encodes a corpus file and generated stress texts with the reference encoder (npm `tiktoken`,
// tiktoken's Rust core in WASM) and writes them with their ids as JSON:
//   {"encoding": name, "cases": [{"name", "text", "ids", "ordinary"}, ...]}
//   ids        encode(text, allowed_special = "all")
//   ordinary   encode_ordinary(text): special tokens' texts as plain text
// Cases: the corpus; the corpus with the encoding's special tokens (and a broken one) spliced in;
// long runs (letters, spaces, newlines, digits, Han, emoji: pieces long enough for specdec's heap
// merge); and a seeded random mix of scripts, marks, emoji and whitespace.
// Usage: node encode.js <cl100k_base | o200k_base | o200k_kimi> <corpus.txt> <out.json>
"use strict";

const fs = require("fs");
const { encodingData, referenceEncoder } = require("./common");

// Deterministic (the same texts on every run): a 32-bit LCG.
function rng(seed) {
  let s = seed >>> 0;
  return (n) => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s % n;
  };
}

// Code point pools (Unicode <= 13, so PCRE2 10.42's Unicode 14 tables know them all).
const POOLS = [
  "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
  "0123456789",
  " \t\n\r\u000b\u000c\u00a0\u3000\u2009\u0085",
  "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
  "áéíóúàèçñöüßÆøœÅÉÎ",
  "αβγδεζηθλμπσωΔΣΩ",
  "абвгдежзийклмнопрстуфхцчшщыэюяАБВГДЖЯ",
  "مرحباالعربيةكتاب",
  "שלוםעולם",
  "你好世界中文测试汉字語言東京々",
  "ひらがなカタカナーッ",
  "한국어안녕하세요",
  "。、，「」！？：；（）【】",
  "\u0301\u0308\u0327\u20dd",
  "😀😂🎉👍🚀🌍❤\ufe0f\u200d",
  "'sSlLtTdDmMrReEvV",
];

function randomMix(seed, length) {
  const r = rng(seed);
  const pools = POOLS.map((p) => Array.from(p));
  let out = "";
  let n = 0;
  while (n < length) {
    const pool = pools[r(pools.length)];
    const run = 1 + r(8);
    for (let i = 0; i < run; ++i, ++n) out += pool[r(pool.length)];
  }
  return out;
}

function cases(corpus, specials) {
  const lines = corpus.split("\n");
  const spliced = [];
  lines.forEach((line, i) => {
    spliced.push(line);
    if (i % 7 === 3) spliced.push(specials[i % specials.length]);
  });
  const withSpecials =
    specials.join("") + spliced.join("\n") + "x" + specials[0] + specials[0].slice(0, -1) +
    " " + specials[specials.length - 1];
  const r = rng(7);
  let letters = "";
  for (let i = 0; i < 3000; ++i) letters += "abcdefghijklmnopqrstuvwxyz"[r(26)];
  return [
    { name: "corpus", text: corpus },
    { name: "corpus_with_specials", text: withSpecials },
    { name: "long_letters", text: letters + " " + letters.toUpperCase() },
    { name: "long_same_letter", text: "a".repeat(2000) + " " + "ab".repeat(700) },
    { name: "long_whitespace", text: " ".repeat(1500) + "x" + "\n".repeat(400) + "\t ".repeat(300) +
      "\r\n".repeat(200) + "y   " },
    { name: "long_digits", text: "1234567890".repeat(300) },
    { name: "long_han", text: "漢字的文本处理测试中文".repeat(200) + "。" },
    { name: "long_emoji", text: "😀🎉👍🚀".repeat(150) + "!!".repeat(200) },
    { name: "random_mix", text: randomMix(12345, 20000) },
  ];
}

function main() {
  const [name, corpusPath, outPath] = process.argv.slice(2);
  if (!name || !corpusPath || !outPath) {
    console.error("usage: node encode.js <encoding> <corpus.txt> <out.json>");
    process.exit(2);
  }
  const corpus = fs.readFileSync(corpusPath, "utf8");
  const { data } = encodingData(name);
  const enc = referenceEncoder(name);
  try {
    const out = cases(corpus, Object.keys(data.special_tokens)).map((c) => ({
      name: c.name,
      text: c.text,
      ids: Array.from(enc.encode(c.text, "all")),
      ordinary: Array.from(enc.encode_ordinary(c.text)),
    }));
    fs.writeFileSync(outPath, JSON.stringify({ encoding: name, cases: out }));
    const total = out.reduce((a, c) => a + c.ids.length, 0);
    console.log(`${name}: ${out.length} cases, ${total} ids -> ${outPath}`);
  } finally {
    enc.free();
  }
}

main();
