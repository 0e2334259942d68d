// llama.cpp's tokenizer (node-llama-cpp) on a corpus, through a GGUF's tokenizer metadata.
// Usage: node llama_tokenize.mjs MODEL.gguf CORPUS.json OUT.json
// CORPUS is a JSON array of strings; OUT is {"tokenizer": ..., "cases": [{"text", "ids"}]}.
// Specials are not parsed (plain text), no BOS is added: the same contract as `dsv4 tokenize`.
import { getLlama, LlamaLogLevel } from "node-llama-cpp";
import fs from "node:fs";

const [modelPath, corpusPath, outPath] = process.argv.slice(2);
const corpus = JSON.parse(fs.readFileSync(corpusPath, "utf8"));
const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
const model = await llama.loadModel({ modelPath, gpuLayers: 0, vocabOnly: true });
const cases = corpus.map((text) => ({ text, ids: Array.from(model.tokenize(text, false)) }));
fs.writeFileSync(outPath, JSON.stringify({ tokenizer: "node-llama-cpp@3.22.1 (llama.cpp)", cases }));
await model.dispose();
