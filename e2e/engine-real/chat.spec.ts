import { test, expect } from '@playwright/test';
import OpenAI from 'openai';
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, streamText } from 'ai';
import { ALL_APIS, CHAT_ONLY, STORY, baseURL, client, createKey, finishedRow } from './helpers';

// Chat completions through Moonji to a real Ollama: its real streams (a role
// in every delta, a usage chunk with "choices": [] only when asked for), as
// the official SDKs read them.
test.describe('chat completions against a real engine', () => {
  let key: string;
  let c: OpenAI;
  test.beforeAll(() => {
    key = createKey('chat@engine', 'engine-chat');
    c = client(key);
  });

  test('a real engine counts no more prompt tokens than a budget reserves: the body\'s bytes + 256', async () => {
    // The worst case for a bytes bound: short words, digits, punctuation,
    // accents, CJK and emoji, under a tiny model's small vocabulary (its
    // tokens are a byte or two), over several messages, each with its
    // template's markers.
    const messages: OpenAI.ChatCompletionMessageParam[] = [
      { role: 'system', content: 'You are a terse assistant. Réponds brièvement.' },
      { role: 'user', content: 'a b c d e f g h i j 1 2 3 4 5 6 7 8 9 0 ; : , . ! ? é ü ñ 日本語 🙂🚀' },
      { role: 'assistant', content: 'x y z' },
      { role: 'user', content: STORY },
    ];
    const params = { model: ALL_APIS, max_tokens: 4, messages };
    const bytes = Buffer.byteLength(JSON.stringify(params));
    const r = await c.chat.completions.create(params);
    expect(r.usage?.prompt_tokens).toBeGreaterThan(0);
    expect(r.usage!.prompt_tokens).toBeLessThanOrEqual(bytes + 256);
  });

  test('lists the configured models', async () => {
    const page = await c.models.list();
    expect(page.data.map((m) => m.id)).toEqual([ALL_APIS, CHAT_ONLY]);
  });

  test('streams with include_usage: text, then one usage chunk, and the row counts it', async () => {
    const { data: stream, response } = await c.chat.completions.create({
      model: ALL_APIS, stream: true, stream_options: { include_usage: true }, max_tokens: 16,
      messages: [{ role: 'user', content: STORY }],
    }).withResponse();
    const id = response.headers.get('x-inference-id')!;
    let text = '';
    let deltas = 0;
    let usage: OpenAI.CompletionUsage | undefined | null;
    let usageChunks = 0;
    let finish: string | null | undefined;
    let model: string | undefined;
    for await (const chunk of stream) {
      model = chunk.model;
      if (chunk.usage) { usage = chunk.usage; usageChunks++; }
      if (chunk.choices[0]?.delta?.content) { deltas++; text += chunk.choices[0].delta.content; }
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    expect(text.length).toBeGreaterThan(0);
    expect(usageChunks).toBe(1);
    expect(usage?.prompt_tokens).toBeGreaterThan(0);
    // The model may end its story before 16 tokens; it never writes more.
    expect(usage?.completion_tokens).toBeGreaterThan(0);
    expect(usage?.completion_tokens).toBeLessThanOrEqual(16);
    expect(finish === 'length' || finish === 'stop').toBe(true);
    if (finish === 'length') expect(usage?.completion_tokens).toBe(16);
    // The engine's own name for the model reaches the client unchanged.
    expect(model).toBe('tiny');
    expect(deltas).toBeGreaterThan(0);
    // Exactly one row, with the engine's own counts.
    const row = await finishedRow(id);
    expect(row).toMatchObject({
      outcome: 'success', model: ALL_APIS, backend: 'ollama', status: 200, usage_source: 'engine',
      prompt_tokens: usage!.prompt_tokens, completion_tokens: usage!.completion_tokens,
    });
  });

  test('streams without include_usage: the usage chunk the gateway asked for is dropped', async () => {
    const stream = await c.chat.completions.create({
      model: ALL_APIS, stream: true, max_tokens: 8, messages: [{ role: 'user', content: STORY }],
    });
    let sawUsage = false;
    let text = '';
    for await (const chunk of stream) {
      if (chunk.usage) sawUsage = true;
      text += chunk.choices[0]?.delta?.content ?? '';
    }
    expect(sawUsage).toBe(false);
    expect(text.length).toBeGreaterThan(0);
  });

  test('non-streaming answer with usage and X-Inference-Id', async () => {
    const { data, response } = await c.chat.completions.create({
      model: ALL_APIS, max_tokens: 12, messages: [{ role: 'user', content: STORY }],
    }).withResponse();
    expect(data.object).toBe('chat.completion');
    expect(data.choices[0].message.role).toBe('assistant');
    expect(data.choices[0].message.content?.length).toBeGreaterThan(0);
    expect(data.usage?.completion_tokens).toBeGreaterThan(0);
    expect(data.usage?.completion_tokens).toBeLessThanOrEqual(12);
    const id = response.headers.get('x-inference-id');
    expect(id).toMatch(/^inf_[0-9a-z]{26}$/);
    expect(await finishedRow(id!)).toMatchObject({ outcome: 'success', completion_tokens: data.usage!.completion_tokens });
  });

  test('chat.completions.stream().finalChatCompletion() assembles the real stream', async () => {
    const s = c.chat.completions.stream({
      model: CHAT_ONLY, max_tokens: 24, stream_options: { include_usage: true },
      messages: [{ role: 'user', content: STORY }],
    });
    let deltas = '';
    s.on('content', (d) => { deltas += d; });
    const final = await s.finalChatCompletion();
    expect(['length', 'stop']).toContain(final.choices[0].finish_reason);
    expect(final.choices[0].message.content).toBe(deltas);
    expect(deltas.length).toBeGreaterThan(0);
    expect(final.usage?.completion_tokens).toBeGreaterThan(0);
    expect(final.usage?.completion_tokens).toBeLessThanOrEqual(24);
  });

  test('the Vercel AI SDK: generateText and streamText on the chat API', async () => {
    const openai = createOpenAI({ apiKey: key, baseURL: `${baseURL}/v1` });
    const g = await generateText({ model: openai.chat(ALL_APIS), prompt: STORY, maxOutputTokens: 10, maxRetries: 0 });
    expect(g.text.length).toBeGreaterThan(0);
    expect(g.usage.outputTokens).toBeGreaterThan(0);
    expect(g.usage.outputTokens).toBeLessThanOrEqual(10);
    const errors: unknown[] = [];
    const s = streamText({
      model: openai.chat(CHAT_ONLY), prompt: STORY, maxOutputTokens: 10, maxRetries: 0,
      onError: ({ error }) => { errors.push(error); },
    });
    let streamed = '';
    for await (const part of s.textStream) streamed += part;
    expect(errors).toEqual([]);
    expect(streamed.length).toBeGreaterThan(0);
    expect(['length', 'stop']).toContain(await s.finishReason);
    expect((await s.usage).outputTokens).toBeGreaterThan(0);
  });

  test('an engine error is relayed in the SDK error class', async () => {
    // Ollama refuses a chat with no messages (400 "[] is too short").
    await expect(c.chat.completions.create({ model: ALL_APIS, messages: [] }))
      .rejects.toBeInstanceOf(OpenAI.BadRequestError);
  });
});
