import { test, expect } from '@playwright/test';
import OpenAI from 'openai';
import { baseURL } from '../playwright.config';

// A person signs in through the embedded provider's form, creates a key on
// /keys, reads it once, uses it with the official openai SDK, revokes it,
// and the next call fails with 401.
test('sign in, create a key, use it with the SDK, revoke it', async ({ page, context }) => {
  await context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: baseURL });
  await page.goto('/');
  await page.getByRole('link', { name: 'Sign in' }).first().click();

  // The embedded provider's form (the same relying-party path as a real provider).
  await expect(page).toHaveURL(/\/idp\/login\?/);
  await page.getByLabel('Email').fill('admin@localhost');
  await page.getByLabel('Password').fill('e2e-admin-password');
  await page.getByRole('button', { name: 'Sign in' }).click();

  await expect(page.locator('#whoami')).toHaveText('admin@localhost');
  await page.getByRole('banner').getByRole('link', { name: 'Keys', exact: true }).click();
  await expect(page).toHaveURL(/\/keys$/);

  await page.getByLabel('Name').fill('e2e-sdk');
  await page.getByRole('button', { name: 'Create key' }).click();
  const secretBox = page.locator('#new-key-secret');
  await expect(secretBox).toBeVisible();
  const secret = await secretBox.inputValue();
  expect(secret).toMatch(/^mj-[A-Za-z0-9_-]{43}$/);

  const copy = page.getByRole('button', { name: 'Copy' });
  await copy.click();
  await expect.poll(() => page.evaluate(() => navigator.clipboard.readText())).toBe(secret);

  // Shown once: a reload lists the key by its prefix only.
  await page.reload();
  await expect(page.locator('#new-key-secret')).toHaveCount(0);
  expect(await page.content()).not.toContain(secret);
  const row = page.locator('tr', { hasText: 'e2e-sdk' });
  await expect(row).toContainText(secret.slice(0, 11));
  await expect(row).toHaveAttribute('data-status', 'active');

  const client = new OpenAI({ apiKey: secret, baseURL: `${baseURL}/v1`, maxRetries: 0 });
  const answer = await client.chat.completions.create({
    model: 'moonji-demo', max_tokens: 3, messages: [{ role: 'user', content: 'Hello' }],
  });
  expect(answer.choices[0].message.content?.length).toBeGreaterThan(0);

  page.once('dialog', (dialog) => dialog.accept());
  await row.getByRole('button', { name: 'Revoke' }).click();
  await expect(row).toHaveAttribute('data-status', 'revoked');

  const failed = client.chat.completions.create({
    model: 'moonji-demo', max_tokens: 3, messages: [{ role: 'user', content: 'Hello again' }],
  });
  await expect(failed).rejects.toBeInstanceOf(OpenAI.AuthenticationError);
  await expect(failed).rejects.toMatchObject({ status: 401 });

  // Logging out ends the session: /keys asks to sign in again.
  await page.getByRole('button', { name: 'Log out' }).click();
  await expect(page.getByRole('link', { name: 'Sign in' }).first()).toBeVisible();
  await page.goto('/keys');
  await expect(page).toHaveURL(/\/idp\/login\?/);
});
