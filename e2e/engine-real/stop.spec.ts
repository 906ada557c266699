import { test, expect } from '@playwright/test';
import OpenAI from 'openai';
import { createOpenAI } from '@ai-sdk/openai';
import { streamText } from 'ai';
import {
  ALL_APIS, CHAT_ONLY, STORY, baseURL, client, createKey, finishedRow, recording, stop, textOf, untilLanded,
} from './helpers';

// Ending a real engine's answer early: a client that aborts (the gateway
// cancels the engine's work and records "cancelled"), and Moonji's Stop
// (POST /v1/inferences/{id}/cancel), after which the SDK helpers that
// assemble a whole answer must still end cleanly.
//
// The tiny model writes ~1,700 tokens/s and usually ends its story by itself
// within a few hundred tokens, so each test asks for up to 2,000 tokens,
// acts on the first delta, and tries again (a few times at most) when the
// model had already finished: a stop that answers "success" proves nothing.

const TRIES = 8;
const LONG = 2000;

// metric is the value of one moonji_requests_total series.
async function requests(model: string, outcome: string): Promise<number> {
  const text = await (await fetch(`${baseURL}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(`moonji_requests_total{model="${model}",outcome="${outcome}"}`));
  return line ? Number(line.split(' ').pop()) : 0;
}

// inFlight is the number of requests holding a slot of the backend.
async function inFlight(backend: string): Promise<number> {
  const text = await (await fetch(`${baseURL}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(`moonji_backend_in_flight{backend="${backend}"}`));
  return line ? Number(line.split(' ').pop()) : NaN;
}

test.describe('abort and Stop against a real engine', () => {
  let key: string;
  test.beforeAll(() => { key = createKey('stop@engine', 'engine-stop'); });

  test('aborting a stream mid-way: the row says cancelled and the engine slot is freed', async () => {
    const before = await requests(ALL_APIS, 'cancelled');
    let cancelled = 0;
    await untilLanded('abort', TRIES, async () => {
      const rec = recording();
      const c = client(key, rec.fetch);
      const controller = new AbortController();
      const stream = await c.chat.completions.create({
        model: ALL_APIS, stream: true, max_tokens: LONG, messages: [{ role: 'user', content: STORY }],
      }, { signal: controller.signal });
      let deltas = 0;
      for await (const chunk of stream) {
        if (chunk.choices[0]?.delta?.content) deltas++;
        if (deltas === 1) controller.abort();
      }
      // openai-node's loop ends quietly after abort (see the field notes).
      expect(controller.signal.aborted).toBe(true);
      const row = await finishedRow(rec.seen.id!);
      // Either the gateway saw the client leave mid-answer, or the model
      // had already written its whole (short) story.
      expect(['cancelled', 'success']).toContain(row.outcome);
      if (row.outcome !== 'cancelled') return false;
      cancelled++;
      expect(row).toMatchObject({ model: ALL_APIS, backend: 'ollama', reason: 'client_disconnected' });
      expect(row.prompt_tokens).toBeGreaterThan(0);
      expect(row.completion_tokens).toBeLessThan(LONG);
      return true;
    });
    await expect.poll(() => requests(ALL_APIS, 'cancelled')).toBe(before + cancelled);
    // The engine slot (max_concurrency 1) is free again: nothing holds it,
    // and the next request is served at once instead of waiting in the queue.
    await expect.poll(() => inFlight('ollama')).toBe(0);
    const t0 = Date.now();
    const next = await client(key).chat.completions.create({ model: ALL_APIS, max_tokens: 8, messages: [{ role: 'user', content: STORY }] });
    expect(next.choices[0].message.content?.length).toBeGreaterThan(0);
    expect(Date.now() - t0).toBeLessThan(5_000);
  });

  test('Stop mid-stream: finalChatCompletion() ends cleanly, the row says stopped', async () => {
    await untilLanded('stop (chat)', TRIES, async () => {
      const rec = recording();
      const s = client(key, rec.fetch).chat.completions.stream({
        model: ALL_APIS, max_tokens: LONG, stream_options: { include_usage: true },
        messages: [{ role: 'user', content: STORY }],
      });
      let deltas = 0;
      let state: Promise<string> | undefined;
      s.on('content', () => {
        deltas++;
        if (deltas === 1) state = stop(key, rec.seen.id);
      });
      const final = await s.finalChatCompletion();
      expect(state).toBeDefined();
      const st = await state!;
      expect(final.choices[0].message.role).toBe('assistant');
      expect(final.choices[0].message.content?.length).toBeGreaterThan(0);
      expect(final.usage?.completion_tokens).toBeGreaterThan(0);
      if (st !== 'stopped') {
        // The model had ended its story before the stop arrived.
        expect(st).toBe('success');
        return false;
      }
      // A stopped stream ends like a whole one: a finish_reason, usage
      // counting exactly the deltas the client got, and far fewer than asked.
      expect(final.choices[0].finish_reason).toBe('stop');
      expect(final.usage?.completion_tokens).toBe(deltas);
      expect(deltas).toBeLessThan(LONG);
      expect(await finishedRow(rec.seen.id!)).toMatchObject({ outcome: 'stopped', reason: 'stop_requested', completion_tokens: deltas });
      return true;
    });
  });

  test('Stop mid-stream: the Vercel AI SDK streamText ends with no error', async () => {
    await untilLanded('stop (AI SDK)', TRIES, async () => {
      const rec = recording();
      const provider = createOpenAI({ apiKey: key, baseURL: `${baseURL}/v1`, fetch: rec.fetch });
      const errors: unknown[] = [];
      const result = streamText({
        model: provider.chat(CHAT_ONLY), prompt: STORY, maxOutputTokens: LONG, maxRetries: 0,
        onError: ({ error }) => { errors.push(error); },
      });
      let deltas = 0;
      let state: Promise<string> | undefined;
      const parts: string[] = [];
      for await (const part of result.fullStream) {
        parts.push(part.type);
        if (part.type === 'text-delta' && ++deltas === 1) state = stop(key, rec.seen.id);
      }
      const st = await state!;
      expect(errors).toEqual([]);
      expect(parts).not.toContain('error');
      expect((await result.text).length).toBeGreaterThan(0);
      if (st !== 'stopped') { expect(st).toBe('success'); return false; }
      expect(await result.finishReason).toBe('stop');
      expect(deltas).toBeLessThan(LONG);
      expect(await finishedRow(rec.seen.id!)).toMatchObject({ outcome: 'stopped', reason: 'stop_requested', backend: 'ollama-chat' });
      return true;
    });
  });

  test('Stop mid-stream, Responses passed through: finalResponse() keeps what was delivered', async () => {
    await untilLanded('stop (responses, passthrough)', TRIES, async () => {
      const rec = recording();
      const s = client(key, rec.fetch).responses.stream({ model: ALL_APIS, input: STORY, max_output_tokens: LONG });
      let text = '';
      let deltas = 0;
      let state: Promise<string> | undefined;
      const types: string[] = [];
      s.on('event', (e) => { types.push(e.type); });
      s.on('response.output_text.delta', (e) => {
        text += e.delta;
        if (++deltas === 1) state = stop(key, rec.seen.id);
      });
      const final: OpenAI.Responses.Response = await s.finalResponse();
      const st = await state!;
      expect(textOf(final)).toBe(text);
      expect(text.length).toBeGreaterThan(0);
      if (st !== 'stopped') { expect(st).toBe('success'); return false; }
      // The engine's events, then the gateway's response.incomplete
      // (reason "stopped") in place of the engine's response.completed.
      expect(types[0]).toBe('response.created');
      expect(types).not.toContain('response.completed');
      expect(types[types.length - 1]).toBe('response.incomplete');
      expect(deltas).toBeLessThan(LONG);
      expect(await finishedRow(rec.seen.id!)).toMatchObject({ outcome: 'stopped', reason: 'stop_requested', backend: 'ollama' });
      return true;
    });
  });

  test('Stop mid-stream, Responses translated: finalResponse() is completed with the text delivered', async () => {
    await untilLanded('stop (responses, translated)', TRIES, async () => {
      const rec = recording();
      const s = client(key, rec.fetch).responses.stream({ model: CHAT_ONLY, input: STORY, max_output_tokens: LONG });
      let text = '';
      let deltas = 0;
      let state: Promise<string> | undefined;
      s.on('response.output_text.delta', (e) => {
        text += e.delta;
        if (++deltas === 1) state = stop(key, rec.seen.id);
      });
      const final = await s.finalResponse();
      const st = await state!;
      expect(final.id).toBe(`resp_${rec.seen.id}`);
      expect(textOf(final)).toBe(text);
      if (st !== 'stopped') { expect(st).toBe('success'); return false; }
      expect(final.status).toBe('completed');
      expect(final.usage?.output_tokens).toBe(deltas);
      expect(deltas).toBeLessThan(LONG);
      expect(await finishedRow(rec.seen.id!)).toMatchObject({ outcome: 'stopped', reason: 'stop_requested', backend: 'ollama-chat' });
      return true;
    });
  });
});
