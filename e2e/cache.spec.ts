import { test, expect, type Page } from '@playwright/test';
import { csrf, signIn } from './helpers';

// A returning visitor downloads the page and nothing else: every script and
// stylesheet is named by a URL carrying its content hash and kept a year
// (immutable), so the browser takes it from its cache without asking.

type Loaded = { path: string; transferSize: number; encodedBodySize: number; decodedBodySize: number };

// loaded is what the browser's resource timing says of the page's static
// files: transferSize 0 means it came from the cache, not the network.
async function loaded(page: Page): Promise<Loaded[]> {
  return page.evaluate(() => performance.getEntriesByType('resource')
    .map((e) => e as PerformanceResourceTiming)
    .filter((e) => new URL(e.name).pathname.startsWith('/static/'))
    .map((e) => ({ path: new URL(e.name).pathname, transferSize: e.transferSize,
      encodedBodySize: e.encodedBodySize, decodedBodySize: e.decodedBodySize })));
}

// named are the stylesheets and scripts the page's markup names.
async function named(page: Page): Promise<string[]> {
  return page.evaluate(() => [...document.querySelectorAll('link[rel="stylesheet"], script[src]')]
    .map((el) => new URL((el as HTMLLinkElement).href || (el as HTMLScriptElement).src).pathname));
}

test('a second visit to a chat page fetches no static file', async ({ page }) => {
  // The first visit, with an empty cache: every file comes over the
  // network, compressed, from a hashed URL.
  await page.goto('/');
  const first = await loaded(page);
  expect(first.length).toBeGreaterThanOrEqual(4);
  expect(first.map((f) => f.path).sort()).toEqual((await named(page)).sort());
  for (const f of first) {
    expect(f.path, 'a hashed URL').toMatch(/\.[0-9a-f]{10}\.(css|js)$/);
    expect(f.transferSize, `${f.path} came over the network`).toBeGreaterThan(0);
    expect(f.encodedBodySize, `${f.path} came compressed`).toBeLessThan(f.decodedBodySize);
  }

  await signIn(page);
  const headers = { 'X-CSRF-Token': await csrf(page) };
  const ids: string[] = [];
  for (const _ of [1, 2]) {
    const created = await page.request.post('/api/v1/conversations', { headers, data: { model: 'moonji-demo' } });
    expect(created.status()).toBe(201);
    ids.push((await created.json()).id);
  }
  for (const id of ids) {
    await page.goto(`/c/${id}`);
    const files = await loaded(page);
    expect(files.map((f) => f.path).sort(), 'resource timing sees every file the page names')
      .toEqual((await named(page)).sort());
    expect(files.filter((f) => f.path.includes('dashboard') || f.path.includes('chart')), 'no dashboard files on the chat').toEqual([]);
    expect(files.filter((f) => f.transferSize > 0).map((f) => f.path), `files fetched again for /c/${id}`).toEqual([]);
  }
  // The chat still works with its files from the cache (htmx loaded).
  await expect(page.getByRole('textbox').first()).toBeVisible();
  expect(await page.evaluate(() => typeof (window as unknown as { htmx?: unknown }).htmx)).toBe('object');
});
