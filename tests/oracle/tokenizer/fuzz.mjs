// Random texts stitched from awkward fragments (every kind of whitespace, marks, joiners,
// numbers of many scripts, emoji sequences, specials), encoded by the reference tokenizer.
// The output has the shape of expected_deepseek_v3.json ("ids_hf" where the official HF
// tokenizers differs from transformers.js); check it with
//
//   node fuzz.mjs --n 5000 --seed 7 --out /tmp/fuzz.json
//   DSV4_TOKENIZER_EXPECTED=/tmp/fuzz.json ./dsv4_tests --gtest_filter='TokenizerOracle.Ids*'
import { writeFileSync } from "node:fs";
import { expectedFile, loadOracles } from "./oracles.mjs";

const args = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : dflt;
};
const n = Number(opt("--n", "2000"));
let state = BigInt(opt("--seed", "1")) || 1n;
const rand = (k) => {
  // xorshift64*, so a seed gives the same texts on every machine
  state ^= state >> 12n;
  state ^= (state << 25n) & 0xffffffffffffffffn;
  state ^= state >> 27n;
  const out = (state * 0x2545f4914f6cdd1dn) & 0xffffffffffffffffn;
  return Number(out >> 33n) % k;
};

const fragments = [
  "a", "Z", "the", " the", "don't", "I'm", "'s", "'", "x", "Hello", "QWERTY", "élan", "ß", "İ", "ǅ",
  "0", "7", "42", "123", "4567", "٣", "१", "５", "½", "²", "Ⅻ", "㉑", "𝟘",
  ".", ",", "!", "?", ";", ":", "-", "_", "(", ")", "[", "]", "{", "}", "<", ">", "/", "\\", "\"", "#", "$", "%",
  "&", "*", "+", "=", "@", "^", "`", "|", "~", "...", "->", "=>", "!=", "::", "«", "»", "“", "”", "‘", "’", "—",
  "…", "¿", "¡", "。", "，", "、", "！", "？", "「", "」", "·", "•", "§", "¶", "©", "€", "£", "¥", "°", "±",
  " ", "  ", "   ", "\t", "\n", "\r", "\r\n", "\n\n", " \n", "\v", "\f", "\u0085", "\u00a0", "\u1680", "\u2000",
  "\u2003", "\u2009", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\u180e", "\ufeff",
  "\u200b", "\u200c", "\u200d", "\u2060", "\u00ad", "\u200e", "\u200f", "\u0001", "\u001f", "\u007f",
  "\u0301", "\u0303", "\u0308", "\u20e3", "\ufe0f", "\ufe0e",
  "中", "文", "龥", "龦", "鿿", "ひ", "カ", "ー", "ｶ", "한", "국", "ㄱ",
  "мир", "Ёж", "Γειά", "مرحبا", "ال", "שלום", "नमस्ते", "ि", "्", "สวัสดี", "ั", "ქართ", "Հայ", "ᐃᓄ",
  "😀", "👋", "🌍", "👍🏽", "👩‍💻", "🏳️‍🌈", "🇮🇹", "🇯🇵", "❤️", "🔥", "1️⃣", "⭐", "🧑🏿‍🦰",
  // newer than PCRE2's Unicode 14: 15.0, 16.0, and 17.0 (which HF tokenizers 0.23 does not know yet)
  "🫨", "🩷", "\u{1FAE9}", "\u{1CC00}", "\u{10D40}", "\u{31350}", "\u{1FAEA}", "\u{1F6D8}", "\u{16EA0}",
  "<｜User｜>", "<｜Assistant｜>", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<think>", "</think>",
  "｜DSML｜", "<|EOT|>", "<｜place▁holder▁no▁12｜>", "<｜tool▁sep｜>",
];

const oracles = loadOracles();
const texts = [];
for (let i = 0; i < n; ++i) {
  const len = 1 + rand(12);
  let text = "";
  for (let k = 0; k < len; ++k) text += fragments[rand(fragments.length)];
  texts.push(text);
}
const out = opt("--out", "/tmp/dsv4_tokenizer_fuzz.json");
const { body, differ } = await expectedFile(oracles, texts);
writeFileSync(out, body);
console.log(`${n} cases -> ${out}` + (oracles.hfName ? `; transformers.js differs from HF tokenizers on ${differ}` : ""));
