import { test, expect, type Page } from '@playwright/test';
import AxeBuilder from '@axe-core/playwright';
import { signIn, adminEmail } from './helpers';

// The audit log (/admin/audit) against the e2e server: an admin makes a
// key on /keys, finds its key.create event (with who, what and from where,
// never the secret), filters the log down to it, downloads it, and the page
// looks right in light, dark and on a 390 px phone (axe, no sideways
// scroll). The database is shared with other specs: the key's name is
// unique to this run.

const modes = [
  { name: 'light', colorScheme: 'light' as const, width: 1280, height: 800 },
  { name: 'dark', colorScheme: 'dark' as const, width: 1280, height: 800 },
  { name: 'phone', colorScheme: 'light' as const, width: 390, height: 844 },
];

async function look(page: Page, name: string, url: string) {
  for (const mode of modes) {
    await page.setViewportSize({ width: mode.width, height: mode.height });
    await page.emulateMedia({ colorScheme: mode.colorScheme });
    await page.goto(url);
    await page.screenshot({ path: `test-results/screenshots/${name}-${mode.name}.png`, fullPage: true });
    const results = await new AxeBuilder({ page }).analyze();
    const bad = results.violations.filter((v) => v.impact === 'serious' || v.impact === 'critical');
    expect(bad.map((v) => `${v.id}: ${v.help} (${v.nodes.map((n) => n.target.join(' ')).join(', ')})`),
      `${name} in ${mode.name}`).toEqual([]);
    if (mode.name === 'phone') {
      const sideways = await page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
      expect(sideways, `${name} scrolls sideways on a phone`).toBeLessThanOrEqual(0);
    }
  }
}

test('a key made on /keys shows in the audit log, filtered, downloaded; the page looks right', async ({ page }) => {
  test.setTimeout(120_000);
  await signIn(page, '/keys');
  const name = `e2e-audit-${Date.now()}`;
  await page.goto('/keys');
  await page.getByLabel('Name').fill(name);
  await page.getByRole('button', { name: 'Create key' }).click();
  const secret = await page.locator('#new-key-secret').inputValue();
  expect(secret).toMatch(/^mj-/);

  // The admin nav leads there; the newest events first, the key's among them.
  await page.goto('/admin');
  await page.getByRole('navigation', { name: 'Admin' }).getByRole('link', { name: 'Audit log' }).click();
  await expect(page).toHaveURL(/\/admin\/audit$/);
  await expect(page.getByRole('heading', { name: 'Audit log' })).toBeVisible();
  const row = page.locator('#audit tbody tr', { hasText: name });
  await expect(row).toHaveCount(1);
  await expect(row).toHaveAttribute('data-action', 'key.create');
  await expect(row).toContainText(adminEmail);
  await expect(row).toContainText('127.0.0.1');
  expect(await page.content()).not.toContain(secret);

  // Filter: the action and the key's name as target.
  await page.getByLabel('Action').selectOption('key.create');
  await page.getByLabel('Target').fill(name);
  await page.getByRole('button', { name: 'Filter' }).click();
  await expect(page).toHaveURL(/action=key\.create/);
  await expect(page.locator('#audit tbody tr')).toHaveCount(1);
  await expect(page.locator('#audit tbody tr')).toContainText(name);
  // Another action finds nothing of it.
  await page.getByLabel('Action').selectOption('team.delete');
  await page.getByRole('button', { name: 'Filter' }).click();
  await expect(page.locator('#audit tbody tr', { hasText: name })).toHaveCount(0);

  // The download, with the filter: a CSV with the event, without the secret.
  await page.getByLabel('Action').selectOption('key.create');
  await page.getByRole('button', { name: 'Filter' }).click();
  const [download] = await Promise.all([page.waitForEvent('download'), page.getByRole('link', { name: 'Download CSV' }).click()]);
  expect(download.suggestedFilename()).toMatch(/^moonji-audit-.*\.csv$/);
  const csv = await (await download.createReadStream()).toArray().then((b) => Buffer.concat(b).toString('utf8'));
  expect(csv.split('\n')[0]).toBe('id,at,action,actor_id,actor,key_id,target,address,detail');
  expect(csv).toContain(name);
  expect(csv).not.toContain(secret);

  // A hostile filter is refused with a sentence.
  const resp = await page.goto('/admin/audit?from=not-a-date');
  expect(resp?.status()).toBe(400);
  await expect(page.getByRole('alert')).toContainText('must be a date');

  await look(page, 'audit', '/admin/audit');
  await look(page, 'audit-filtered', `/admin/audit?action=key.create&target=${encodeURIComponent(name)}`);
});
