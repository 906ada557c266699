import { test, expect, type Page } from '@playwright/test';
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { adminPassword, csrf, signIn } from './helpers';

// Two replicas on one PostgreSQL database and one Redis (when the tests
// have them: MOONJI_TEST_REDIS_URL and MOONJI_TEST_POSTGRES_DSN, as CI
// sets). A reply streams from replica A; Stop goes through replica B; B's
// page shows exactly the text A's page had when it stopped.

const redisURL = process.env.MOONJI_TEST_REDIS_URL;
const postgresDSN = process.env.MOONJI_TEST_POSTGRES_DSN;
test.skip(!redisURL || !postgresDSN, 'needs MOONJI_TEST_REDIS_URL and MOONJI_TEST_POSTGRES_DSN');

const replicas = [
  { id: 'a', port: 18091 },
  { id: 'b', port: 18092 },
];
const url = (i: number) => `http://127.0.0.1:${replicas[i].port}`;
const running: ChildProcess[] = [];
let database = '';

test.beforeAll(async () => {
  test.setTimeout(60_000);
  // A fresh database for this run.
  const stamp = `e2e_${Date.now().toString(36)}`;
  database = stamp;
  const admin = new URL(postgresDSN!);
  execFileSync('psql', [admin.toString(), '-v', 'ON_ERROR_STOP=1', '-c', `CREATE DATABASE ${stamp}`]);
  const db = new URL(postgresDSN!);
  db.pathname = `/${stamp}`;
  mkdirSync('e2e/.tmp', { recursive: true });
  for (const r of replicas) {
    const config = `e2e/.tmp/replica-${r.id}.yaml`;
    writeFileSync(config, [
      `listen: 127.0.0.1:${r.port}`,
      `public_url: http://127.0.0.1:${r.port}`,
      `replica_id: ${r.id}`,
      `database_url: "${db.toString()}"`,
      `redis_url: "${redisURL}"`,
      `redis_prefix: "${stamp}:"`,
      'backends:',
      '  - {name: slow, kind: builtin, tokens_per_second: 12, max_concurrency: 4}',
      'models:',
      '  - {name: moonji-slow, backend: slow}',
      '',
    ].join('\n'));
    const proc = spawn('bin/moonji', ['serve', '--config', config], {
      env: { ...process.env, MOONJI_DEV_ADMIN_PASSWORD: adminPassword },
      stdio: 'ignore',
    });
    running.push(proc);
    await expect.poll(async () => {
      try { return (await fetch(`http://127.0.0.1:${r.port}/healthz`)).status; } catch { return 0; }
    }, { timeout: 30_000 }).toBe(200);
  }
});

test.afterAll(async () => {
  await Promise.all(running.map((p) => new Promise((done) => { p.once('exit', done); p.kill('SIGTERM'); })));
  if (database) {
    execFileSync('psql', [postgresDSN!, '-c', `DROP DATABASE IF EXISTS ${database} WITH (FORCE)`]);
  }
});

const lastReply = (page: Page) => page.locator('article[data-role="assistant"]').last();

test('stream on replica A, Stop through replica B, reload on B: the same stopped text', async ({ page }) => {
  await signIn(page, url(0) + '/');
  await page.getByRole('textbox', { name: 'Message' }).fill('Tell me a story about two lighthouses');
  await page.getByRole('textbox', { name: 'Message' }).press('Enter');
  await expect(page).toHaveURL(/\/c\/c_/);
  const path = new URL(page.url()).pathname;
  await expect.poll(async () => Number(await lastReply(page).getAttribute('data-seen')), { timeout: 10_000 }).toBeGreaterThan(5);

  // What the Stop button does, but the stop request goes to replica B:
  // from this instant the page applies no more chunks.
  const shown = await page.evaluate(() => {
    const a = document.querySelector('#thread article[data-status="streaming"]') as HTMLElement;
    a.dataset.stopping = '1';
    return { inference: a.dataset.inference!, seen: Number(a.dataset.seen), text: (a.querySelector('.answer') as HTMLElement).innerText };
  });
  const resp = await page.request.post(`${url(1)}/api/v1/inference/stop`, {
    headers: { 'X-CSRF-Token': await csrf(page) },
    data: { inference_id: shown.inference, seen: shown.seen },
  });
  expect(resp.status(), await resp.text()).toBe(200);

  // A's page ends the reply as stopped with the same text...
  await expect(lastReply(page)).toHaveAttribute('data-status', 'stopped');
  expect((await lastReply(page).locator('.answer').innerText()).trim()).toBe(shown.text.trim());
  // ...and B, reading the shared database, shows exactly it.
  await page.goto(url(1) + path);
  await expect(lastReply(page)).toHaveAttribute('data-status', 'stopped');
  expect((await lastReply(page).locator('.answer').innerText()).trim()).toBe(shown.text.trim());
});

test('a reply running on A, opened on B: its saved text refreshes each second, and B stops it', async ({ page }) => {
  await signIn(page, url(0) + '/');
  await page.getByRole('textbox', { name: 'Message' }).fill('Another story, please');
  await page.getByRole('textbox', { name: 'Message' }).press('Enter');
  await expect(page).toHaveURL(/\/c\/c_/);
  const path = new URL(page.url()).pathname;

  const onB = await page.context().newPage();
  await onB.goto(url(1) + path);
  const reply = lastReply(onB);
  await expect(reply).toHaveAttribute('data-status', 'streaming');
  await expect(reply).toHaveAttribute('hx-trigger', 'every 1s');
  const first = (await reply.locator('.answer').innerText()).length;
  await expect.poll(async () => (await lastReply(onB).locator('.answer').innerText()).length, { timeout: 5_000 })
    .toBeGreaterThan(first);

  await onB.getByRole('button', { name: 'Stop' }).click();
  await expect(lastReply(onB)).toHaveAttribute('data-status', 'stopped', { timeout: 5_000 });
  await expect(lastReply(page)).toHaveAttribute('data-status', 'stopped');
  const onA = (await lastReply(page).locator('.answer').innerText()).trim();
  await onB.reload();
  expect((await lastReply(onB).locator('.answer').innerText()).trim()).toBe(onA);
});
