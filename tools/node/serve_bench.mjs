// Load generator for `dsv4 serve`: C concurrent clients, each sending R streamed chat
// requests (greedy, ignore_eos, exactly N output tokens), measuring per request the time to
// first token (TTFT) and the time per output token after it (TPOT), and overall the
// aggregate decode rate. Prints one JSON object.
//
//   node tools/node/serve_bench.mjs --url http://127.0.0.1:PORT --clients 4 --requests 2 \
//        --tokens 64 --prompt-words 120
//
// Plain fetch + a small SSE reader (no client library in the timing path).
const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith("--") ? [...acc, [a.slice(2), all[i + 1]]] : acc), []),
);
const url = args.url ?? "http://127.0.0.1:8000";
const clients = Number(args.clients ?? 1);
const requests = Number(args.requests ?? 2);
const tokens = Number(args.tokens ?? 64);
const promptWords = Number(args["prompt-words"] ?? 100);

const words = ["river", "stone", "lamp", "orbit", "violet", "engine", "harbor", "quiet", "matrix", "ember"];
function prompt(client, k) {
  // Distinct per request (no prefix reuse between requests), lengths varying around promptWords.
  const n = Math.max(8, Math.round(promptWords * (0.5 + ((client * 7 + k * 3) % 10) / 10)));
  const out = [`Request ${client}.${k}:`];
  for (let i = 0; i < n; i++) out.push(words[(i * (client + 3) + k) % words.length]);
  return out.join(" ");
}

async function one(client, k) {
  const body = {
    model: "deepseek-chat",
    messages: [{ role: "user", content: prompt(client, k) }],
    max_tokens: tokens,
    temperature: 0,
    ignore_eos: true,
    stream: true,
    stream_options: { include_usage: true },
  };
  const t0 = performance.now();
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  if (!res.ok) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  let first = null;
  let last = null;
  let usage = null;
  let buf = "";
  const dec = new TextDecoder();
  for await (const part of res.body) {
    buf += dec.decode(part, { stream: true });
    let nl;
    while ((nl = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, nl);
      buf = buf.slice(nl + 2);
      if (!ev.startsWith("data: ")) continue;
      const data = ev.slice(6);
      if (data === "[DONE]") continue;
      const c = JSON.parse(data);
      if (c.usage) usage = c.usage;
      const d = c.choices?.[0]?.delta;
      if (d && ((d.content ?? "") !== "" || (d.reasoning_content ?? "") !== "")) {
        const now = performance.now();
        if (first === null) first = now;
        last = now;
      }
    }
  }
  const n = usage?.completion_tokens ?? 0;
  return {
    prompt_tokens: usage?.prompt_tokens ?? 0,
    completion_tokens: n,
    ttft_ms: (first ?? performance.now()) - t0,
    tpot_ms: n > 1 && first !== null ? (last - first) / (n - 1) : 0,
    total_ms: performance.now() - t0,
  };
}

const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] : 0;
};
const mean = (xs) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0);

const t0 = performance.now();
const results = (
  await Promise.all(
    Array.from({ length: clients }, async (_, c) => {
      const out = [];
      for (let k = 0; k < requests; k++) out.push(await one(c, k));
      return out;
    }),
  )
).flat();
const wall = (performance.now() - t0) / 1000;
const out = {
  clients,
  requests: results.length,
  tokens_per_request: tokens,
  prompt_tokens_mean: mean(results.map((r) => r.prompt_tokens)),
  completion_tokens: results.reduce((a, r) => a + r.completion_tokens, 0),
  wall_s: wall,
  aggregate_decode_tps: results.reduce((a, r) => a + r.completion_tokens, 0) / wall,
  ttft_ms_mean: mean(results.map((r) => r.ttft_ms)),
  ttft_ms_p50: pct(results.map((r) => r.ttft_ms), 50),
  ttft_ms_p95: pct(results.map((r) => r.ttft_ms), 95),
  tpot_ms_mean: mean(results.map((r) => r.tpot_ms)),
  tpot_ms_p50: pct(results.map((r) => r.tpot_ms), 50),
  tpot_ms_p95: pct(results.map((r) => r.tpot_ms), 95),
};
console.log(JSON.stringify(out));
