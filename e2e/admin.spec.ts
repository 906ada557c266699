import { test, expect, type Page, type Locator } from '@playwright/test';
import AxeBuilder from '@axe-core/playwright';
import { execFileSync } from 'node:child_process';
import { baseURL } from '../playwright.config';
import { adminEmail, adminPassword, createKey, signIn } from './helpers';

// The admin dashboard (/admin) and a person's usage page (/usage) against
// the e2e server: counts of requests just made, a backend's queue seen
// live, a key revoked from the admin pages, the admin guard, and every
// look (axe, light, dark, phone). The server and its database are shared
// with the other specs, so counts are read as differences or per fresh key.

const v1 = `${baseURL}/v1/chat/completions`;

// chat sends one /v1 request with key and returns its status and inference id.
async function chat(key: string, body: object): Promise<{ status: number; id: string }> {
  const resp = await fetch(v1, {
    method: 'POST', headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify(body),
  });
  await resp.arrayBuffer();
  return { status: resp.status, id: resp.headers.get('x-inference-id') || '' };
}

const ask = (model: string, maxTokens = 3) => ({ model, max_tokens: maxTokens, messages: [{ role: 'user', content: 'Hello' }] });

// value is a table cell's number (its data-value), 0 when the cell is absent.
async function value(cell: Locator): Promise<number> {
  if (await cell.count() === 0) return 0;
  return Number(await cell.getAttribute('data-value'));
}

// drawn reports whether Chart.js has drawn both charts of the page.
const drawn = (page: Page) => page.evaluate(() => {
  const C = (window as any).Chart;
  return !!C && !!C.getChart('chart-requests') && !!C.getChart('chart-tokens');
});

// No page may throw: a script error would leave charts undrawn or the live
// view's note dead without any other sign.
let pageErrors: string[] = [];
test.beforeEach(({ page }) => {
  pageErrors = [];
  page.on('pageerror', (err) => pageErrors.push(err.message));
});
test.afterEach(() => {
  expect(pageErrors, 'errors thrown in the page').toEqual([]);
});

const totalsCell = (page: Page, model: string, outcome: string) =>
  page.locator(`#model-totals tr[data-model="${model}"] td[data-outcome="${outcome}"]`);

test('requests made with a key appear on /admin with the right counts', async ({ page }) => {
  await signIn(page, '/admin');
  await expect(page.getByRole('heading', { name: 'Dashboard' })).toBeVisible();
  const before = await value(totalsCell(page, 'moonji-demo', 'success'));

  const key = createKey(adminEmail, `e2e-dashboard-${Date.now()}`);
  const prefix = key.slice(0, 11);
  for (let i = 0; i < 3; i++) expect((await chat(key, ask('moonji-demo'))).status).toBe(200);
  const missing = await chat(key, ask('e2e-no-such-model'));
  expect(missing.status).toBe(404);
  const badKey = await chat(`mj-${'x'.repeat(43)}`, ask('moonji-demo'));
  expect(badKey.status).toBe(401);

  // The ledger commits in groups, and the refusals may land in a later one
  // than the answers: reload until all five rows are in (the key's four and
  // the key-less 401, which no key total counts).
  const keyRow = page.locator('#key-totals tbody tr', { hasText: `${prefix}…` });
  const unauthorizedRow = page.locator(`#rejected tr[data-inference-id="${badKey.id}"]`);
  await expect.poll(async () => {
    await page.goto('/admin');
    return [await value(totalsCell(page, 'moonji-demo', 'success')), await value(keyRow.locator('td[data-field="requests"]')),
      await unauthorizedRow.count()];
  }, { timeout: 10_000 }).toEqual([before + 3, 4, 1]);

  // The fresh key: its four requests, the refused one included.
  await expect(keyRow).toHaveCount(1);
  expect(await value(keyRow.locator('td[data-field="requests"]'))).toBe(4);
  expect(await value(keyRow.locator('td[data-field="completion_tokens"]'))).toBe(9);

  // The refusals, with their reasons; the key's prefix where there was a key.
  const rejected = page.locator(`#rejected tr[data-inference-id="${missing.id}"]`);
  await expect(rejected).toHaveAttribute('data-reason', 'model_not_found');
  await expect(rejected).toHaveAttribute('data-status', '404');
  await expect(rejected).toContainText(`${prefix}…`);
  const unauthorized = page.locator(`#rejected tr[data-inference-id="${badKey.id}"]`);
  await expect(unauthorized).toHaveAttribute('data-reason', 'unauthorized');

  // The charts are drawn (Chart.js sizes its canvas), and their numbers
  // are there as a table too.
  await expect.poll(() => drawn(page)).toBe(true);
  await page.getByText('Show as table').first().click();
  await expect(page.locator('#requests-table')).toBeVisible();
  const hourTotal = await page.locator('#requests-table tbody tr').last().locator('td[data-outcome="success"]');
  expect(await value(hourTotal)).toBeGreaterThanOrEqual(3);

  // The range switch: 30 days by day.
  await page.getByRole('navigation', { name: 'Time range' }).getByRole('link', { name: '30 days' }).click();
  await expect(page).toHaveURL(/\/admin\?range=30d$/);
  await expect(page.locator('#requests-table tbody tr')).toHaveCount(30);
  expect(await value(totalsCell(page, 'moonji-demo', 'success'))).toBeGreaterThanOrEqual(before + 3);
});

// datasets is a chart's series as Chart.js draws them: label → values.
const datasets = (page: Page, canvas: string) => page.evaluate((id) => {
  const chart = (window as any).Chart.getChart(id);
  return chart ? chart.data.datasets.map((d: any) => ({ label: d.label, data: d.data as number[] })) : null;
}, canvas);
const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);

test('“Split by” redraws both charts by model or by outcome, and keeps the choice in the URL', async ({ page }) => {
  const key = createKey(adminEmail, `e2e-split-${Date.now()}`);
  expect((await chat(key, ask('moonji-demo'))).status).toBe(200);
  expect((await chat(key, ask('e2e-split-no-such-model'))).status).toBe(404);
  await signIn(page, '/admin');
  // The ledger commits in groups: reload until the rows are in.
  await expect.poll(async () => {
    await page.goto('/admin');
    return value(page.locator('#model-totals tr[data-model="(unknown)"] td[data-outcome="rejected"]'));
  }, { timeout: 10_000 }).toBeGreaterThan(0);
  await expect.poll(() => drawn(page)).toBe(true);

  const outcomes = ['success', 'error', 'cancelled', 'stopped', 'rejected'];
  const split = page.getByRole('group', { name: 'Split by' });
  await expect(split).toBeVisible();
  const byModel = split.getByRole('radio', { name: 'Model' });
  const byOutcome = split.getByRole('radio', { name: 'Outcome' });
  const totals = page.locator('#model-totals tfoot tr[data-total="true"]');
  const demo = page.locator('#model-totals tr[data-model="moonji-demo"]');

  // By outcome first: both charts have one series per outcome.
  await expect(byOutcome).toBeChecked();
  await expect(page.locator('#chart-requests').locator('xpath=ancestor::figure/figcaption')).toHaveText('Requests by outcome');
  let requests = (await datasets(page, 'chart-requests'))!;
  let tokens = (await datasets(page, 'chart-tokens'))!;
  expect(requests.map((d) => d.label)).toEqual(outcomes);
  expect(tokens.map((d) => d.label)).toEqual(outcomes);
  const success = requests.find((d) => d.label === 'success')!;
  expect(sum(success.data)).toBe(await value(totals.locator('td[data-outcome="success"]')));
  const rejected = requests.find((d) => d.label === 'rejected')!;
  expect(sum(rejected.data)).toBe(await value(totals.locator('td[data-outcome="rejected"]')));

  // The keyboard: from Outcome, an arrow key chooses Model.
  await byOutcome.focus();
  await page.keyboard.press('ArrowLeft');
  await expect(byModel).toBeChecked();
  await expect(byModel).toBeFocused();
  await expect(page).toHaveURL(/\/admin\?split=model$/);
  await expect(page.locator('#chart-requests').locator('xpath=ancestor::figure/figcaption')).toHaveText('Requests by model');
  await expect(page.locator('#chart-tokens')).toHaveAttribute('aria-label', /^Tokens \(prompt and completion\) by model/);
  requests = (await datasets(page, 'chart-requests'))!;
  tokens = (await datasets(page, 'chart-tokens'))!;
  const models = await page.locator('#model-totals tbody tr th').allTextContents();
  expect(requests.map((d) => d.label)).toEqual(models.map((m) => m.trim()));
  expect(tokens.map((d) => d.label)).toEqual(models.map((m) => m.trim()));
  expect(requests.map((d) => d.label)).toContain('moonji-demo');
  expect(requests.map((d) => d.label)).toContain('(unknown)');
  expect(sum(requests.find((d) => d.label === 'moonji-demo')!.data)).toBe(await value(demo.locator('td[data-field="requests"]')));
  expect(sum(tokens.find((d) => d.label === 'moonji-demo')!.data)).toBe(
    await value(demo.locator('td[data-field="prompt_tokens"]')) + await value(demo.locator('td[data-field="completion_tokens"]')));
  // The tables follow: each chart's table by model.
  for (const s of await page.getByText('Show as table').all()) await s.click();
  await expect(page.locator('#requests-model-table')).toBeVisible();
  await expect(page.locator('#tokens-table')).toBeVisible();
  await expect(page.locator('#requests-table')).toBeHidden();
  await expect(page.locator('#tokens-outcome-table')).toBeHidden();

  // The range switch keeps the split, and the page opens in it.
  const range = page.getByRole('navigation', { name: 'Time range' });
  await expect(range.getByRole('link', { name: '30 days' })).toHaveAttribute('href', '/admin?range=30d&split=model');
  await range.getByRole('link', { name: '30 days' }).click();
  await expect(page).toHaveURL(/\/admin\?range=30d&split=model$/);
  await expect.poll(() => drawn(page)).toBe(true);
  await expect(page.getByRole('radio', { name: 'Model' })).toBeChecked();
  expect((await datasets(page, 'chart-requests'))!.map((d) => d.label)).toContain('moonji-demo');
  expect((await datasets(page, 'chart-requests'))!.map((d) => d.label)).not.toContain('success');

  // Back to outcome with a click: the URL loses the split (the default).
  await page.getByRole('radio', { name: 'Outcome' }).check();
  await expect(page).toHaveURL(/\/admin\?range=30d$/);
  expect((await datasets(page, 'chart-tokens'))!.map((d) => d.label)).toEqual(outcomes);
  await expect(range.getByRole('link', { name: '24 hours' })).toHaveAttribute('href', '/admin?range=24h');

  // /usage has the same control over the person's own numbers.
  await page.goto('/usage?split=model');
  await expect.poll(() => drawn(page)).toBe(true);
  await expect(page.getByRole('radio', { name: 'Model' })).toBeChecked();
  const own = (await datasets(page, 'chart-requests'))!.map((d) => d.label);
  expect(own).toEqual((await page.locator('#model-totals tbody tr th').allTextContents()).map((m) => m.trim()));
});

test('the live view shows a backend’s queue while requests wait', async ({ page }) => {
  test.setTimeout(60_000);
  await signIn(page, '/admin');
  const row = page.locator('#backends tr[data-backend="queue"]');
  await expect(row).toHaveAttribute('data-in-flight', '0');
  await expect(row).toHaveAttribute('data-max-queue', '4');

  const key = createKey(adminEmail, `e2e-queue-${Date.now()}`);
  // A request to the backend nobody listens on marks it down (passive
  // health); the live view says so until a probe passes, which none does.
  const down = page.locator('#backends tr[data-backend="down"]');
  await fetch(v1, {
    method: 'POST', headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify(ask('moonji-down')),
  }).then((r) => r.arrayBuffer());
  await expect(down).toHaveAttribute('data-up', 'false', { timeout: 6_000 });
  await expect(down.getByText('down', { exact: true })).toBeVisible();
  await expect(row).toHaveAttribute('data-up', 'true');
  const aborts: AbortController[] = [];
  const pending: Promise<unknown>[] = [];
  for (let i = 0; i < 3; i++) {
    const abort = new AbortController();
    aborts.push(abort);
    pending.push(fetch(v1, {
      method: 'POST', signal: abort.signal,
      headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ ...ask('moonji-queue', 2000), stream: true }),
    }).then((r) => r.arrayBuffer()).catch(() => undefined));
  }
  // htmx refreshes the fragment every 2 s: no reload here.
  await expect(row).toHaveAttribute('data-queued', '2', { timeout: 10_000 });
  await expect(row).toHaveAttribute('data-in-flight', '1');
  await expect(row).toHaveAttribute('data-max-concurrency', '1');
  await expect(row).toContainText('1 / 1');
  await expect(row).toContainText('2 / 4');
  await expect.poll(async () => Number(await row.getAttribute('data-oldest-wait-ms')), { timeout: 6_000 }).toBeGreaterThan(1000);
  await page.locator('#backends').screenshot({ path: 'test-results/screenshots/admin-queue.png' });

  for (const a of aborts) a.abort();
  await Promise.all(pending);
  await expect(row).toHaveAttribute('data-queued', '0', { timeout: 10_000 });
  await expect(row).toHaveAttribute('data-in-flight', '0', { timeout: 10_000 });

  // A refresh that fails leaves the last state in place and says so; the
  // next one that works takes the note away.
  const stale = page.locator('#backends-stale');
  await expect(stale).toBeHidden();
  await page.route('**/admin/backends', (route) => route.abort());
  await expect(stale).toBeVisible({ timeout: 6_000 });
  await expect(row).toHaveAttribute('data-in-flight', '0');
  await page.unroute('**/admin/backends');
  await expect(stale).toBeHidden({ timeout: 6_000 });
});

test('a key created on /keys and revoked on /admin/keys stops working', async ({ page }) => {
  await signIn(page, '/keys');
  const name = `e2e-admin-revoke-${Date.now()}`;
  await page.getByLabel('Name').fill(name);
  await page.getByRole('button', { name: 'Create key' }).click();
  const secret = await page.locator('#new-key-secret').inputValue();
  expect((await chat(secret, ask('moonji-demo'))).status).toBe(200);

  // From the dashboard's admin navigation to everyone's keys.
  await page.goto('/admin');
  await page.getByRole('navigation', { name: 'Admin' }).getByRole('link', { name: 'Keys' }).click();
  await expect(page).toHaveURL(/\/admin\/keys/);
  const row = page.locator('tr', { hasText: name });
  await expect(row).toHaveAttribute('data-status', 'active');
  let asked = '';
  page.once('dialog', (dialog) => { asked = dialog.message(); dialog.accept(); });
  await row.getByRole('button', { name: 'Revoke' }).click();
  await expect(row).toHaveAttribute('data-status', 'revoked');
  expect(asked).toContain(name);
  expect((await chat(secret, ask('moonji-demo'))).status).toBe(401);
});

// addPerson makes a non-admin who can sign in with the development
// provider, with the admin's password (read by the CLI from stdin).
function addPerson(email: string) {
  execFileSync('bin/moonji', ['people', 'add', '--config', 'e2e/moonji.e2e.yaml', '--email', email, '--dev-password-stdin'],
    { input: adminPassword + '\n' });
}

async function signInAs(page: Page, email: string) {
  await page.goto('/login');
  await expect(page).toHaveURL(/\/idp\/login\?/);
  await page.getByLabel('Email').fill(email);
  await page.getByLabel('Password').fill(adminPassword);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await expect(page.locator('#whoami')).toHaveText(email);
}

test('someone who is not an admin gets 403 on /admin and sees only their own usage', async ({ page }) => {
  const email = 'person@localhost';
  addPerson(email);
  await signInAs(page, email);
  await expect(page.getByRole('banner').getByRole('link', { name: 'Admin' })).toHaveCount(0);
  for (const path of ['/admin', '/admin/backends', '/admin?range=30d', '/admin/teams']) {
    const resp = await page.goto(path);
    expect(resp?.status(), path).toBe(403);
  }
  const resp = await page.goto('/usage');
  expect(resp?.status()).toBe(200);
  await expect(page.getByRole('heading', { name: 'Your usage' })).toBeVisible();
  // Nothing of the admin's: their keys and models are not listed here.
  expect(await page.locator('#key-totals tbody tr', { hasText: 'e2e-dashboard' }).count()).toBe(0);
  expect(await page.content()).not.toContain(adminEmail + '<');
});

const modes = [
  { name: 'light', colorScheme: 'light' as const, width: 1280, height: 800 },
  { name: 'dark', colorScheme: 'dark' as const, width: 1280, height: 800 },
  { name: 'phone', colorScheme: 'light' as const, width: 390, height: 844 },
];

// look screenshots url in each mode, scans it with axe and checks that a
// phone never scrolls sideways; charts: the page draws charts, waited for.
async function look(page: Page, name: string, url: string, charts = true) {
  for (const mode of modes) {
    await page.setViewportSize({ width: mode.width, height: mode.height });
    await page.emulateMedia({ colorScheme: mode.colorScheme });
    await page.goto(url);
    if (charts) await expect.poll(() => drawn(page)).toBe(true);
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

test('/admin and /usage: screenshots, accessibility, phone width', async ({ page }) => {
  test.setTimeout(150_000);
  await signIn(page, '/usage');
  // Something to draw on /usage: the admin's own requests with a key.
  const key = createKey(adminEmail, `e2e-look-${Date.now()}`);
  for (let i = 0; i < 2; i++) await chat(key, ask('moonji-demo', 8));
  await chat(key, ask('e2e-no-such-model'));
  await look(page, 'admin', '/admin');
  await look(page, 'admin-30d', '/admin?range=30d');
  await look(page, 'admin-split-model', '/admin?range=30d&split=model');
  await look(page, 'usage', '/usage');
  // The tables opened: their contrast is scanned too.
  await page.goto('/usage');
  for (const s of await page.getByText('Show as table').all()) await s.click();
  const results = await new AxeBuilder({ page }).analyze();
  expect(results.violations.filter((v) => v.impact === 'serious' || v.impact === 'critical').map((v) => v.id)).toEqual([]);
  await page.screenshot({ path: 'test-results/screenshots/usage-tables-light.png', fullPage: true });
});

// execCLI runs bin/moonji against the e2e server's database.
const execCLI = (command: string, verb: string, ...args: string[]) =>
  execFileSync('bin/moonji', [command, verb, '--config', 'e2e/moonji.e2e.yaml', ...args],
    { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });

test('teams, budgets and model lists on the admin pages; /usage lists the budgets that apply and what they spent', async ({ page }) => {
  test.setTimeout(180_000);
  const team = `e2e-team-${Date.now()}`;
  await signIn(page, '/admin');
  await page.getByRole('navigation', { name: 'Admin' }).getByRole('link', { name: 'Teams' }).click();
  await expect(page).toHaveURL(/\/admin\/teams$/);
  await expect(page.getByRole('heading', { name: 'Teams', exact: true })).toBeVisible();

  // A refused form says why, keeps what was typed, and creates nothing.
  await page.getByLabel('Name', { exact: true }).fill(team);
  await page.getByLabel('Budget (USD) of the new team').fill('-1');
  await page.getByRole('button', { name: 'Create team' }).click();
  await expect(page.getByRole('alert')).toContainText('not negative');
  await expect(page.getByLabel('Name', { exact: true })).toHaveValue(team);
  await expect(page.locator(`#teams tr[data-team="${team}"]`)).toHaveCount(0);

  await page.getByLabel('Budget (USD) of the new team').fill('25');
  await page.getByLabel('Period of the budget of the new team').selectOption('month');
  await page.getByLabel('Models of the new team').fill('moonji-demo, moonji-priced');
  await page.getByRole('button', { name: 'Create team' }).click();
  await expect(page).toHaveURL(/\/admin\/teams\/\d+\?done=created$/);
  await expect(page.getByRole('status')).toContainText('Team created');
  const teamURL = new URL(page.url()).pathname;

  await page.getByLabel('Email').fill(adminEmail);
  await page.getByRole('button', { name: 'Add member' }).click();
  await expect(page.getByRole('status')).toContainText('Member added');
  await expect(page.locator(`#members tr[data-member="${adminEmail}"]`)).toBeVisible();
  try {
    // The team's list holds at once for its member: a priced model it
    // names answers, one it does not is unknown to them.
    const name = `e2e-budget-${Date.now()}`;
    const key = createKey(adminEmail, name);
    expect((await chat(key, ask('moonji-priced', 8))).status).toBe(200);
    expect((await chat(key, ask('moonji-slow'))).status).toBe(404);

    // /usage: the key's cost, and the team's budget with what it spent.
    const prefix = key.slice(0, 11);
    const keyCost = page.locator('#key-totals tbody tr', { hasText: `${prefix}…` }).locator('td[data-field="cost"]');
    await expect.poll(async () => { await page.goto('/usage'); return value(keyCost); }, { timeout: 10_000 }).toBeGreaterThan(0);
    const teamBudget = page.locator(`#budgets tr[data-scope="team"][data-name="${team}"]`);
    await expect(teamBudget.locator('td[data-field="amount"]')).toHaveAttribute('data-value', '25000000000');
    expect(await value(teamBudget.locator('td[data-field="spent"]'))).toBeGreaterThanOrEqual(await value(keyCost));
    await expect(teamBudget).toContainText('per month');

    // Its owner gives the key a budget on /keys.
    await page.goto('/keys');
    const row = page.locator('tr', { hasText: `${prefix}…` });
    await row.locator('summary', { hasText: 'Change budget' }).click();
    await row.getByLabel(`Budget (USD) of key ${name}`).fill('1');
    await row.getByRole('button', { name: 'Save' }).click();
    await expect(page.getByRole('status')).toContainText('Budget saved');
    await expect(row).toContainText('1.00 USD per month');
    await page.goto('/usage');
    await expect(page.locator(`#budgets tr[data-scope="key"][data-name="${name}"] td[data-field="amount"]`)).toHaveAttribute('data-value', '1000000000');

    await look(page, 'teams', '/admin/teams', false);
    await look(page, 'team', teamURL, false);
    await look(page, 'usage-budgets', '/usage');
    // The dashboard with a team that spent: people, keys, teams and models
    // each with their cost.
    await page.goto('/admin');
    expect(await value(page.locator(`#top-teams tr[data-team="${team}"] td[data-field="cost"]`))).toBeGreaterThan(0);
    await look(page, 'admin-costs', '/admin');
    // A budget form opened in a table cell, on a phone: the table scrolls
    // inside its box, never the page.
    await page.setViewportSize({ width: 390, height: 844 });
    await page.goto('/admin/people');
    await page.locator('details.cell-form summary').first().click();
    const sideways = await page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
    expect(sideways, 'an open budget form scrolls the people page sideways').toBeLessThanOrEqual(0);
    await page.screenshot({ path: 'test-results/screenshots/admin-people-budget-form-phone.png', fullPage: true });
    await page.setViewportSize({ width: 1280, height: 800 });

    // Deleted after a confirmation: its budget and list no longer apply.
    await page.goto(teamURL);
    let asked = '';
    page.once('dialog', (dialog) => { asked = dialog.message(); dialog.accept(); });
    await page.getByRole('button', { name: `Delete team ${team}` }).click();
    await expect(page).toHaveURL(/\/admin\/teams\?done=deleted$/);
    expect(asked).toContain(team);
    await expect(page.locator(`#teams tr[data-team="${team}"]`)).toHaveCount(0);
    expect((await chat(key, ask('moonji-slow'))).status).toBe(200);
  } finally {
    // The admin signs in for the other specs: never leave them in a team
    // whose list hides models.
    try { execCLI('teams', 'remove', team, adminEmail); } catch { /* deleted, or never added */ }
  }
});

test('someone who is not an admin may give their key a budget and lower it, not raise it', async ({ browser }) => {
  const email = 'budget-person@localhost';
  try { addPerson(email); } catch { /* added by an earlier run of this server */ }
  const context = await browser.newContext();
  const page = await context.newPage();
  await signInAs(page, email);
  await page.goto('/keys');
  const name = `e2e-own-budget-${Date.now()}`;
  await page.getByLabel('Name').fill(name);
  await page.getByRole('button', { name: 'Create key' }).click();
  await expect(page.locator('#new-key-secret')).toBeVisible();
  const row = page.locator('tr', { hasText: name });
  const setBudget = async (amount: string) => {
    await row.locator('summary', { hasText: 'Change budget' }).click();
    await row.getByLabel(`Budget (USD) of key ${name}`).fill(amount);
    await row.getByRole('button', { name: 'Save' }).click();
  };
  await setBudget('2');
  await expect(page.getByRole('status')).toContainText('Budget saved');
  await setBudget('3');
  await expect(page.getByRole('alert')).toContainText('not raise it');
  await expect(row).toContainText('2.00 USD per month');
  await setBudget('');
  await expect(page.getByRole('alert')).toContainText('Only an admin can remove');
  await setBudget('0.5');
  await expect(page.getByRole('status')).toContainText('Budget saved');
  await expect(row).toContainText('0.5 USD per month');
  await page.screenshot({ path: 'test-results/screenshots/keys-own-budget-light.png', fullPage: true });
  await context.close();
});
