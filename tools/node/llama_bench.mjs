// llama.cpp side of `dsv4 bench` (node-llama-cpp, CPU): the same token ids and frontiers.
// At each frontier: prefill the new interval (timed), decode GEN tokens one by one (timed),
// then erase them so the next frontier continues from the prompt.
// Usage: node llama_bench.mjs MODEL.gguf TOKENS.json CSV_OUT --frontiers 512,1024 --gen 16 [--threads N]
import { getLlama, LlamaLogLevel } from "node-llama-cpp";
import fs from "node:fs";

const [modelPath, tokensPath, csvPath, ...rest] = process.argv.slice(2);
const opt = (name, def) => {
  const i = rest.indexOf(name);
  return i >= 0 ? rest[i + 1] : def;
};
const frontiers = opt("--frontiers", "512").split(",").map(Number);
const gen = Number(opt("--gen", "16"));
const threads = Number(opt("--threads", "2"));
const tokens = JSON.parse(fs.readFileSync(tokensPath, "utf8"));
const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
const model = await llama.loadModel({ modelPath, gpuLayers: 0 });
const maxF = Math.max(...frontiers);
const context = await model.createContext({ contextSize: maxF + gen + 16, batchSize: 512, threads, flashAttention: false });
const seq = context.getSequence();
const rows = ["ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,rss_bytes"];
let have = 0;
for (const f of frontiers) {
  const add = tokens.slice(have, f);
  let t0 = performance.now();
  if (add.length) await seq.evaluateWithoutGeneratingNewTokens(add);
  const pf = (performance.now() - t0) / 1000;
  have = f;
  let next = tokens[f] ?? 0;
  t0 = performance.now();
  for (let i = 0; i < gen; i++) {
    const r = await seq.controlledEvaluate([[next, { generateNext: { token: true } }]]);
    next = r[0]?.next?.token ?? 0;
  }
  const gs = (performance.now() - t0) / 1000;
  await seq.eraseContextTokenRanges([{ start: f, end: seq.nextTokenIndex }]);
  rows.push(`${f},${add.length},${(add.length / pf).toFixed(2)},${gen},${(gen / gs).toFixed(2)},${process.memoryUsage().rss}`);
  console.error(`llama.cpp: ctx ${f}: prefill ${(add.length / pf).toFixed(1)} tok/s, decode ${(gen / gs).toFixed(2)} tok/s`);
}
fs.writeFileSync(csvPath, rows.join("\n") + "\n");
await context.dispose();
await model.dispose();
