// Generates the Unicode class data that makes our PCRE2 pre-tokenizer agree with the
// official one on every code point.
//
// The official tokenizer (HF `tokenizers`, Rust) runs the pre-tokenizer regex with
// Oniguruma, whose Unicode tables are newer (16.0 for tokenizers 0.23) than those of the
// PCRE2 we link (10.42: Unicode 14.0). Code points assigned since then (new emoji such as
// U+1FAE8, new scripts) would otherwise fall outside \p{S}, \p{L}, ... and split differently.
//
// This script asks Oniguruma itself, through the `tokenizers` npm package (the Rust library's
// Node binding), which code points each class the regex uses contains, and writes:
//   tests/data/tokenizer/unicode_classes.json  the full tables (tests check PCRE2 against them)
//   src/text/unicode_supplement.inc            code points to add to PCRE2's classes
// The baseline for the supplement is Python's unicodedata, which must have PCRE2's Unicode
// version (both 14.0.0 on Debian 12); the C++ test compares the supplemented PCRE2 classes
// with the full tables, so a mismatch of baselines cannot go unnoticed.
//
//   node unicode_classes.mjs
import { writeFileSync } from "node:fs";
import { execFileSync } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, "..", "..", "..");
const hf = require("tokenizers");
const hfVersion = require("tokenizers/package.json").version;

// One membership probe per class, in Oniguruma. `\s` is probed as such: we spell it out
// for PCRE2 as [\x09-\x0D\x85\p{Z}] plus the supplement.
const classes = { L: "\\p{L}", M: "\\p{M}", N: "\\p{N}", P: "\\p{P}", S: "\\p{S}", White_Space: "\\s" };
const MAX = 0x10ffff;
const isSurrogate = (cp) => cp >= 0xd800 && cp <= 0xdfff;

function members(regex) {
  const tok = hf.Tokenizer.fromString(
    JSON.stringify({
      version: "1.0",
      model: { type: "BPE", vocab: {}, merges: [] },
      pre_tokenizer: { type: "Split", pattern: { Regex: regex }, behavior: "Isolated", invert: false },
    }),
  );
  const pre = tok.getPreTokenizer();
  const out = new Set();
  const batch = 4096;
  for (let start = 0; start <= MAX; start += batch) {
    // NUL between probes: in none of the classes, so a probe that matches comes back as a
    // piece of its own, and one that does not is glued to its NUL neighbours.
    let s = "\0";
    for (let cp = start; cp < Math.min(start + batch, MAX + 1); ++cp)
      if (!isSurrogate(cp)) s += String.fromCodePoint(cp) + "\0";
    for (const [piece] of pre.preTokenizeString(s)) {
      if (piece.includes("\0")) continue;
      for (const ch of piece) out.add(ch.codePointAt(0));
    }
  }
  return out;
}

function ranges(set) {
  const sorted = [...set].sort((a, b) => a - b);
  const r = [];
  for (const cp of sorted) {
    const last = r[r.length - 1];
    if (last && last[1] + 1 === cp) last[1] = cp;
    else r.push([cp, cp]);
  }
  return r;
}

// Python's Unicode (the PCRE2 baseline): the general category of every code point.
const pyVersion = execFileSync("python3", ["-c", "import unicodedata; print(unicodedata.unidata_version)"]).toString().trim();
const cats = execFileSync(
  "python3",
  ["-c", "import unicodedata,sys\nsys.stdout.write(''.join(unicodedata.category(chr(c)) for c in range(0x110000)))"],
  { maxBuffer: 8 << 20 },
).toString();
const cat = (cp) => cats.substr(2 * cp, 2);
const baseline = {
  L: (cp) => cat(cp)[0] === "L",
  M: (cp) => cat(cp)[0] === "M",
  N: (cp) => cat(cp)[0] === "N",
  P: (cp) => cat(cp)[0] === "P",
  S: (cp) => cat(cp)[0] === "S",
  White_Space: (cp) => (cp >= 0x09 && cp <= 0x0d) || cp === 0x85 || cat(cp)[0] === "Z",
};

const tables = {};
const supplement = {};
let problems = 0;
for (const [name, regex] of Object.entries(classes)) {
  const set = members(regex);
  tables[name] = ranges(set);
  const add = new Set();
  for (let cp = 0; cp <= MAX; ++cp) {
    if (isSurrogate(cp)) continue;
    const official = set.has(cp), base = baseline[name](cp);
    if (official && !base) add.add(cp);
    if (!official && base) {
      console.error(`${name}: U+${cp.toString(16).toUpperCase()} is in Python ${pyVersion}'s class but not in Oniguruma's`);
      ++problems;
    }
  }
  supplement[name] = ranges(add);
  console.log(`${name}: ${set.size} code points in ${tables[name].length} ranges; supplement ${add.size} in ${supplement[name].length} ranges`);
}
if (problems) {
  console.error(`${problems} code points would need removing from PCRE2's classes; the supplement cannot express that`);
  process.exit(1);
}

const source = `HF tokenizers ${hfVersion} (Oniguruma); baseline Python unicodedata ${pyVersion}`;
writeFileSync(
  join(root, "tests", "data", "tokenizer", "unicode_classes.json"),
  "{\n" +
    `  "source": ${JSON.stringify(source)},\n` +
    '  "classes": {\n' +
    Object.entries(tables).map(([k, r]) => `    ${JSON.stringify(k)}: ${JSON.stringify(r)}`).join(",\n") +
    "\n  }\n}\n",
);

const hex = (cp) => `\\\\x{${cp.toString(16).toUpperCase()}}`;
const cls = (r) => r.map(([a, b]) => (a === b ? hex(a) : `${hex(a)}-${hex(b)}`)).join("");
let inc =
  `// Generated by tests/oracle/tokenizer/unicode_classes.mjs from ${source}. Do not edit.\n` +
  "// Code points the official tokenizer's regex engine puts in each class and PCRE2 10.42\n" +
  "// (Unicode 14) does not: PCRE2 class-body syntax, appended to \\p{X} by for_pcre2().\n";
for (const [name, r] of Object.entries(supplement)) {
  inc += `static const char* const kSupplement_${name} =\n`;
  // Lines break between ranges, never inside an escape.
  const lines = [""];
  for (const item of r.map((x) => cls([x]))) {
    if (lines[lines.length - 1].length + item.length > 96) lines.push("");
    lines[lines.length - 1] += item;
  }
  inc += lines.map((l) => `    "${l}"`).join("\n") + ";\n";
}
// All supplemented code points as numeric ranges: text without any of them can use PCRE2's
// own (faster) classes with identical results.
const all = ranges(new Set(Object.values(supplement).flatMap((r) => r.flatMap(([a, b]) => Array.from({ length: b - a + 1 }, (_, k) => a + k)))));
inc += "static const uint32_t kSupplementRanges[][2] = {\n";
for (let i = 0; i < all.length; i += 4)
  inc += "    " + all.slice(i, i + 4).map(([a, b]) => `{0x${a.toString(16).toUpperCase()}, 0x${b.toString(16).toUpperCase()}}`).join(", ") + ",\n";
inc += "};\n";
writeFileSync(join(root, "src", "text", "unicode_supplement.inc"), inc);
console.log("wrote tests/data/tokenizer/unicode_classes.json and src/text/unicode_supplement.inc");
