import { test, expect, type Page } from '@playwright/test';
import AxeBuilder from '@axe-core/playwright';
import { csrf, signIn } from './helpers';

// Every page, looked at: a screenshot in light, dark and at a phone's width
// (test-results/screenshots/), an axe scan with no serious or critical
// violation, and no sideways scrolling on the phone.

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
    await page.waitForLoadState('networkidle', { timeout: 3000 }).catch(() => {}); // a streaming page never idles
    await page.screenshot({ path: `test-results/screenshots/${name}-${mode.name}.png`, fullPage: false });

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

test('every page: screenshots, accessibility, phone width', async ({ page }) => {
  test.setTimeout(90_000);
  await look(page, 'home-signed-out', '/');
  // The embedded provider's sign-in form (reached through /login).
  await page.goto('/login');
  await expect(page).toHaveURL(/\/idp\/login\?/);
  await look(page, 'sign-in', page.url().replace(/^https?:\/\/[^/]+/, ''));

  await signIn(page);
  const headers = { 'X-CSRF-Token': await csrf(page) };
  const created = await page.request.post('/api/v1/conversations', { headers, data: { model: 'moonji-demo' } });
  const { id } = await created.json();
  const markdown = '## A plan\n\nHere is **what to do**:\n\n1. Read the `config`\n2. Run it:\n\n```go\nfunc main() {\n\tfmt.Println("hello, a rather long line of code that must scroll inside its block and never the page")\n}\n```\n\n| step | time |\n|---|---|\n| one | 1 s |';
  await page.request.post(`/api/v1/conversations/${id}/messages`, { headers, data: { content: `/echo ${markdown}` } });
  await expect.poll(async () => (await (await page.request.get(`/api/v1/conversations/${id}`)).json()).messages[1].status).toBe('done');
  await page.request.post(`/api/v1/conversations/${id}/messages`,
    { headers, data: { content: 'A question that is long enough to wrap on a phone, to see how a person’s message looks.' } });
  await expect.poll(async () => (await (await page.request.get(`/api/v1/conversations/${id}`)).json()).messages[3].status).toBe('done');

  await look(page, 'chat-new', '/');
  await look(page, 'chat-conversation', `/c/${id}`);
  await look(page, 'history', '/history');
});

// Apart from the chat's, so that each test's time stays well inside its
// limit on a loaded machine (axe takes seconds per page and mode).
test('the key and people pages: screenshots, accessibility, phone width', async ({ page }) => {
  test.setTimeout(90_000);
  await signIn(page);
  await look(page, 'keys', '/keys');
  await look(page, 'admin-keys', '/admin/keys');
  await look(page, 'admin-people', '/admin/people');
});

test('the phone layout opens and closes the conversation list', async ({ page }) => {
  await page.setViewportSize({ width: 390, height: 844 });
  await signIn(page);
  const list = page.getByRole('navigation', { name: 'Conversations' });
  await expect(list).toBeHidden();
  const toggle = page.getByRole('button', { name: 'Conversations' });
  await toggle.click();
  await expect(list).toBeVisible();
  await expect(toggle).toHaveAttribute('aria-expanded', 'true');
  await page.screenshot({ path: 'test-results/screenshots/chat-phone-sidebar.png' });
  await toggle.click();
  await expect(list).toBeHidden();
});

test('keyboard only: send with Enter, reach the reply buttons with Tab', async ({ page }) => {
  await signIn(page);
  await page.getByRole('textbox', { name: 'Message' }).focus();
  await page.keyboard.type('Hello from the keyboard');
  await page.keyboard.press('Enter');
  const reply = page.locator('article[data-role="assistant"]').last();
  await expect(reply).toHaveAttribute('data-status', 'done');
  await expect(page.getByRole('textbox', { name: 'Message' })).toBeFocused();
  // Every control on the way is reachable and named.
  const names: string[] = [];
  for (let i = 0; i < 40; i++) {
    await page.keyboard.press('Shift+Tab');
    const name = await page.evaluate(() => {
      const el = document.activeElement as HTMLElement | null;
      return el ? (el.getAttribute('aria-label') || el.innerText || (el as HTMLInputElement).value || el.tagName) : '';
    });
    names.push(name.trim());
    if (name.trim() === 'Copy answer') break;
  }
  expect(names).toContain('Copy answer');
  expect(names).toContain('Regenerate');
});
