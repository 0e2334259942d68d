// Oracle 1 (docs/validation.md): llama.cpp's `deepseek4` graph through node-llama-cpp.
// Usage: node llama_logits.mjs MODEL.gguf TOKENS.json OUT.bin [--greedy N]
// Writes float32 little-endian logits [n_tokens][n_vocab] (row i = prediction after
// tokens 0..i), the same layout as `dsv4 logits`. With --greedy N it instead prints the
// N greedily generated token ids after the prompt as JSON on stdout.
// Exact numbers need flash attention off and an F32 KV cache (validation.md).
import { getLlama, LlamaLogLevel } from "node-llama-cpp";
import fs from "node:fs";

const [modelPath, tokensPath, outPath, ...rest] = process.argv.slice(2);
if (!modelPath || !tokensPath || !outPath) {
  console.error("usage: node llama_logits.mjs MODEL.gguf TOKENS.json OUT.bin [--greedy N] [--threads N]");
  process.exit(2);
}
const opt = (name, def) => {
  const i = rest.indexOf(name);
  return i >= 0 ? Number(rest[i + 1]) : def;
};
const greedy = opt("--greedy", 0);
const threads = opt("--threads", 2);
const tokens = JSON.parse(fs.readFileSync(tokensPath, "utf8"));

const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
const model = await llama.loadModel({ modelPath, gpuLayers: 0, useMmap: true });
const nVocab = model.tokens ? undefined : undefined;
const contextSize = Math.max(256, tokens.length + greedy + 8);
const context = await model.createContext({
  contextSize,
  batchSize: Math.min(contextSize, 512),
  flashAttention: false,
  threads,
  experimentalKvCacheKeyType: "F32",
  experimentalKvCacheValueType: "F32",
});
const seq = context.getSequence();

if (greedy > 0) {
  const out = [];
  const it = seq.evaluate(tokens, { temperature: 0 });
  for await (const t of it) {
    out.push(t);
    if (out.length >= greedy) break;
  }
  process.stdout.write(JSON.stringify(out) + "\n");
} else {
  const res = await seq.controlledEvaluate(tokens.map((t) => [t, { generateNext: { logits: true } }]));
  let V = 0;
  for (const r of res) if (r && r.next && r.next.logits) { V = r.next.logits.size; break; }
  const buf = new Float32Array(tokens.length * V);
  res.forEach((r, i) => {
    for (const [tok, v] of r.next.logits) buf[i * V + tok] = v;
  });
  fs.writeFileSync(outPath, Buffer.from(buf.buffer));
  console.error(`llama.cpp logits: ${tokens.length} positions x ${V} -> ${outPath}`);
}
await context.dispose();
await model.dispose();
void nVocab;
