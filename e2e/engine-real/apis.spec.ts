import { test, expect } from '@playwright/test';
import OpenAI from 'openai';
import { createOpenAI } from '@ai-sdk/openai';
import { generateText } from 'ai';
import { ALL_APIS, CHAT_ONLY, STORY, baseURL, client, createKey, finishedRow, textOf } from './helpers';

// Responses, embeddings and completions through Moonji to a real Ollama:
// /v1/responses passed through to Ollama's own (typed events, no [DONE],
// usage in response.completed) and translated into chat for the chat-only
// backend; embeddings and completions passed through.
test.describe('the other OpenAI APIs against a real engine', () => {
  let key: string;
  let c: OpenAI;
  test.beforeAll(() => {
    key = createKey('apis@engine', 'engine-apis');
    c = client(key);
  });

  test('responses.create, passed through to Ollama', async () => {
    const { data: r, response } = await c.responses.create({ model: ALL_APIS, input: STORY, max_output_tokens: 12 })
      .withResponse();
    expect(r.object).toBe('response');
    // Ollama's own response id: the request was passed through.
    expect(r.id).toMatch(/^resp_/);
    expect(r.id).not.toMatch(/^resp_inf_/);
    expect(r.status).toBe('completed');
    expect(r.output_text.length).toBeGreaterThan(0);
    expect(r.usage?.input_tokens).toBeGreaterThan(0);
    expect(r.usage?.output_tokens).toBeGreaterThan(0);
    expect(r.usage?.output_tokens).toBeLessThanOrEqual(12);
    expect(await finishedRow(response.headers.get('x-inference-id')!)).toMatchObject({
      outcome: 'success', backend: 'ollama', prompt_tokens: r.usage!.input_tokens, completion_tokens: r.usage!.output_tokens,
    });
  });

  test('responses.stream().finalResponse(), passed through to Ollama', async () => {
    let deltas = '';
    const s = c.responses.stream({ model: ALL_APIS, input: STORY, max_output_tokens: 16 });
    const types = new Set<string>();
    s.on('event', (e) => { types.add(e.type); });
    s.on('response.output_text.delta', (e) => { deltas += e.delta; });
    const final = await s.finalResponse();
    expect(final.id).not.toMatch(/^resp_inf_/);
    expect(types).toContain('response.created');
    expect(types).toContain('response.completed');
    expect(deltas.length).toBeGreaterThan(0);
    expect(textOf(final)).toBe(deltas);
    expect(final.usage?.output_tokens).toBeGreaterThan(0);
    expect(final.usage?.output_tokens).toBeLessThanOrEqual(16);
  });

  test('responses.create and stream, translated for the chat-only backend', async () => {
    const { data: r, response } = await c.responses.create({
      model: CHAT_ONLY, instructions: 'Tell a story.', input: STORY, max_output_tokens: 12,
    }).withResponse();
    const id = response.headers.get('x-inference-id');
    // The translation's response id is resp_ and the inference id.
    expect(r.id).toBe(`resp_${id}`);
    expect(r.object).toBe('response');
    expect(['completed', 'incomplete']).toContain(r.status);
    expect(r.output_text.length).toBeGreaterThan(0);
    expect(r.usage?.output_tokens).toBeGreaterThan(0);
    expect(r.usage?.output_tokens).toBeLessThanOrEqual(12);
    expect(await finishedRow(id!)).toMatchObject({ outcome: 'success', backend: 'ollama-chat' });

    let deltas = '';
    const s = c.responses.stream({
      model: CHAT_ONLY, input: [{ role: 'user', content: [{ type: 'input_text', text: STORY }] }], max_output_tokens: 14,
    });
    const events: OpenAI.Responses.ResponseStreamEvent[] = [];
    s.on('event', (e) => { events.push(e); });
    s.on('response.output_text.delta', (e) => { deltas += e.delta; });
    const final = await s.finalResponse();
    expect(final.id).toMatch(/^resp_inf_/);
    expect(deltas.length).toBeGreaterThan(0);
    expect(textOf(final)).toBe(deltas);
    // The translated event sequence, ended by response.incomplete when cut by
    // max_output_tokens (openai-node then keeps the response it assembled
    // from the deltas, status in_progress), or response.completed when the
    // story ended first.
    expect(events[0].type).toBe('response.created');
    const last = events[events.length - 1];
    if (last.type === 'response.incomplete') {
      expect(last.response.incomplete_details?.reason).toBe('max_output_tokens');
      expect(last.response.usage?.output_tokens).toBe(14);
    } else {
      expect(last.type).toBe('response.completed');
      expect(final.status).toBe('completed');
    }
  });

  test('the Vercel AI SDK: openai.responses(), passed through and translated', async () => {
    const openai = createOpenAI({ apiKey: key, baseURL: `${baseURL}/v1` });
    for (const model of [ALL_APIS, CHAT_ONLY]) {
      const { text, usage } = await generateText({ model: openai.responses(model), prompt: STORY, maxOutputTokens: 10, maxRetries: 0 });
      expect(text.length, model).toBeGreaterThan(0);
      expect(usage.outputTokens, model).toBeGreaterThan(0);
      expect(usage.outputTokens, model).toBeLessThanOrEqual(10);
    }
  });

  test('embeddings.create: base64 by default, two inputs, vectors of one length', async () => {
    const { data: r, response } = await c.embeddings.create({ model: ALL_APIS, input: ['Once upon a time', 'a little girl named Lily'] })
      .withResponse();
    expect(r.object).toBe('list');
    expect(r.data.length).toBe(2);
    expect(r.data.map((d) => d.index)).toEqual([0, 1]);
    const [a, b] = r.data.map((d) => d.embedding);
    expect(a.length).toBeGreaterThan(0);
    expect(b.length).toBe(a.length);
    for (const v of [...a, ...b]) expect(Number.isFinite(v)).toBe(true);
    expect(a).not.toEqual(b);
    expect(r.usage.prompt_tokens).toBeGreaterThan(0);
    // As floats: the same vector.
    const f = await c.embeddings.create({ model: ALL_APIS, input: 'Once upon a time', encoding_format: 'float' });
    expect(f.data[0].embedding.length).toBe(a.length);
    f.data[0].embedding.forEach((v, i) => expect(v).toBeCloseTo(a[i], 4));
    expect(await finishedRow(response.headers.get('x-inference-id')!)).toMatchObject({
      outcome: 'success', prompt_tokens: r.usage.prompt_tokens, completion_tokens: 0,
    });
  });

  test('completions.create with stream and usage', async () => {
    const { data: stream, response } = await c.completions.create({
      model: ALL_APIS, prompt: STORY, max_tokens: 16, stream: true, stream_options: { include_usage: true },
    }).withResponse();
    let text = '';
    let usage: OpenAI.CompletionUsage | undefined;
    let usageChunks = 0;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.text ?? '';
      if (chunk.usage && chunk.choices.length === 0) { usage = chunk.usage; usageChunks++; }
    }
    expect(text.length).toBeGreaterThan(0);
    expect(usageChunks).toBe(1);
    expect(usage?.completion_tokens).toBeGreaterThan(0);
    expect(usage?.completion_tokens).toBeLessThanOrEqual(16);
    expect(await finishedRow(response.headers.get('x-inference-id')!)).toMatchObject({
      outcome: 'success', completion_tokens: usage!.completion_tokens,
    });
  });

  test('an API the chat-only backend does not serve: 404 naming it', async () => {
    await expect(c.embeddings.create({ model: CHAT_ONLY, input: 'x' })).rejects.toMatchObject({
      status: 404, code: 'api_not_supported',
    });
  });
});
