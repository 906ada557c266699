import { test, expect, type Page } from '@playwright/test';
import { baseURL } from '../playwright.config';
import { csrf, inEachMode, moonji, signIn, usageRow } from './helpers';

// The browser chat against the built-in demo engine: moonji-demo streams
// fast, moonji-slow at 12 tokens/s one request at a time with no queue,
// and moonji-down's engine does not listen (e2e/moonji.e2e.yaml).

const lastReply = (page: Page) => page.locator('article[data-role="assistant"]').last();
const answerText = (page: Page) => lastReply(page).locator('.answer').innerText();

async function send(page: Page, text: string, model?: string) {
  if (model) await page.getByLabel('Model').selectOption(model);
  await page.getByRole('textbox', { name: 'Message' }).fill(text);
  await page.getByRole('textbox', { name: 'Message' }).press('Enter');
}

// conversationOf is the conversation as the JSON API returns it.
async function conversationOf(page: Page, id: string) {
  const resp = await page.request.get(`/api/v1/conversations/${id}`);
  expect(resp.status()).toBe(200);
  return resp.json();
}

const idFromURL = (page: Page) => new URL(page.url()).pathname.split('/')[2];

test.beforeEach(async ({ page }) => {
  await signIn(page);
});

test('a reply streams in steps; Stop freezes it at exactly the text shown, after a reload too', async ({ page }) => {
  await expect(page.getByRole('heading', { name: 'New chat' })).toBeVisible();
  await send(page, 'Tell me a story about a lighthouse', 'moonji-slow');
  await expect(page).toHaveURL(/\/c\/c_[0-9a-z]+$/);
  const mine = page.locator('article[data-role="user"]').last();
  await expect(mine).toHaveText(/Tell me a story about a lighthouse/);
  await expect(lastReply(page)).toHaveAttribute('data-status', 'streaming');
  await expect(page.getByRole('button', { name: 'Stop' })).toBeVisible();
  await expect.poll(() => answerText(page)).not.toBe('');
  await page.screenshot({ path: 'test-results/screenshots/chat-streaming.png' });
  // The sidebar has the new conversation, named after the first message.
  await expect(page.getByRole('navigation', { name: 'Conversations' }).getByRole('link', { name: 'Tell me a story about a lighthouse' }))
    .toHaveAttribute('aria-current', 'page');

  // The text grows in steps as chunks arrive.
  const lengths: number[] = [];
  for (let i = 0; i < 40 && new Set(lengths).size < 4; i++) {
    lengths.push((await answerText(page)).length);
    await page.waitForTimeout(150);
  }
  const distinct = [...new Set(lengths)];
  expect(distinct.length, `lengths seen: ${lengths}`).toBeGreaterThanOrEqual(4);
  expect(distinct).toEqual([...distinct].sort((a, b) => a - b));

  await page.getByRole('button', { name: 'Stop' }).click();
  const atStop = await answerText(page);
  await page.waitForTimeout(500);
  expect((await answerText(page)).length).toBe(atStop.length);
  await expect(lastReply(page)).toHaveAttribute('data-status', 'stopped');
  await expect(page.getByRole('button', { name: 'Send' })).toBeVisible();
  const shown = (await answerText(page)).trim();
  expect(shown).toBe(atStop.trim());
  expect(shown.length).toBeGreaterThan(0);

  // The database holds exactly that text, and a reload shows it.
  const conv = await conversationOf(page, idFromURL(page));
  const reply = conv.messages[conv.messages.length - 1];
  expect(reply.status).toBe('stopped');
  expect(reply.content).toBe(shown);
  await page.reload();
  await expect(lastReply(page)).toHaveAttribute('data-status', 'stopped');
  expect((await answerText(page)).trim()).toBe(shown);
  await expect(lastReply(page).getByText('Stopped')).toBeVisible();
  await page.screenshot({ path: 'test-results/screenshots/chat-stopped.png' });
});

test('closing the page mid-answer loses nothing: reopened, the reply goes on and ends whole', async ({ page, context }) => {
  const words = Array.from({ length: 30 }, (_, i) => `word${i}`).join(' ');
  await send(page, `/echo ${words}`, 'moonji-slow');
  await expect(page).toHaveURL(/\/c\//);
  const url = page.url();
  await expect.poll(() => answerText(page)).not.toBe('');
  await page.close();

  await new Promise((r) => setTimeout(r, 1500));
  const again = await context.newPage();
  await again.goto(url);
  // Live on this server: the text so far at once, then the stream goes on.
  const reply = lastReply(again);
  await expect(reply).toHaveAttribute('data-status', 'streaming');
  expect((await answerText(again)).length).toBeGreaterThan(0);
  await expect(reply).toHaveAttribute('data-status', 'done', { timeout: 20_000 });
  expect((await answerText(again)).trim()).toBe(words);
  await again.reload();
  expect((await answerText(again)).trim()).toBe(words);
});

test('Markdown is rendered with code and copy buttons; neither the person nor the model can run script', async ({ page, context }) => {
  await context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: baseURL });
  const hostileMine = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script> **not bold**';
  await send(page, hostileMine, 'moonji-demo');
  await expect(lastReply(page)).toHaveAttribute('data-status', 'done');
  await expect(page.locator('article[data-role="user"] .text').last()).toHaveText(hostileMine);

  const modelWrites = '# Heading\n\nSome **bold** text.\n\n```js\nconsole.log("hi")\n```\n\n<img src=x onerror="window.__xss=3"><script>window.__xss=4</script>\n\n[link](javascript:window.__xss=5)';
  await send(page, `/echo ${modelWrites}`);
  const reply = lastReply(page);
  await expect(reply).toHaveAttribute('data-status', 'done');
  await expect(reply.getByRole('heading', { name: 'Heading' })).toBeVisible();
  await expect(reply.locator('strong')).toHaveText('bold');
  await expect(reply.locator('pre code')).toContainText('console.log("hi")');
  // The raw HTML is shown as text, never as elements.
  await expect(reply.locator('img, script')).toHaveCount(0);
  await expect(reply).toContainText('<script>window.__xss=4</script>');
  expect(await reply.locator('a[href^="javascript:"]').count()).toBe(0);

  await reply.getByRole('button', { name: 'Copy code' }).click();
  await expect.poll(() => page.evaluate(() => navigator.clipboard.readText())).toBe('console.log("hi")\n');
  await reply.getByRole('button', { name: 'Copy answer' }).click();
  await expect.poll(() => page.evaluate(() => navigator.clipboard.readText())).toContain('Some bold text.');

  await page.reload();
  await expect(lastReply(page).getByRole('heading', { name: 'Heading' })).toBeVisible();
  expect(await page.evaluate(() => (window as any).__xss)).toBeUndefined();
});

test('Shift+Enter writes a new line, Esc stops, Regenerate writes the answer again', async ({ page }) => {
  const box = page.getByRole('textbox', { name: 'Message' });
  await page.getByLabel('Model').selectOption('moonji-slow');
  await box.fill('first line');
  await box.press('Shift+Enter');
  await box.pressSequentially('second line');
  await expect(box).toHaveValue('first line\nsecond line');
  await box.press('Enter');
  await expect(lastReply(page)).toHaveAttribute('data-status', 'streaming');
  await expect(page.locator('article[data-role="user"] .text').last()).toHaveText('first line\nsecond line');
  await expect.poll(() => answerText(page)).not.toBe('');
  await page.keyboard.press('Escape');
  await expect(lastReply(page)).toHaveAttribute('data-status', 'stopped');

  const before = await lastReply(page).getAttribute('id');
  await page.getByLabel('Model').selectOption('moonji-demo');
  await lastReply(page).getByRole('button', { name: 'Regenerate' }).click();
  await expect(lastReply(page)).toHaveAttribute('data-status', 'done');
  expect(await lastReply(page).getAttribute('id')).not.toBe(before);
  await expect(page.locator('article[data-role="assistant"]')).toHaveCount(1);
});

test('a full queue and a down engine show in the thread with Retry, and leave usage rows', async ({ page, browser }) => {
  // moonji-slow serves one request and queues none: hold it with another page.
  const other = await browser.newPage();
  await signIn(other);
  await send(other, 'Tell me a long story', 'moonji-slow');
  await expect(lastReply(other)).toHaveAttribute('data-status', 'streaming');
  await expect.poll(() => answerText(other)).not.toBe('');

  await send(page, 'Are you there?', 'moonji-slow');
  const reply = lastReply(page);
  await expect(reply).toHaveAttribute('data-status', 'error');
  await expect(reply.locator('.error')).toContainText(/queue|busy|capacity/i);
  await expect(reply.getByRole('button', { name: 'Retry' })).toBeVisible();
  const refused = await reply.getAttribute('data-inference');
  await expect.poll(() => usageRow(refused!)).toMatchObject({ source: 'web', outcome: 'rejected', reason: 'queue_full', status: 503 });

  await other.getByRole('button', { name: 'Stop' }).click();
  await expect(lastReply(other)).toHaveAttribute('data-status', 'stopped');
  await other.close();
  await reply.getByRole('button', { name: 'Retry' }).click();
  await expect(lastReply(page)).toHaveAttribute('data-status', 'streaming');
  await page.getByRole('button', { name: 'Stop' }).click();
  await expect(lastReply(page)).toHaveAttribute('data-status', 'stopped');

  await page.goto('/');
  await send(page, 'Hello?', 'moonji-down');
  await expect(lastReply(page)).toHaveAttribute('data-status', 'error');
  await expect(lastReply(page).locator('.error')).toContainText(/reach|unavailable|connect/i);
  await expect(lastReply(page).getByRole('button', { name: 'Retry' })).toBeVisible();
  const failed = await lastReply(page).getAttribute('data-inference');
  await expect.poll(() => usageRow(failed!)).toMatchObject({ source: 'web', outcome: 'error', model: 'moonji-down' });
});

test('history: search titles and text, rename, export, delete with confirmation', async ({ page }) => {
  const token = await csrf(page);
  const headers = { 'X-CSRF-Token': token };
  const make = async (text: string) => {
    const created = await page.request.post('/api/v1/conversations', { headers, data: { model: 'moonji-demo' } });
    expect(created.status()).toBe(201);
    const { id } = await created.json();
    const sent = await page.request.post(`/api/v1/conversations/${id}/messages`, { headers, data: { content: text } });
    expect(sent.status()).toBe(202);
    await expect.poll(async () => (await conversationOf(page, id)).messages[1].status).toBe('done');
    return id as string;
  };
  const stamp = Date.now().toString(36);
  const a = await make(`Planning a trip\nwith a quokka${stamp} on the beach`);
  const b = await make(`Notes on lighthouses ${stamp}`);

  await page.goto('/history');
  await expect(page.getByRole('heading', { name: 'History' })).toBeVisible();
  // Found by a word of the message, not of the title.
  await page.getByLabel('Search conversations').fill(`quokka${stamp}`);
  await page.getByRole('button', { name: 'Search' }).click();
  await expect(page.locator('.history-item')).toHaveCount(1);
  await expect(page.locator(`#h-${a}`)).toBeVisible();
  // And by a title's word.
  await page.getByLabel('Search conversations').fill('lighthouses');
  await page.getByRole('button', { name: 'Search' }).click();
  await expect(page.locator(`#h-${b}`)).toBeVisible();
  await expect(page.locator(`#h-${a}`)).toHaveCount(0);

  // Rename.
  const item = page.locator(`#h-${b}`);
  await item.getByText('Rename').click();
  await item.getByLabel('New title').fill(`Lighthouse notes ${stamp}`);
  await item.getByRole('button', { name: 'Save' }).click();
  await expect(page.getByRole('status')).toHaveText('Renamed.');
  await expect(page.locator(`#h-${b} .history-title`)).toHaveText(`Lighthouse notes ${stamp}`);

  // Export as Markdown and JSON.
  const [md] = await Promise.all([
    page.waitForEvent('download'),
    page.locator(`#h-${b}`).getByRole('link', { name: /as Markdown/ }).click(),
  ]);
  const mdText = await (await md.createReadStream()).toArray().then((c) => Buffer.concat(c).toString('utf8'));
  expect(mdText).toContain(`Lighthouse notes ${stamp}`);
  expect(mdText).toContain(`Notes on lighthouses ${stamp}`);
  const [js] = await Promise.all([
    page.waitForEvent('download'),
    page.locator(`#h-${b}`).getByRole('link', { name: /as JSON/ }).click(),
  ]);
  const exported = JSON.parse(await (await js.createReadStream()).toArray().then((c) => Buffer.concat(c).toString('utf8')));
  expect(exported.messages.map((m: any) => m.role)).toEqual(['user', 'assistant']);

  // Delete: dismissing the confirmation keeps it, accepting deletes it.
  page.once('dialog', (d) => d.dismiss());
  await page.locator(`#h-${b}`).getByRole('button', { name: /^Delete/ }).click();
  await expect(page.locator(`#h-${b}`)).toBeVisible();
  page.once('dialog', (d) => d.accept());
  await page.locator(`#h-${b}`).getByRole('button', { name: /^Delete/ }).click();
  await expect(page.getByRole('status')).toHaveText('Deleted.');
  await expect(page.locator(`#h-${b}`)).toHaveCount(0);
  expect((await page.request.get(`/api/v1/conversations/${b}`)).status()).toBe(404);
});

test('a priced answer shows its tokens and cost; a person over their budget sees why, and when it renews', async ({ page, browser }) => {
  await send(page, 'What does this cost?', 'moonji-priced');
  await expect(lastReply(page)).toHaveAttribute('data-status', 'done');
  const note = lastReply(page).locator('.usage-note');
  await expect(note).toContainText(/\d+ tokens in · \d+ out · [0-9.]+ USD/);
  const paid = await lastReply(page).getAttribute('data-inference');
  await expect.poll(() => usageRow(paid!)).toMatchObject({ outcome: 'success', currency: 'USD' });
  expect(Number(usageRow(paid!)!.cost)).toBeGreaterThan(0);

  // A person with a day budget of 0.01: a reply may cost more than that
  // (4096 output tokens at 10 per million), so it is refused before the
  // engine sees it.
  moonji(['people', 'add', '--email', 'spender@localhost', '--dev-password-stdin'], 'spender-password\n');
  moonji(['people', 'budget', 'spender@localhost', '0.01', 'day']);
  const context = await browser.newContext();
  const spender = await context.newPage();
  await signIn(spender, '/', 'spender@localhost', 'spender-password');
  await send(spender, 'Can I afford this?', 'moonji-priced');
  const reply = lastReply(spender);
  await expect(reply).toHaveAttribute('data-status', 'error');
  await expect(reply.locator('.error')).toContainText(/budget/i);
  await expect(reply.locator('.error')).toContainText(/person "spender@localhost"/);
  await expect(reply.locator('.error')).toContainText(/renews \d{4}-\d{2}-\d{2}T00:00:00Z/);
  const refused = await reply.getAttribute('data-inference');
  await expect.poll(() => usageRow(refused!)).toMatchObject({ outcome: 'rejected', reason: 'budget_exceeded', status: 429, cost: '0.000000' });
  for (const [name, width] of [['light', 1280], ['phone', 390]] as const) {
    await spender.setViewportSize({ width, height: 800 });
    await spender.screenshot({ path: `test-results/screenshots/chat-over-budget-${name}.png` });
  }
  await page.screenshot({ path: 'test-results/screenshots/chat-priced-answer-light.png' });
  // A free model is not held back by a budget.
  await send(spender, 'And this one?', 'moonji-demo');
  await expect(lastReply(spender)).toHaveAttribute('data-status', 'done');
  await context.close();
});

test('a conversation\'s settings: the Settings panel saves a system prompt, temperature and maximum length, and the next answer keeps to it', async ({ page }) => {
  await send(page, 'Tell me a long story', 'moonji-demo');
  await expect(lastReply(page)).toHaveAttribute('data-status', 'done');
  await page.getByRole('button', { name: 'Settings' }).click();
  await page.getByLabel('System prompt').fill('Answer in one short sentence.');
  await page.getByLabel('Temperature').fill('0.3');
  await page.getByLabel('Maximum length').fill('5');
  await page.getByRole('button', { name: 'Save settings' }).click();
  await expect(page.getByRole('status')).toContainText('Saved');
  await inEachMode(page, 'chat-settings');
  const conv = await conversationOf(page, idFromURL(page));
  expect(conv).toMatchObject({ system_prompt: 'Answer in one short sentence.', temperature: 0.3, max_tokens: 5 });
  await send(page, 'And another one');
  await expect(lastReply(page)).toHaveAttribute('data-status', 'done');
  // The demo engine keeps to max_tokens: five tokens, cut ("length").
  const after = await conversationOf(page, idFromURL(page));
  const last = after.messages[after.messages.length - 1];
  expect(last.content.split(/\s+/).filter(Boolean).length).toBeLessThanOrEqual(5);
});
