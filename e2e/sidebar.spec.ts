import { test, expect, type Page } from '@playwright/test';
import { csrf, inEachMode, signIn } from './helpers';

// Finding conversations: pins and folders in the sidebar (by keyboard and
// by drag and drop), the history filtered by folder, and a person's default
// system prompt on the settings page.

test.beforeEach(async ({ page }) => {
  await signIn(page);
});

// create makes a conversation titled title (in folder, when given) through
// the JSON API and returns its id.
async function create(page: Page, title: string, folder?: string): Promise<string> {
  const headers = { 'X-CSRF-Token': await csrf(page), 'Content-Type': 'application/json' };
  const made = await page.request.post('/api/v1/conversations', { headers, data: { model: 'moonji-demo' } });
  expect(made.status()).toBe(201);
  const { id } = await made.json();
  const patched = await page.request.patch(`/api/v1/conversations/${id}`, { headers, data: folder ? { title, folder } : { title } });
  expect(patched.status()).toBe(200);
  return id;
}

async function conversation(page: Page, id: string) {
  const resp = await page.request.get(`/api/v1/conversations/${id}`);
  expect(resp.status()).toBe(200);
  return resp.json();
}

// tabTo presses Tab until the focused element's accessible label is label.
async function tabTo(page: Page, label: string) {
  for (let i = 0; i < 80; i++) {
    const current = await page.evaluate(() => document.activeElement?.getAttribute('aria-label') || '');
    if (current === label) return;
    await page.keyboard.press('Tab');
  }
  throw new Error(`Tab never reached ${label}`);
}

const sidebar = (page: Page) => page.getByRole('navigation', { name: 'Conversations' });
const group = (page: Page, name: string) => sidebar(page).getByRole('region', { name });

test('pin and move to a folder by keyboard, drag into a folder, filter the history by folder', async ({ page }) => {
  // Several pages, each checked by axe in three modes: slow on a busy machine.
  test.setTimeout(120_000);
  const stamp = Date.now().toString(36);
  const names = ['Alpha plans', 'Beta notes', 'Gamma trip', 'Delta recipe', 'Epsilon code'].map((n) => `${n} ${stamp}`);
  const ids: Record<string, string> = {};
  for (const n of names) ids[n] = await create(page, n, n.startsWith('Gamma') ? `Travel ${stamp}` : undefined);
  const [alphaName, betaName, , deltaName, epsilonName] = names;
  const recipes = `Recipes ${stamp}`;

  await page.goto(`/c/${ids[alphaName]}`);
  await expect(sidebar(page).getByRole('link', { name: alphaName })).toHaveAttribute('aria-current', 'page');

  // Pin by keyboard: Tab to the conversation's menu, open it, Pin.
  // The sidebar's first link (conversations may be named "New chat" too).
  await sidebar(page).locator('a.new-chat').focus();
  await tabTo(page, `Options for ${betaName}`);
  await page.keyboard.press('Enter');
  await page.keyboard.press('Tab');
  await expect(page.getByRole('button', { name: `Pin ${betaName}` })).toBeFocused();
  await page.keyboard.press('Enter');
  await expect(group(page, 'Pinned').getByRole('link', { name: `Pinned: ${betaName}` })).toBeVisible();
  // The focus stays on the control used, now Unpin.
  await expect(page.getByRole('button', { name: `Unpin ${betaName}` })).toBeFocused();
  expect((await conversation(page, ids[betaName])).pinned).toBe(true);
  // Pinned first: before every other conversation in the sidebar.
  await expect(sidebar(page).locator('li a').first()).toContainText(betaName);
  await page.keyboard.press('Escape');
  await expect(page.getByRole('button', { name: `Unpin ${betaName}` })).toBeHidden();

  // Move to a new folder by keyboard: the menu's field, Enter.
  await tabTo(page, `Options for ${deltaName}`);
  await page.keyboard.press('Enter');
  await page.keyboard.press('Tab');
  await page.keyboard.press('Tab');
  await expect(page.locator(`#folder-${ids[deltaName]}`)).toBeFocused();
  await expect(page.locator(`#folder-${ids[deltaName]}`)).toHaveAccessibleName('Move to folder');
  await page.keyboard.type(recipes);
  await page.keyboard.press('Enter');
  await expect(group(page, `Folder ${recipes}`).getByRole('link', { name: deltaName })).toBeVisible();
  await expect(page.locator(`#folder-${ids[deltaName]}`)).toBeFocused();
  expect((await conversation(page, ids[deltaName])).folder).toBe(recipes);
  await page.keyboard.press('Escape');

  // Screenshots with a pin and two folders, a menu open too.
  await inEachMode(page, 'sidebar', async (name) => {
    if (name === 'phone') {
      await page.getByRole('button', { name: 'Conversations' }).click();
      await expect(sidebar(page)).toBeVisible();
    }
  });
  await page.reload();
  const openMenu = async () => {
    await sidebar(page).getByLabel(`Options for ${epsilonName}`).click();
    await expect(page.getByRole('button', { name: `Pin ${epsilonName}` })).toBeVisible();
  };
  await openMenu();
  await inEachMode(page, 'sidebar-menu', async (name) => {
    if (name === 'phone') {
      await page.getByRole('button', { name: 'Conversations' }).click();
      await openMenu();
    }
  });
  await page.reload();

  // Drag one onto a folder: the API moves it, the sidebar shows it there.
  await sidebar(page).getByRole('link', { name: epsilonName }).dragTo(group(page, `Folder ${recipes}`).getByRole('heading'));
  await expect(group(page, `Folder ${recipes}`).getByRole('link', { name: epsilonName })).toBeVisible();
  expect((await conversation(page, ids[epsilonName])).folder).toBe(recipes);
  // And one out of its folder, onto "No folder".
  await group(page, `Folder ${recipes}`).getByRole('link', { name: deltaName }).dragTo(group(page, 'No folder').getByRole('heading'));
  await expect(group(page, 'No folder').getByRole('link', { name: deltaName })).toBeVisible();
  expect((await conversation(page, ids[deltaName])).folder).toBe('');
  // And one onto "Pinned".
  await sidebar(page).getByRole('link', { name: alphaName }).dragTo(group(page, 'Pinned').getByRole('heading'));
  await expect(group(page, 'Pinned').getByRole('link', { name: `Pinned: ${alphaName}` })).toBeVisible();
  expect((await conversation(page, ids[alphaName])).pinned).toBe(true);

  // The history: a folder beside the search.
  await page.getByRole('link', { name: 'History', exact: true }).click();
  await page.getByLabel('Folder', { exact: true }).selectOption(recipes);
  await page.getByRole('button', { name: 'Search' }).click();
  await expect(page).toHaveURL(new RegExp(`folder=Recipes`));
  const titles = page.locator('.history-title');
  await expect(titles).toHaveText([epsilonName]);
  await page.getByLabel('Search conversations').fill('epsilon');
  await page.getByRole('button', { name: 'Search' }).click();
  await expect(titles).toHaveText([epsilonName]);
  await page.getByLabel('Search conversations').fill('delta');
  await page.getByRole('button', { name: 'Search' }).click();
  await expect(page.getByText(`No conversation in “${recipes}” matches “delta”.`)).toBeVisible();
  // All folders again: pinned ones first, marked.
  await page.getByLabel('Search conversations').fill(stamp);
  await page.getByLabel('Folder', { exact: true }).selectOption('');
  await page.getByRole('button', { name: 'Search' }).click();
  await expect(titles).toHaveCount(5);
  await expect(titles.nth(0)).toContainText(/Alpha plans|Beta notes/);
  await expect(titles.nth(1)).toContainText(/Alpha plans|Beta notes/);
  await expect(page.getByRole('link', { name: `Pinned: ${betaName}` })).toBeVisible();
  await inEachMode(page, 'history-folders');
});

test('a default system prompt on the settings page: saved, shown again, cleared', async ({ page }) => {
  await page.getByRole('link', { name: 'Settings', exact: true }).click();
  await expect(page).toHaveURL(/\/settings$/);
  const field = page.getByLabel('Default system prompt');
  await field.fill('Answer in one short sentence, in French.');
  await page.getByRole('button', { name: 'Save' }).click();
  await expect(page.getByRole('status')).toContainText('Saved');
  await page.reload();
  await expect(field).toHaveValue('Answer in one short sentence, in French.');
  await inEachMode(page, 'settings');
  // Too long: refused with why, nothing stored.
  await field.evaluate((el: HTMLTextAreaElement) => { el.removeAttribute('maxlength'); el.value = 'x'.repeat(16385); });
  await page.getByRole('button', { name: 'Save' }).click();
  await expect(page.getByRole('alert')).toContainText('at most 16 KiB');
  await page.goto('/settings');
  await expect(field).toHaveValue('Answer in one short sentence, in French.');
  await field.fill('');
  await page.getByRole('button', { name: 'Save' }).click();
  await expect(page.getByRole('status')).toContainText('Saved');
  await expect(field).toHaveValue('');
});
