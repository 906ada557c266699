import { execFileSync } from 'node:child_process';
import { expect, test } from '@playwright/test';
import OpenAI from 'openai';
import { baseURL, gatewayConfig } from '../../playwright.engine.config';

// Helpers of the real-engine suite (playwright.engine.config.ts): the same
// real CLI and the same SDKs as the default suite, against the gateway that
// fronts a real Ollama.

export { baseURL };

// The public model names (e2e/engine-real/moonji.yaml): the same Ollama model
// `tiny` behind a backend declared with all four APIs (passthrough) and one
// declared chat-only (Responses translated).
export const ALL_APIS = 'real-tiny';
export const CHAT_ONLY = 'real-tiny-chat';

// createKey issues an API key with the real CLI, against the gateway's
// database.
export function createKey(owner: string, name: string): string {
  const out = execFileSync('bin/moonji', ['keys', 'create', '--config', gatewayConfig, '--owner', owner, '--name', name],
    { encoding: 'utf8' });
  const lines = out.trim().split('\n');
  if (lines.length !== 1 || !lines[0].startsWith('mj-')) {
    throw new Error(`keys create printed ${JSON.stringify(out)}`);
  }
  return lines[0];
}

// usageRow is the ledger's row of one request, read with `moonji usage export`.
export function usageRow(inferenceID: string): Record<string, any> | undefined {
  const out = execFileSync('bin/moonji', ['usage', 'export', '--config', gatewayConfig, '--format', 'jsonl'],
    { encoding: 'utf8', maxBuffer: 64 << 20 });
  return out.split('\n').filter(Boolean).map((l) => JSON.parse(l)).find((r) => r.inference_id === inferenceID);
}

// finishedRow waits for the request's row to leave "pending" and returns it.
export async function finishedRow(inferenceID: string): Promise<Record<string, any>> {
  let row: Record<string, any> | undefined;
  await expect.poll(() => { row = usageRow(inferenceID); return row?.outcome; }, { timeout: 15_000 })
    .not.toMatch(/^(pending)?$/);
  return row!;
}

// recording returns a fetch that remembers the last X-Inference-Id seen, so
// that a test can stop a request an SDK made.
export function recording() {
  const seen: { id: string | null } = { id: null };
  const f: typeof fetch = async (input, init) => {
    const r = await fetch(input, init);
    seen.id = r.headers.get('x-inference-id');
    return r;
  };
  return { seen, fetch: f };
}

export function client(key: string, f?: typeof fetch): OpenAI {
  return new OpenAI({ apiKey: key, baseURL: `${baseURL}/v1`, maxRetries: 0, ...(f ? { fetch: f } : {}) });
}

// stop is Moonji's Stop for a program: POST /v1/inferences/{id}/cancel. It
// returns the state: "stopped" when it landed mid-answer, or the outcome the
// request had already finished with (the tiny model can reach its end of
// story before the stop arrives).
export async function stop(key: string, id: string | null): Promise<string> {
  expect(id).toMatch(/^inf_[0-9a-z]{26}$/);
  const r = await fetch(`${baseURL}/v1/inferences/${id}/cancel`, {
    method: 'POST', headers: { Authorization: `Bearer ${key}` },
  });
  expect(r.status).toBe(200);
  const body = await r.json();
  expect(body).toMatchObject({ inference_id: id, acknowledged: true });
  return body.state;
}

// untilLanded runs attempt until it reports that what it tested (a stop, an
// abort) landed mid-answer, at most `tries` times: the tiny model writes
// ~1,700 tokens/s and ends its stories on its own, so a stop sent after the
// first delta can come after the end. Every attempt makes its own
// assertions, landed or not; the test fails if none landed.
export async function untilLanded(what: string, tries: number, attempt: (n: number) => Promise<boolean>) {
  for (let n = 1; n <= tries; n++) {
    if (await attempt(n)) {
      test.info().annotations.push({ type: 'landed', description: `${what}: on attempt ${n} of ${tries}` });
      return;
    }
  }
  throw new Error(`${what}: in ${tries} attempts the model always finished before it landed`);
}

// textOf is a response's text, from its message items (openai-node 6.30's
// finalResponse() fills output_text only for structured outputs).
export function textOf(r: OpenAI.Responses.Response): string {
  return r.output.flatMap((item) => (item.type === 'message' ? item.content : []))
    .map((part) => (part.type === 'output_text' ? part.text : '')).join('');
}

// A prompt the model continues as a story.
export const STORY = 'Once upon a time';
