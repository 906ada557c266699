import { test, expect } from '@playwright/test';
import OpenAI from 'openai';
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, streamText } from 'ai';
import { ChatOpenAI } from '@langchain/openai';
import { baseURL } from '../playwright.config';
import { createKey, recording } from './helpers';

// The rest of the OpenAI surface through the gateway, with the official
// openai SDK and the Vercel AI SDK: Responses (passed through to a backend
// that serves it, and translated for one that serves only chat: the
// `moonji engine` backend of moonji-engine), embeddings and completions.

// textOf is a response's text. openai-node 6.30's finalResponse() fills
// output_text only for structured outputs, so the text is read from the
// message items, as the SDK's own output_text would.
function textOf(r: OpenAI.Responses.Response): string {
  return r.output.flatMap((item) => (item.type === 'message' ? item.content : []))
    .map((part) => (part.type === 'output_text' ? part.text : '')).join('');
}

async function cancel(key: string, id: string | null) {
  expect(id).toMatch(/^inf_/);
  const r = await fetch(`${baseURL}/v1/inferences/${id}/cancel`, {
    method: 'POST', headers: { Authorization: `Bearer ${key}` },
  });
  expect(r.status).toBe(200);
}

test.describe('the other OpenAI APIs', () => {
  let key: string;
  let client: OpenAI;
  test.beforeAll(() => {
    key = createKey('apis@localhost', 'apis');
    client = new OpenAI({ apiKey: key, baseURL: `${baseURL}/v1`, maxRetries: 0 });
  });

  test('responses.create, passed through', async () => {
    const r = await client.responses.create({ model: 'moonji-demo', input: 'Tell me a story', max_output_tokens: 8 });
    expect(r.object).toBe('response');
    expect(r.output_text.split(/\s+/).filter(Boolean).length).toBe(8);
    expect(r.usage?.output_tokens).toBe(8);
    expect(r.usage?.input_tokens).toBeGreaterThan(0);
  });

  test('responses.stream().finalResponse(), passed through', async () => {
    let deltas = 0;
    const stream = client.responses.stream({ model: 'moonji-demo', input: 'Tell me a story', max_output_tokens: 10 });
    stream.on('response.output_text.delta', () => { deltas++; });
    const final = await stream.finalResponse();
    expect(deltas).toBe(10);
    expect(textOf(final).split(/\s+/).filter(Boolean).length).toBe(10);
  });

  test('responses.stream().finalResponse() after a stop, passed through', async () => {
    const rec = recording({ mock: { tps: 40, tokens: 2000 } });
    const c = new OpenAI({ apiKey: key, baseURL: `${baseURL}/v1`, maxRetries: 0, fetch: rec.fetch });
    const stream = c.responses.stream({ model: 'moonji-demo', input: 'a long story' });
    let deltas = 0;
    let stopped: Promise<void> | undefined;
    stream.on('response.output_text.delta', () => {
      deltas++;
      if (deltas === 4) stopped = cancel(key, rec.seen.id);
    });
    const final = await stream.finalResponse();
    await stopped;
    expect(textOf(final).length).toBeGreaterThan(0);
    expect(deltas).toBeGreaterThanOrEqual(4);
    expect(deltas).toBeLessThan(100);
  });

  test('responses.create and stream, translated for a chat-only backend', async () => {
    const r = await client.responses.create({ model: 'moonji-engine', input: 'Tell me a story', max_output_tokens: 6 });
    expect(r.id).toMatch(/^resp_inf_/);
    expect(r.output_text.split(/\s+/).filter(Boolean).length).toBe(6);
    expect(r.usage?.output_tokens).toBe(6);
    const final = await client.responses.stream({
      model: 'moonji-engine', instructions: 'Be brief.',
      input: [{ role: 'user', content: [{ type: 'input_text', text: 'Tell me a story' }] }], max_output_tokens: 7,
    }).finalResponse();
    // Cut by max_output_tokens: the stream ends with response.incomplete, on
    // which openai-node keeps the response it assembled from the deltas.
    expect(textOf(final).split(/\s+/).filter(Boolean).length).toBe(7);
  });

  test('responses.stream().finalResponse() after a stop, translated', async () => {
    const rec = recording();
    const c = new OpenAI({ apiKey: key, baseURL: `${baseURL}/v1`, maxRetries: 0, fetch: rec.fetch });
    const stream = c.responses.stream({ model: 'moonji-engine', input: 'a long story', max_output_tokens: 2000 });
    let deltas = 0;
    let stopped: Promise<void> | undefined;
    stream.on('response.output_text.delta', () => {
      deltas++;
      if (deltas === 4) stopped = cancel(key, rec.seen.id);
    });
    const final = await stream.finalResponse();
    await stopped;
    expect(final.id).toBe(`resp_${rec.seen.id}`);
    expect(final.status).toBe('completed');
    expect(textOf(final).length).toBeGreaterThan(0);
    expect(deltas).toBeLessThan(2000);
  });

  test('the Vercel AI SDK: openai.responses() through the translation', async () => {
    const openai = createOpenAI({ apiKey: key, baseURL: `${baseURL}/v1` });
    const { text, usage } = await generateText({ model: openai.responses('moonji-engine'), prompt: 'Tell me a story', maxOutputTokens: 5 });
    expect(text.split(/\s+/).filter(Boolean).length).toBe(5);
    expect(usage.outputTokens).toBe(5);
    const s = streamText({ model: openai.responses('moonji-engine'), prompt: 'Tell me a story', maxOutputTokens: 6 });
    let streamed = '';
    for await (const part of s.textStream) streamed += part;
    expect(streamed.split(/\s+/).filter(Boolean).length).toBe(6);
    expect((await s.usage).outputTokens).toBe(6);
  });

  test("LangChain's ChatOpenAI({ useResponsesApi: true }) through the translation", async () => {
    const llm = new ChatOpenAI({
      model: 'moonji-engine', useResponsesApi: true, apiKey: key, maxTokens: 6, maxRetries: 0,
      configuration: { baseURL: `${baseURL}/v1` },
    });
    const msg = await llm.invoke('Tell me a story');
    const text = typeof msg.content === 'string' ? msg.content
      : msg.content.map((p) => ('text' in p ? p.text : '')).join('');
    expect(text.split(/\s+/).filter(Boolean).length).toBe(6);
    expect(msg.usage_metadata?.output_tokens).toBe(6);
    let streamed = '';
    for await (const chunk of await llm.stream('Tell me a story')) {
      streamed += typeof chunk.content === 'string' ? chunk.content
        : chunk.content.map((p) => ('text' in p ? p.text : '')).join('');
    }
    expect(streamed.split(/\s+/).filter(Boolean).length).toBe(6);
  });

  test('embeddings.create (base64 by default) and as floats', async () => {
    const r = await client.embeddings.create({ model: 'moonji-demo', input: ['first', 'second text'] });
    expect(r.data.length).toBe(2);
    expect(r.data[0].embedding.length).toBeGreaterThan(0);
    expect(typeof r.data[0].embedding[0]).toBe('number');
    expect(r.usage.prompt_tokens).toBeGreaterThan(0);
    const f = await client.embeddings.create({ model: 'moonji-demo', input: 'first', encoding_format: 'float' });
    expect(f.data[0].embedding.length).toBe(r.data[0].embedding.length);
    f.data[0].embedding.forEach((v, i) => expect(v).toBeCloseTo(r.data[0].embedding[i], 5));
  });

  test('completions.create with stream', async () => {
    const stream = await client.completions.create({
      model: 'moonji-demo', prompt: 'Once upon a time', max_tokens: 9, stream: true, stream_options: { include_usage: true },
    });
    let text = '';
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.text ?? '';
      if (chunk.usage) usage = chunk.usage;
    }
    expect(text.split(/\s+/).filter(Boolean).length).toBe(9);
    expect(usage?.completion_tokens).toBe(9);
  });

  test('an API the backend does not serve: 404 naming it', async () => {
    await expect(client.embeddings.create({ model: 'moonji-engine', input: 'x' })).rejects.toMatchObject({
      status: 404, code: 'api_not_supported',
    });
  });
});
