import { test, expect } from '@playwright/test';
import OpenAI from 'openai';
import { createOpenAI } from '@ai-sdk/openai';
import { streamText } from 'ai';
import { baseURL } from '../playwright.config';
import { createKey, recording } from './helpers';

// A stopped stream must end as a complete one, so that the SDK helpers that
// assemble a whole completion from it end cleanly: openai-node's
// chat.completions.stream(...).finalChatCompletion() rejects a stream with
// no finish_reason ("missing finish_reason for choice 0") or no chunk at all,
// and the Vercel AI SDK's streamText reports an error part.

async function cancel(key: string, id: string | null) {
  expect(id).toMatch(/^inf_/);
  const r = await fetch(`${baseURL}/v1/inferences/${id}/cancel`, {
    method: 'POST', headers: { Authorization: `Bearer ${key}` },
  });
  expect(r.status).toBe(200);
  expect(await r.json()).toMatchObject({ state: 'stopped', acknowledged: true });
}

test.describe('SDK helpers after a stop', () => {
  let key: string;
  test.beforeAll(() => { key = createKey('helpers@localhost', 'helpers'); });

  test('openai-node finalChatCompletion() ends cleanly after a stop mid-stream', async () => {
    const rec = recording();
    const client = new OpenAI({ apiKey: key, baseURL: `${baseURL}/v1`, maxRetries: 0, fetch: rec.fetch });
    const stream = client.chat.completions.stream({
      model: 'moonji-demo', stream_options: { include_usage: true },
      messages: [{ role: 'user', content: 'a long story' }],
      // @ts-expect-error: a mock-engine knob, passed through like any unknown field
      mock: { tps: 40, tokens: 2000 },
    });
    let deltas = 0;
    let stopped: Promise<void> | undefined;
    stream.on('content', () => {
      deltas++;
      if (deltas === 4) stopped = cancel(key, rec.seen.id);
    });
    const final = await stream.finalChatCompletion();
    await stopped;
    expect(final.choices[0].finish_reason).toBe('stop');
    expect(final.choices[0].message.role).toBe('assistant');
    expect(final.id).toMatch(/^chatcmpl-/);
    expect(final.created).toBeGreaterThan(1_700_000_000);
    expect(final.choices[0].message.content?.length).toBeGreaterThan(0);
    expect(final.usage?.completion_tokens).toBeGreaterThanOrEqual(4);
    expect(final.usage?.completion_tokens).toBeLessThan(100);
    expect(final.usage?.prompt_tokens).toBeGreaterThan(0);
  });

  test('openai-node finalChatCompletion() ends cleanly after a stop before the first token', async () => {
    const rec = recording();
    const client = new OpenAI({ apiKey: key, baseURL: `${baseURL}/v1`, maxRetries: 0, fetch: rec.fetch });
    const stream = client.chat.completions.stream({
      model: 'moonji-demo', messages: [{ role: 'user', content: 'x' }],
      // @ts-expect-error: a mock-engine knob
      mock: { ttft_ms: 20000 },
    });
    const final = stream.finalChatCompletion();
    await expect.poll(() => rec.seen.id).toMatch(/^inf_/);
    await new Promise((r) => setTimeout(r, 200));
    await cancel(key, rec.seen.id);
    const done = await final;
    expect(done.choices[0].finish_reason).toBe('stop');
    expect(done.choices[0].message.content ?? '').toBe('');
    expect(done.id).toBe(`chatcmpl-${rec.seen.id}`);
  });

  test('Vercel AI SDK streamText ends with finishReason stop and no error after a stop', async () => {
    const rec = recording({ mock: { tps: 40, tokens: 2000 } });
    const provider = createOpenAI({ apiKey: key, baseURL: `${baseURL}/v1`, fetch: rec.fetch });
    const errors: unknown[] = [];
    const result = streamText({
      model: provider.chat('moonji-demo'),
      prompt: 'a long story',
      maxRetries: 0,
      onError: ({ error }) => { errors.push(error); },
    });
    let deltas = 0;
    let stopped: Promise<void> | undefined;
    const parts: string[] = [];
    for await (const part of result.fullStream) {
      parts.push(part.type);
      if (part.type === 'text-delta') {
        deltas++;
        if (deltas === 4) stopped = cancel(key, rec.seen.id);
      }
    }
    await stopped;
    expect(errors).toEqual([]);
    expect(parts).not.toContain('error');
    expect(await result.finishReason).toBe('stop');
    expect((await result.text).length).toBeGreaterThan(0);
    expect(deltas).toBeLessThan(100); // the stop took hold at once (40 tokens/s)
  });
});
