import { test, expect, type Page } from '@playwright/test';
import AxeBuilder from '@axe-core/playwright';
import { adminEmail, signIn } from './helpers';

// Share links: made from a conversation's Share button, opened by a
// signed-out browser (e2e/moonji.e2e.yaml sets share.public), revoked on
// /shares, then 404. Each view is looked at in light, dark and at a
// phone's width, with an axe scan.

const modes = [
  { name: 'light', colorScheme: 'light' as const, width: 1280 },
  { name: 'dark', colorScheme: 'dark' as const, width: 1280 },
  { name: 'phone', colorScheme: 'light' as const, width: 390 },
];

// look screenshots the page as it is in each mode, checks it with axe and,
// on the phone, that nothing scrolls sideways.
async function look(page: Page, name: string) {
  for (const mode of modes) {
    await page.setViewportSize({ width: mode.width, height: 800 });
    await page.emulateMedia({ colorScheme: mode.colorScheme });
    await page.screenshot({ path: `test-results/screenshots/${name}-${mode.name}.png` });
    const bad = (await new AxeBuilder({ page }).analyze()).violations.filter((v) => v.impact === 'serious' || v.impact === 'critical');
    expect(bad.map((v) => `${v.id}: ${v.help} (${v.nodes.map((n) => n.target.join(' ')).join(', ')})`), `${name} in ${mode.name}`).toEqual([]);
    if (mode.name === 'phone') {
      const sideways = await page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
      expect(sideways, `${name} scrolls sideways on a phone`).toBeLessThanOrEqual(0);
    }
  }
  await page.setViewportSize({ width: 1280, height: 800 });
  await page.emulateMedia({ colorScheme: 'light' });
}

test('a share link: made with the Share button, opened signed out, revoked on /shares, then 404', async ({ page, browser }) => {
  test.setTimeout(90_000);
  await signIn(page);
  const message = page.getByRole('textbox', { name: 'Message' });
  await page.getByLabel('Model').selectOption('moonji-demo');
  await message.fill('/echo Lighthouses keep **ships** off the rocks.');
  await message.press('Enter');
  await expect(page).toHaveURL(/\/c\/c_[0-9a-z]+$/);
  const answer = page.locator('article[data-role="assistant"]').last();
  await expect(answer).toHaveAttribute('data-status', 'done');

  await page.getByRole('button', { name: 'Share' }).click();
  await page.getByLabel('Expires').selectOption({ label: 'In 7 days' });
  await expect(page.getByLabel(/Show my name/)).not.toBeChecked();
  await page.getByRole('button', { name: 'Create link' }).click();
  await expect(page.getByRole('status')).toContainText('Link created');
  const url = await page.getByLabel('Link', { exact: true }).inputValue();
  expect(url).toMatch(/\/s\/[A-Za-z0-9_-]{22}$/);
  await look(page, 'share-panel');

  // Later messages are not in the link's copy.
  await message.fill('/echo Written after the link.');
  await message.press('Enter');
  await expect(page.locator('article[data-role="assistant"]').last()).toContainText('Written after the link.');

  // A browser that has never signed in opens it.
  const outside = await browser.newContext();
  const visitor = await outside.newPage();
  const opened = await visitor.goto(url);
  expect(opened!.status()).toBe(200);
  expect(opened!.headers()['x-robots-tag']).toBe('noindex');
  expect(opened!.headers()['content-security-policy']).toContain("script-src 'none'");
  await expect(visitor.getByRole('heading', { level: 1 })).toHaveText('/echo Lighthouses keep **ships** off the rocks.');
  await expect(visitor.locator('.answer strong')).toHaveText('ships');
  await expect(visitor.getByText('Written after the link.')).toHaveCount(0);
  await expect(visitor.getByText(adminEmail)).toHaveCount(0);
  expect(await visitor.locator('script').count()).toBe(0);
  await look(visitor, 'share-page');

  // The person's links, and Revoke.
  await page.goto('/shares');
  const token = url.split('/s/')[1];
  const item = page.locator(`#share-${token}`);
  await expect(item).toContainText('Lighthouses keep');
  await expect(item).toContainText('expires');
  expect(await item.getByRole('textbox').inputValue()).toBe(url);
  await look(page, 'shares-page');
  await item.getByRole('button', { name: 'Revoke' }).click();
  await expect(page.getByRole('status')).toContainText('Revoked');
  await expect(page.locator(`#share-${token}`)).toHaveCount(0);

  const gone = await visitor.goto(url);
  expect(gone!.status()).toBe(404);
  await expect(visitor.getByRole('heading', { name: 'Not found' })).toBeVisible();
  await visitor.screenshot({ path: 'test-results/screenshots/share-revoked-light.png' });
  await outside.close();
});
