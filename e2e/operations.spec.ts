import { test, expect } from '@playwright/test';
import AxeBuilder from '@axe-core/playwright';
import OpenAI from 'openai';
import { baseURL } from '../playwright.config';
import { signIn } from './helpers';

// Issue 47 from a browser and from programs: an admin reloads the
// configuration from /admin (and the audit log says so); an admin makes an
// admin-scoped key on /keys, manages inference keys with it through
// /api/v1/admin/keys, and the official openai SDK finds each key where its
// scope says: the inference key answers on /v1, the admin key is refused
// there, a revoked key is refused.

test('the reload button reloads this replica and is audited', async ({ page }) => {
  await signIn(page, '/admin');
  await page.goto('/admin');
  const version = (await page.locator('#config-version').textContent())?.trim();
  expect(version).toMatch(/^[0-9a-f]{12}$/);

  await page.getByRole('button', { name: 'Reload the configuration file' }).click();
  // The same file: the same version, nothing changed.
  await expect(page.getByText(`Configuration reloaded: ${version} → ${version}.`)).toBeVisible();
  await expect(page.locator('#config-version')).toHaveText(version!);
  await expect(page.locator('#replica-versions')).toContainText(version!);
  const ready = await (await page.request.get('/readyz')).json();
  expect(ready.config_version).toBe(version);

  for (const mode of [{ name: 'light', w: 1280, h: 800, scheme: 'light' as const },
    { name: 'dark', w: 1280, h: 800, scheme: 'dark' as const },
    { name: 'phone', w: 390, h: 844, scheme: 'light' as const }]) {
    await page.setViewportSize({ width: mode.w, height: mode.h });
    await page.emulateMedia({ colorScheme: mode.scheme });
    await page.goto('/admin#config');
    await page.locator('#config').screenshot({ path: `test-results/screenshots/admin-config-${mode.name}.png` });
    const results = await new AxeBuilder({ page }).include('#config').analyze();
    const bad = results.violations.filter((v) => v.impact === 'serious' || v.impact === 'critical');
    expect(bad.map((v) => `${v.id}: ${v.help}`), `config section in ${mode.name}`).toEqual([]);
    if (mode.name === 'phone') {
      const sideways = await page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
      expect(sideways).toBeLessThanOrEqual(0);
    }
  }

  await page.goto('/admin/audit?action=config.reload');
  await expect(page.locator('#audit tbody tr[data-action="config.reload"]').first()).toContainText(`${version} → ${version}`);
});

test('an admin-scoped key manages keys by API; each key works only where its scope says', async ({ page }) => {
  await signIn(page, '/keys');
  await page.goto('/keys');
  await page.getByLabel('Name').fill(`e2e-admin-scope-${Date.now()}`);
  await page.getByLabel('Scope').selectOption('admin');
  await page.getByRole('button', { name: 'Create key' }).click();
  const adminKey = await page.locator('#new-key-secret').inputValue();
  expect(adminKey).toMatch(/^mj-/);

  const api = (method: string, path: string, data?: unknown) => page.request.fetch(`/api/v1/admin/keys${path}`, {
    method, data, headers: { Authorization: `Bearer ${adminKey}` },
  });
  // Create an inference key for the admin (the secret, once).
  const created = await api('POST', '', { owner: 'admin@localhost', name: `e2e-by-api-${Date.now()}`, rpm: 30, models: ['moonji-demo'] });
  expect(created.status()).toBe(201);
  const key = await created.json();
  expect(key.key).toMatch(/^mj-/);
  expect(key.scope).toBe('inference');
  const got = await (await api('GET', `/${key.id}`)).json();
  expect(got.id).toBe(key.id);
  expect(got.key).toBeUndefined();

  // The official SDK: the new inference key answers on /v1 …
  const sdk = new OpenAI({ apiKey: key.key, baseURL: `${baseURL}/v1`, maxRetries: 0 });
  const answer = await sdk.chat.completions.create({ model: 'moonji-demo', messages: [{ role: 'user', content: 'hi' }] });
  expect(answer.choices[0].message.content?.length).toBeGreaterThan(0);
  // … its model list applies …
  await expect(sdk.chat.completions.create({ model: 'moonji-slow', messages: [{ role: 'user', content: 'hi' }] }))
    .rejects.toBeInstanceOf(OpenAI.APIError);
  // … the admin key is refused there …
  const asAdmin = new OpenAI({ apiKey: adminKey, baseURL: `${baseURL}/v1`, maxRetries: 0 });
  await expect(asAdmin.chat.completions.create({ model: 'moonji-demo', messages: [{ role: 'user', content: 'hi' }] }))
    .rejects.toBeInstanceOf(OpenAI.PermissionDeniedError);
  // … and the inference key on the admin API.
  const wrong = await page.request.get('/api/v1/admin/keys', { headers: { Authorization: `Bearer ${key.key}` } });
  expect(wrong.status()).toBe(403);
  expect((await wrong.json()).error.code).toBe('insufficient_scope');

  // Revoked by API: the SDK's next call is refused.
  expect((await api('DELETE', `/${key.id}`)).ok()).toBe(true);
  await expect(sdk.chat.completions.create({ model: 'moonji-demo', messages: [{ role: 'user', content: 'hi' }] }))
    .rejects.toBeInstanceOf(OpenAI.AuthenticationError);

  // The OpenAPI description is served by the binary.
  const spec = await (await page.request.get('/api/v1/admin/openapi.json')).json();
  expect(spec.openapi).toMatch(/^3\.1/);
  expect(Object.keys(spec.paths)).toContain('/api/v1/admin/keys');
});
