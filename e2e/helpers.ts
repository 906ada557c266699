import { execFileSync } from 'node:child_process';
import { expect, type Page } from '@playwright/test';
import AxeBuilder from '@axe-core/playwright';

// createKey issues an API key with the real CLI, against the same database
// the e2e server uses, and returns the secret it prints.
export function createKey(owner: string, name: string): string {
  const out = execFileSync('bin/moonji', ['keys', 'create', '--config', 'e2e/moonji.e2e.yaml', '--owner', owner, '--name', name],
    { encoding: 'utf8' });
  const lines = out.trim().split('\n');
  if (lines.length !== 1 || !lines[0].startsWith('mj-')) {
    throw new Error(`keys create printed ${JSON.stringify(out)}`);
  }
  return lines[0];
}

export const adminEmail = 'admin@localhost';
export const adminPassword = 'e2e-admin-password';

// signIn signs in through the embedded provider's form, from `start`
// (which sends a signed-out visitor to the sign-in).
export async function signIn(page: Page, start = '/', email = adminEmail, password = adminPassword) {
  await page.goto(start);
  const signInLink = page.getByRole('link', { name: 'Sign in' }).first();
  if (await signInLink.isVisible()) await signInLink.click();
  await expect(page).toHaveURL(/\/idp\/login\?/);
  await page.getByLabel('Email').fill(email);
  await page.getByLabel('Password').fill(password);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await expect(page.getByRole('button', { name: 'Log out' })).toBeVisible();
}

// moonji runs the real CLI against the e2e server's database.
export function moonji(args: string[], input?: string): string {
  return execFileSync('bin/moonji', [...args, '--config', 'e2e/moonji.e2e.yaml'], { encoding: 'utf8', input });
}

// csrf is the page's CSRF token, as htmx sends it.
export async function csrf(page: Page): Promise<string> {
  return page.evaluate(() => JSON.parse(document.body.getAttribute('hx-headers') || '{}')['X-CSRF-Token']);
}

// usageRow is the ledger's row of one request, read with the real CLI from
// the e2e server's database.
export function usageRow(inferenceID: string): Record<string, any> | undefined {
  const out = execFileSync('bin/moonji', ['usage', 'export', '--config', 'e2e/moonji.e2e.yaml', '--format', 'jsonl'],
    { encoding: 'utf8', maxBuffer: 64 << 20 });
  return out.split('\n').filter(Boolean).map((l) => JSON.parse(l)).find((r) => r.inference_id === inferenceID);
}

// recording returns a fetch that remembers the last X-Inference-Id seen and,
// with extra, adds fields to the JSON body (mock-engine knobs, for SDKs that
// send only the fields they know).
export function recording(extra?: Record<string, unknown>) {
  const seen: { id: string | null } = { id: null };
  const f: typeof fetch = async (input, init) => {
    if (extra && init && typeof init.body === 'string') {
      init = { ...init, body: JSON.stringify({ ...JSON.parse(init.body), ...extra }) };
    }
    const r = await fetch(input, init);
    seen.id = r.headers.get('x-inference-id');
    return r;
  };
  return { seen, fetch: f };
}

// inEachMode screenshots the page as it is into
// test-results/screenshots/{shot}-{light,dark,phone}.png (to be looked at),
// checks each view with axe (nothing serious or critical) and that a 390 px
// phone needs no sideways scroll; before, if given, runs in each view before
// its screenshot. It ends in the light desktop view.
export async function inEachMode(page: Page, shot: string, before?: (mode: string) => Promise<void>) {
  const modes = [['light', 'light', 1280], ['dark', 'dark', 1280], ['phone', 'light', 390]] as const;
  for (const [mode, scheme, width] of modes) {
    await page.setViewportSize({ width, height: 800 });
    await page.emulateMedia({ colorScheme: scheme });
    if (before) await before(mode);
    await page.screenshot({ path: `test-results/screenshots/${shot}-${mode}.png` });
    const bad = (await new AxeBuilder({ page }).analyze()).violations.filter((v) => v.impact === 'serious' || v.impact === 'critical');
    expect(bad.map((v) => `${v.id}: ${v.help} (${v.nodes.map((n) => n.target).join(', ')})`), `${shot} in ${mode}`).toEqual([]);
    if (mode === 'phone') {
      const sideways = await page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
      expect(sideways, `${shot} scrolls sideways on a phone`).toBeLessThanOrEqual(0);
    }
  }
  await page.setViewportSize({ width: 1280, height: 800 });
  await page.emulateMedia({ colorScheme: 'light' });
}
