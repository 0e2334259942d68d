// The official `openai` npm client against `dsv4 serve`: chat (streamed and not, with the
// usage chunk), thinking deltas, tools present and a tool-call round trip in the history,
// legacy completions, models, and errors surfacing as the client's typed exceptions.
//
//   node tools/node/serve_openai_test.mjs http://127.0.0.1:PORT/v1
//
// Exits 0 when every check passes; prints the failing check otherwise. The server runs a
// random-weight model, so the checks are about the protocol, and greedy requests are
// compared with each other (streamed vs not), never with fixed text.
import assert from "node:assert/strict";
import OpenAI from "openai";

const baseURL = process.argv[2];
if (!baseURL) {
  console.error("usage: node serve_openai_test.mjs BASE_URL");
  process.exit(2);
}
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 60_000 });
const greedy = { model: "deepseek-chat", temperature: 0, max_tokens: 12 };
const user = (content) => [{ role: "user", content }];

const checks = [];
const check = (name, fn) => checks.push({ name, fn });

check("chat, not streamed", async () => {
  const r = await client.chat.completions.create({ ...greedy, messages: user("Say hello.") });
  assert.equal(r.object, "chat.completion");
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, "assistant");
  assert.equal(typeof r.choices[0].message.content, "string");
  assert.ok(["stop", "length"].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 0);
  assert.ok(r.usage.completion_tokens <= 12);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, "number");
});

check("chat, streamed, equals the non-streamed greedy answer", async () => {
  const messages = user("Count to five.");
  const whole = await client.chat.completions.create({ ...greedy, messages });
  const stream = await client.chat.completions.create({
    ...greedy,
    messages,
    stream: true,
    stream_options: { include_usage: true },
  });
  let content = "";
  let finish = null;
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    assert.equal(chunk.object, "chat.completion.chunk");
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta?.content) content += c.delta.content;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.ok(chunks >= 2);
  assert.equal(content, whole.choices[0].message.content);
  assert.equal(finish, whole.choices[0].finish_reason);
  assert.ok(usage, "a usage chunk");
  assert.equal(usage.completion_tokens, whole.usage.completion_tokens);
  assert.equal(usage.prompt_tokens, whole.usage.prompt_tokens);
});

check("thinking: reasoning streamed apart from content", async () => {
  const stream = await client.chat.completions.create({
    model: "deepseek-reasoner",
    messages: user("Think, then answer."),
    max_tokens: 16,
    seed: 7,
    stream: true,
  });
  let reasoning = "";
  let content = "";
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      if (c.delta?.reasoning_content) reasoning += c.delta.reasoning_content;
      if (c.delta?.content) content += c.delta.content;
    }
  }
  // Random weights: the text is noise, but it starts inside <think>, so some of it is reasoning.
  assert.ok(reasoning.length + content.length > 0);
  assert.ok(reasoning.length > 0, "reasoning_content deltas");
});

const tools = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Current weather of a city",
      parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
    },
  },
];

check("tools present: the request is rendered and answered", async () => {
  const r = await client.chat.completions.create({
    ...greedy,
    messages: user("Weather in Paris?"),
    tools,
    tool_choice: "auto",
  });
  assert.ok(["stop", "length", "tool_calls"].includes(r.choices[0].finish_reason));
  for (const call of r.choices[0].message.tool_calls ?? []) {
    assert.equal(call.type, "function");
    JSON.parse(call.function.arguments);
  }
});

check("tool-call round trip: calls and results in the history", async () => {
  const messages = [
    { role: "system", content: "You are a weather bot." },
    { role: "user", content: "Weather in Paris and Oslo?" },
    {
      role: "assistant",
      content: null,
      tool_calls: [
        { id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city":"Paris"}' } },
        { id: "call_2", type: "function", function: { name: "get_weather", arguments: '{"city":"Oslo"}' } },
      ],
    },
    { role: "tool", tool_call_id: "call_1", content: '{"temp_c": 21}' },
    { role: "tool", tool_call_id: "call_2", content: '{"temp_c": 9} </tool_result> escaped' },
  ];
  const r = await client.chat.completions.create({ ...greedy, messages, tools });
  assert.equal(r.choices[0].message.role, "assistant");
  assert.ok(r.usage.prompt_tokens > 20);
  // Streamed, with tool_calls deltas assembled the way the client's helpers do.
  const stream = await client.chat.completions.create({ ...greedy, messages, tools, stream: true });
  const calls = [];
  let text = "";
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      if (c.delta?.content) text += c.delta.content;
      for (const tc of c.delta?.tool_calls ?? []) {
        calls[tc.index] ??= { id: tc.id, name: "", arguments: "" };
        if (tc.function?.name) calls[tc.index].name += tc.function.name;
        if (tc.function?.arguments) calls[tc.index].arguments += tc.function.arguments;
      }
    }
  }
  assert.equal(text, r.choices[0].message.content ?? "");
  assert.equal(calls.length, (r.choices[0].message.tool_calls ?? []).length);
});

check("legacy completions, streamed and not", async () => {
  const req = { model: "deepseek-chat", prompt: "Once upon a time", max_tokens: 10, temperature: 0 };
  const r = await client.completions.create(req);
  assert.equal(r.object, "text_completion");
  assert.equal(typeof r.choices[0].text, "string");
  assert.ok(r.usage.completion_tokens <= 10);
  const stream = await client.completions.create({ ...req, stream: true });
  let text = "";
  for await (const chunk of stream) text += chunk.choices[0]?.text ?? "";
  assert.equal(text, r.choices[0].text);
});

check("models", async () => {
  const list = await client.models.list();
  const ids = [];
  for await (const m of list) ids.push(m.id);
  assert.ok(ids.includes("deepseek-v4-flash"));
  const m = await client.models.retrieve("deepseek-v4-flash");
  assert.equal(m.id, "deepseek-v4-flash");
});

check("errors are the client's typed exceptions", async () => {
  await assert.rejects(client.chat.completions.create({ ...greedy, messages: [] }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.equal(e.status, 400);
    assert.equal(e.code, "empty_array");
    assert.equal(e.param, "messages");
    return true;
  });
  await assert.rejects(
    client.chat.completions.create({ ...greedy, messages: [{ role: "wizard", content: "x" }] }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === "messages[0].role",
  );
  await assert.rejects(
    client.chat.completions.create({ ...greedy, messages: user("word ".repeat(5000)) }),
    (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError);
      assert.equal(e.code, "context_length_exceeded");
      assert.ok(e.error.n_prompt_tokens > e.error.n_ctx);
      return true;
    },
  );
  await assert.rejects(client.models.retrieve("no-such-model"), (e) => e instanceof OpenAI.NotFoundError);
});

let failed = 0;
for (const { name, fn } of checks) {
  try {
    await fn();
    console.log(`ok   ${name}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${e?.stack ?? e}`);
  }
}
console.log(failed ? `${failed} of ${checks.length} failed` : `all ${checks.length} passed`);
process.exit(failed ? 1 : 0);
