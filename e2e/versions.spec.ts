import { test, expect, type Page } from '@playwright/test';
import { inEachMode, signIn } from './helpers';

// Versions of messages: Edit and Regenerate add a version instead of
// replacing, arrows switch the path shown, and the engine receives exactly
// the path shown. The demo engine answers "/context" with the messages it
// received before it (internal/mockllm ContextCommand), so the page itself
// shows what the engine was sent.

const replies = (page: Page) => page.locator('article[data-role="assistant"]');
const lastReply = (page: Page) => replies(page).last();
const mine = (page: Page) => page.locator('article[data-role="user"]');

async function send(page: Page, text: string, model?: string) {
  if (model) await page.getByLabel('Model').selectOption(model);
  await page.getByRole('textbox', { name: 'Message' }).fill(text);
  await page.getByRole('textbox', { name: 'Message' }).press('Enter');
}

async function answered(page: Page, count: number) {
  await expect(replies(page)).toHaveCount(count);
  await expect(lastReply(page)).toHaveAttribute('data-status', /done|stopped/);
}

// settled waits until htmx has settled what it swapped in: it binds the
// new elements' hx- attributes only then (20 ms after the swap), and a
// click or key before that does nothing.
async function settled(page: Page) {
  await expect(page.locator('.htmx-request, .htmx-swapping, .htmx-settling, .htmx-added')).toHaveCount(0);
}

test.beforeEach(async ({ page }) => {
  await signIn(page);
});

test('edit and regenerate add versions; the arrows switch the path shown; the engine receives only that path', async ({ page }) => {
  // Many answers and axe in three modes: slow on a busy machine.
  test.setTimeout(120_000);
  await send(page, 'Alpha question', 'moonji-demo');
  await answered(page, 1);
  await send(page, 'Beta question');
  await answered(page, 2);

  // Edit, then Esc: nothing changes.
  await mine(page).first().getByRole('button', { name: 'Edit' }).click();
  await expect(page.getByRole('textbox', { name: 'Edited message' })).toBeVisible();
  await settled(page);
  await page.getByRole('textbox', { name: 'Edited message' }).press('Escape');
  await expect(page.getByRole('textbox', { name: 'Edited message' })).toHaveCount(0);
  await expect(mine(page)).toHaveCount(2);

  // Edit the first message: the conversation after it is another branch.
  await mine(page).first().getByRole('button', { name: 'Edit' }).click();
  const box = page.getByRole('textbox', { name: 'Edited message' });
  await expect(box).toHaveValue('Alpha question');
  await box.fill('Alpha, edited');
  await box.press('Control+Enter');
  await answered(page, 1);
  await expect(mine(page)).toHaveCount(1);
  await expect(mine(page).first().locator('.text')).toHaveText('Alpha, edited');
  await expect(mine(page).first().locator('.version-count')).toHaveText('2 / 2');

  // The engine is sent the edited branch, nothing of the other.
  await send(page, '/context');
  await answered(page, 2);
  const context = await lastReply(page).locator('.answer').innerText();
  expect(context).toContain('user: Alpha, edited');
  expect(context).not.toContain('Alpha question');
  expect(context).not.toContain('Beta question');

  // Regenerate that answer: a second version beside it.
  const before = await lastReply(page).locator('.answer').innerText();
  const beforeID = (await lastReply(page).getAttribute('id')) || '';
  await lastReply(page).getByRole('button', { name: 'Regenerate' }).click();
  await expect(lastReply(page)).not.toHaveId(beforeID);
  await answered(page, 2);
  await expect(lastReply(page).locator('.versions')).toBeVisible();
  await expect(lastReply(page).locator('.version-count')).toHaveText('2 / 2');
  await expect(lastReply(page).locator('.answer')).toContainText('user: Alpha, edited');

  await inEachMode(page, 'chat-versions');

  // By keyboard: the previous version of the answer, then of the first
  // message, which brings back the conversation that followed it.
  await lastReply(page).getByRole('button', { name: 'Previous version' }).focus();
  await page.keyboard.press('Enter');
  await expect(lastReply(page).locator('.version-count')).toHaveText('1 / 2');
  await expect(lastReply(page).locator('.answer')).toHaveText(before);
  await settled(page);
  await mine(page).first().getByRole('button', { name: 'Previous version' }).focus();
  await page.keyboard.press('Enter');
  await expect(mine(page)).toHaveCount(2);
  await expect(mine(page).first().locator('.text')).toHaveText('Alpha question');
  await expect(mine(page).nth(1).locator('.text')).toHaveText('Beta question');
  await expect(mine(page).first().locator('.version-count')).toHaveText('1 / 2');

  // A reload shows the same path; the next message follows it.
  await page.reload();
  await expect(mine(page).nth(1).locator('.text')).toHaveText('Beta question');
  await send(page, '/context');
  await answered(page, 3);
  const second = await lastReply(page).locator('.answer').innerText();
  expect(second).toContain('user: Alpha question');
  expect(second).toContain('user: Beta question');
  expect(second).not.toContain('edited');
});

test('Delete a version of a person\'s message: asked first; the other version is shown, and an emptied conversation shows its empty state', async ({ page }) => {
  // Several answers and axe in three modes: slow on a busy machine.
  test.setTimeout(120_000);
  await send(page, 'Gamma question', 'moonji-demo');
  await answered(page, 1);
  await send(page, 'Delta question');
  await answered(page, 2);
  await mine(page).nth(1).getByRole('button', { name: 'Edit' }).click();
  const box = page.getByRole('textbox', { name: 'Edited message' });
  await expect(box).toBeVisible();
  await settled(page);
  await box.fill('Delta, edited');
  await box.press('Control+Enter');
  await answered(page, 2);
  await expect(mine(page).nth(1).locator('.version-count')).toHaveText('2 / 2');
  const url = page.url();

  // The button is short on screen; its name says what it deletes.
  const deleteButton = (n: number) => mine(page).nth(n).getByRole('button', { name: 'Delete this message and what followed it' });
  await expect(deleteButton(1)).toHaveText('Delete');
  await inEachMode(page, 'chat-delete');
  await settled(page);

  // Dismissed: nothing is deleted, not even after a reload.
  let asked = '';
  page.once('dialog', (d) => { asked = d.message(); d.dismiss(); });
  await deleteButton(1).click();
  await expect.poll(() => asked).toBe('Delete this message and the answers after it? Its other versions stay.');
  await page.reload();
  await expect(mine(page).nth(1).locator('.text')).toHaveText('Delta, edited');
  await expect(mine(page).nth(1).locator('.version-count')).toHaveText('2 / 2');

  // Accepted: the edited version and its answer go; the first version is
  // shown, with its answer, and no arrows (one version is left).
  page.once('dialog', (d) => d.accept());
  await deleteButton(1).click();
  await expect(mine(page).nth(1).locator('.text')).toHaveText('Delta question');
  await expect(mine(page).nth(1).locator('.versions')).toHaveCount(0);
  await answered(page, 2);
  await page.reload();
  await expect(mine(page).nth(1).locator('.text')).toHaveText('Delta question');
  await expect(page.locator('.versions')).toHaveCount(0);

  // The first message: the rest of the conversation goes with it, the
  // page shows the empty state, and the conversation stays in the
  // sidebar, still the current one; the next message starts it again.
  page.once('dialog', (d) => { asked = d.message(); d.accept(); });
  await deleteButton(0).click();
  await expect(page.locator('#thread-empty')).toBeVisible();
  expect(asked).toBe('Delete this message and the answers after it?');
  await expect(page.locator('#thread article')).toHaveCount(0);
  await expect(page.getByRole('navigation', { name: 'Conversations' }).locator('[aria-current="page"]')).toHaveAttribute('href', new URL(url).pathname);
  await inEachMode(page, 'chat-delete-empty');
  await send(page, 'Epsilon question');
  await answered(page, 1);
  await expect(page.locator('#thread-empty')).toHaveCount(0);
  expect(page.url()).toBe(url);
});

test('Stop, then send at once: the stopped answer stays, and goes to the engine exactly as shown', async ({ page }) => {
  await send(page, 'Tell me a long story about the sea', 'moonji-slow');
  await expect(lastReply(page)).toHaveAttribute('data-status', 'streaming');
  await expect.poll(async () => (await lastReply(page).locator('.answer').innerText()).split(/\s+/).length).toBeGreaterThan(3);
  await page.getByRole('button', { name: 'Stop' }).click();
  await expect(lastReply(page)).toHaveAttribute('data-status', 'stopped');
  const shown = (await lastReply(page).locator('.answer').innerText()).trim();
  await send(page, '/context', 'moonji-demo');
  await answered(page, 2);
  await expect(replies(page).first()).toHaveAttribute('data-status', 'stopped');
  const context = await lastReply(page).locator('.answer').innerText();
  expect(context).toContain('user: Tell me a long story about the sea');
  expect(context).toContain(`assistant: ${shown}`);
});
