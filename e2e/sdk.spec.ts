import { test, expect } from '@playwright/test';
import OpenAI from 'openai';
import { baseURL } from '../playwright.config';
import { createKey } from './helpers';

// The official openai npm SDK must take Moonji for OpenAI: streams with and
// without usage, whole answers, and errors mapped to the SDK's classes.
test.describe('openai SDK against the gateway', () => {
  let client: OpenAI;
  let key: string;
  test.beforeAll(() => {
    key = createKey('sdk@localhost', 'sdk');
    client = new OpenAI({ apiKey: key, baseURL: `${baseURL}/v1`, maxRetries: 0 });
  });

  test('skips the keep-alive comments of a model that thinks (stream_keepalive: 200ms)', async () => {
    const body = {
      model: 'moonji-demo', stream: true as const, max_tokens: 3, messages: [{ role: 'user' as const, content: 'Think first' }],
      // Silent 700 ms before the first token and after it: several keep-alives each time.
      mock: { ttft_ms: 700, pause_after: 1, pause_ms: 700 },
    };
    const raw = await fetch(`${baseURL}/v1/chat/completions`, {
      method: 'POST', headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' }, body: JSON.stringify(body),
    });
    const text = await raw.text();
    expect(text).toContain(': keepalive\n\n');
    expect(text.endsWith('data: [DONE]\n\n')).toBe(true);

    const stream = await client.chat.completions.create(body);
    let content = '';
    let chunks = 0;
    for await (const chunk of stream) {
      chunks++;
      content += chunk.choices[0]?.delta?.content ?? '';
    }
    expect(content.split(/\s+/).filter(Boolean).length).toBe(3);
    expect(chunks).toBeGreaterThan(3);
  });

  test('lists the configured models', async () => {
    const page = await client.models.list();
    expect(page.data.map((m) => m.id)).toEqual(['moonji-demo', 'moonji-slow', 'moonji-down', 'moonji-queue', 'moonji-engine', 'moonji-priced', 'moonji-vision']);
  });

  test('streams with include_usage: content, then one usage chunk', async () => {
    const stream = await client.chat.completions.create({
      model: 'moonji-demo', stream: true, stream_options: { include_usage: true }, max_tokens: 12,
      messages: [{ role: 'user', content: 'Tell me a story' }],
    });
    let text = '';
    let chunks = 0;
    let usage: OpenAI.CompletionUsage | undefined | null;
    let usageChunks = 0;
    for await (const chunk of stream) {
      chunks++;
      if (chunk.usage) { usage = chunk.usage; usageChunks++; }
      text += chunk.choices[0]?.delta?.content ?? '';
    }
    expect(chunks).toBeGreaterThan(12);
    expect(text.split(/\s+/).filter(Boolean).length).toBe(12);
    expect(usageChunks).toBe(1);
    expect(usage?.completion_tokens).toBe(12);
    expect(usage?.prompt_tokens).toBeGreaterThan(0);
  });

  test('streams through an engine backend (moonji engine over one WebSocket) like through any other', async () => {
    const stream = await client.chat.completions.create({
      model: 'moonji-engine', stream: true, stream_options: { include_usage: true }, max_tokens: 9,
      messages: [{ role: 'user', content: 'Tell me a story' }],
    });
    let text = '';
    let usage: OpenAI.CompletionUsage | undefined | null;
    let finish: string | null | undefined;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      text += chunk.choices[0]?.delta?.content ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    expect(text.split(/\s+/).filter(Boolean).length).toBe(9);
    expect(usage?.completion_tokens).toBe(9);
    expect(finish).toBe('length');
    const whole = await client.chat.completions.create({
      model: 'moonji-engine', max_tokens: 4, messages: [{ role: 'user', content: 'Hi' }],
    });
    expect(whole.usage?.completion_tokens).toBe(4);
    expect(whole.choices[0].message.content?.split(/\s+/).filter(Boolean).length).toBe(4);
  });

  test('streams without include_usage: the gateway strips the usage chunk it asked for', async () => {
    const stream = await client.chat.completions.create({
      model: 'moonji-demo', stream: true, max_tokens: 5, messages: [{ role: 'user', content: 'Hi' }],
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
    const { data, response } = await client.chat.completions.create({
      model: 'moonji-demo', max_tokens: 7, messages: [{ role: 'user', content: 'Hello there' }],
    }).withResponse();
    expect(data.choices[0].message.content?.split(/\s+/).filter(Boolean).length).toBe(7);
    expect(data.usage?.completion_tokens).toBe(7);
    expect(response.headers.get('x-inference-id')).toMatch(/^inf_[0-9a-z]{26}$/);
  });

  test('errors map to the SDK error classes', async () => {
    await expect(client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] }))
      .rejects.toBeInstanceOf(OpenAI.NotFoundError);
    const bad = new OpenAI({ apiKey: 'mj-not-a-real-key-at-all-000000000', baseURL: `${baseURL}/v1`, maxRetries: 0 });
    await expect(bad.chat.completions.create({ model: 'moonji-demo', messages: [{ role: 'user', content: 'x' }] }))
      .rejects.toBeInstanceOf(OpenAI.AuthenticationError);
    // An engine failure is relayed with its status.
    const failing = client.chat.completions.create({
      model: 'moonji-demo', messages: [{ role: 'user', content: 'x' }],
      // @ts-expect-error: a mock-engine knob, passed through like any unknown field
      mock: { fail_status: 500, fail_message: 'engine exploded' },
    });
    await expect(failing).rejects.toBeInstanceOf(OpenAI.InternalServerError);
    await expect(failing).rejects.toHaveProperty('message', expect.stringContaining('engine exploded'));
  });

  test('aborting a stream ends it on the client side', async () => {
    const controller = new AbortController();
    const stream = await client.chat.completions.create({
      model: 'moonji-demo', stream: true, max_tokens: 500, messages: [{ role: 'user', content: 'long' }],
    }, { signal: controller.signal });
    let n = 0;
    for await (const chunk of stream) {
      if (chunk.choices[0]?.delta?.content) n++;
      if (n === 3) controller.abort();
    }
    // The SDK's loop ends quietly after abort (see field notes). A chunk
    // that arrived in the same read as the third may still be yielded; the
    // answer's 500 tokens are not.
    expect(controller.signal.aborted).toBe(true);
    expect(n).toBeGreaterThanOrEqual(3);
    expect(n).toBeLessThan(20);
  });

  test('a stop through /v1/inferences/{id}/cancel ends the SDK stream cleanly, with usage', async () => {
    const { data: stream, response } = await client.chat.completions.create({
      model: 'moonji-demo', stream: true, stream_options: { include_usage: true }, max_tokens: 2000,
      messages: [{ role: 'user', content: 'a long story' }],
    }).withResponse();
    const id = response.headers.get('x-inference-id');
    expect(id).toMatch(/^inf_/);
    let content = 0;
    let usage: OpenAI.CompletionUsage | undefined | null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      if (!chunk.choices[0]?.delta?.content) continue;
      content++;
      if (content === 5) {
        const r = await fetch(`${baseURL}/v1/inferences/${id}/cancel`, {
          method: 'POST', headers: { Authorization: `Bearer ${client.apiKey}` },
        });
        expect(r.status).toBe(200);
        expect(await r.json()).toMatchObject({ inference_id: id, state: 'stopped', acknowledged: true });
      }
    }
    // The loop ended normally ([DONE]) long before 2,000 tokens, and the
    // usage chunk counts exactly the chunks the SDK delivered.
    expect(content).toBeLessThan(2000);
    expect(usage?.completion_tokens).toBe(content);
  });
});
