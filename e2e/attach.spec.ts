import { test, expect, type Page } from '@playwright/test';
import { createHash } from 'node:crypto';
import { inEachMode, signIn } from './helpers';

// Attachments in the browser chat: images by the Attach button, dropped on
// the composer and pasted, reaching the engine byte for byte (the demo
// engine's "/describe" answers with each image's SHA-256 as it decoded it);
// a model without vision (moonji-demo) disables Attach and says why, and
// still takes text files. moonji-vision is marked vision: true in
// e2e/moonji.e2e.yaml.

// Three small PNGs of different colours (48×32).
const pngs = [
  'iVBORw0KGgoAAAANSUhEUgAAADAAAAAgCAIAAADbtmxLAAAAN0lEQVR4nO3OQQ0AMAgEMOQgB/+ZmLngeDSpgNabPqXiAyEhIaH0QEhISCg9EBISEkoPhISEln0F4PhqY6E8/QAAAABJRU5ErkJggg==',
  'iVBORw0KGgoAAAANSUhEUgAAADAAAAAgCAIAAADbtmxLAAAAN0lEQVR4nO3OQQ0AMAgEMOSgCXWTOhccjyYV0Oo3p1R8ICQkJJQeCAkJCaUHQkJCQumBkJDQsg9CNcxbEcPYKwAAAABJRU5ErkJggg==',
  'iVBORw0KGgoAAAANSUhEUgAAADAAAAAgCAIAAADbtmxLAAAAN0lEQVR4nO3OQQ0AMAgEMDQhB+0TMxccjyYV0Op5p1R8ICQkJJQeCAkJCaUHQkJCQumBkJDQsg+RGXB5Ys00iAAAAABJRU5ErkJggg==',
].map((b) => Buffer.from(b, 'base64'));

const lastReply = (page: Page) => page.locator('article[data-role="assistant"]').last();
const message = (page: Page) => page.getByRole('textbox', { name: 'Message' });
const previews = (page: Page) => page.locator('#attachments li');

// dropFile drops a file on the composer's message box, as a file manager does.
async function dropFile(page: Page, name: string, type: string, bytes: Buffer) {
  const dt = await page.evaluateHandle(([name, type, b64]) => {
    const data = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    const dt = new DataTransfer();
    dt.items.add(new File([data], name, { type }));
    return dt;
  }, [name, type, bytes.toString('base64')]);
  await page.dispatchEvent('#message', 'dragover', { dataTransfer: dt });
  await page.dispatchEvent('#message', 'drop', { dataTransfer: dt });
}

// pasteFile pastes a file (a screenshot) into the message box.
async function pasteFile(page: Page, name: string, type: string, bytes: Buffer) {
  await page.locator('#message').evaluate((box, [name, type, b64]) => {
    const data = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    const dt = new DataTransfer();
    dt.items.add(new File([data], name, { type }));
    box.dispatchEvent(new ClipboardEvent('paste', { clipboardData: dt, bubbles: true, cancelable: true }));
  }, [name, type, bytes.toString('base64')]);
}

async function attachByButton(page: Page, button: string, files: { name: string, mimeType: string, buffer: Buffer }[]) {
  const chooser = page.waitForEvent('filechooser');
  await page.getByRole('button', { name: button, exact: true }).click();
  await (await chooser).setFiles(files);
}

test.beforeEach(async ({ page }) => {
  // Each test takes six screenshots with axe: more than the default 30 s
  // on a busy machine.
  test.slow();
  await signIn(page);
});

test('images attached by button, drag and drop, and paste reach the engine byte for byte, and show as thumbnails', async ({ page }) => {
  await page.getByLabel('Model').selectOption('moonji-vision');
  await expect(page.getByRole('button', { name: 'Attach', exact: true })).toBeEnabled();
  await attachByButton(page, 'Attach', [{ name: 'red.png', mimeType: 'image/png', buffer: pngs[0] }]);
  await dropFile(page, 'green.png', 'image/png', pngs[1]);
  await pasteFile(page, 'image.png', 'image/png', pngs[2]);
  await expect(previews(page)).toHaveCount(3);
  await expect(page.locator('#attachments input[name="attachment_ids"]')).toHaveCount(3);
  // A text file, attached then removed: it does not go.
  await attachByButton(page, 'Attach', [{ name: 'notes.txt', mimeType: 'text/plain', buffer: Buffer.from('not sent') }]);
  await expect(previews(page)).toHaveCount(4);
  await page.getByRole('button', { name: 'Remove notes.txt' }).click();
  await expect(previews(page)).toHaveCount(3);
  await message(page).fill('/describe these');
  await inEachMode(page, 'attach-previews');

  await message(page).press('Enter');
  await expect(lastReply(page)).toHaveAttribute('data-status', 'done');
  await expect(previews(page)).toHaveCount(0);
  const answer = await lastReply(page).locator('.answer').innerText();
  pngs.forEach((png, i) => {
    const sum = createHash('sha256').update(png).digest('hex');
    expect(answer).toContain(`image ${i + 1}: image/png, ${png.length} bytes, sha256 ${sum}`);
  });
  // The message shows them as thumbnails, served from the database.
  const thumbs = page.locator('article[data-role="user"]').last().locator('.msg-files img');
  await expect(thumbs).toHaveCount(3);
  for (const img of await thumbs.all()) {
    await expect.poll(() => img.evaluate((el: HTMLImageElement) => el.complete && el.naturalWidth)).toBe(48);
  }
  await expect(thumbs.first()).toHaveAttribute('alt', 'red.png');
  // After a reload too.
  await page.reload();
  await expect(page.locator('article[data-role="user"]').last().locator('.msg-files img')).toHaveCount(3);
  await inEachMode(page, 'attach-sent');
});

test('a model without vision: Attach is disabled and says why; text files still go; a refused file keeps the typed text', async ({ page }) => {
  await page.getByLabel('Model').selectOption('moonji-demo');
  const attach = page.getByRole('button', { name: 'Attach', exact: true });
  await expect(attach).toBeDisabled();
  await expect(attach).toHaveAttribute('title', /moonji-demo cannot see images/);
  await expect(attach).toHaveAccessibleDescription(/moonji-demo cannot see images/);
  await expect(page.locator('#attach-why')).toBeVisible();
  await inEachMode(page, 'attach-no-vision');

  await message(page).fill('/echo Keep this text.');
  // An image dropped anyway is refused before it is uploaded.
  await dropFile(page, 'red.png', 'image/png', pngs[0]);
  await expect(page.locator('#composer-error')).toContainText('cannot see images');
  // A file that is not text is refused by the server, with why.
  await attachByButton(page, 'Attach text file', [{ name: 'notes.txt', mimeType: 'text/plain', buffer: Buffer.from([0x66, 0xff, 0xfe, 0x00]) }]);
  await expect(page.locator('#composer-error')).toContainText('notes.txt');
  await expect(previews(page)).toHaveCount(0);
  await expect(message(page)).toHaveValue('/echo Keep this text.');
  await inEachMode(page, 'attach-refused');

  await attachByButton(page, 'Attach text file', [{ name: 'plan.md', mimeType: 'text/markdown', buffer: Buffer.from('Step one: water the carrots.\n') }]);
  await expect(previews(page)).toHaveCount(1);
  await expect(page.locator('#attachments [data-id]')).toHaveCount(1);
  await message(page).press('Enter');
  await expect(lastReply(page)).toHaveAttribute('data-status', 'done');
  // The engine echoes the message's text parts: the file's text was among them.
  await expect(lastReply(page).locator('.answer')).toContainText('Step one: water the carrots.');
  await expect(page.locator('article[data-role="user"]').last().locator('.file-chip')).toContainText('plan.md');

  // Switching to a model with vision enables Attach.
  await page.getByLabel('Model').selectOption('moonji-vision');
  await expect(attach).toBeEnabled();
  await expect(page.locator('#attach-why')).toBeHidden();
});
