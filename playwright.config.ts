import { defineConfig } from '@playwright/test';

// The e2e suite runs against a real `moonji serve` built by `make build`,
// on a fresh SQLite database, with Debian's Chromium (Playwright's own
// browser download cannot work on these machines).
const port = process.env.MOONJI_E2E_PORT || '18080';
export const baseURL = `http://127.0.0.1:${port}`;

export default defineConfig({
  testDir: './e2e',
  // e2e/engine-real/ needs a real engine: `make test-engine` runs it
  // (playwright.engine.config.ts).
  testIgnore: '**/engine-real/**',
  // Playwright empties its outputDir when a run starts. Each suite has its
  // own (`make test-engine`'s is test-results/engine-real/), so neither
  // run erases the other's; the screenshots go to test-results/screenshots/
  // (the specs name it), which neither empties.
  outputDir: 'test-results/e2e',
  timeout: 30_000,
  fullyParallel: false,
  workers: 1,
  reporter: [['list']],
  use: {
    baseURL,
    launchOptions: {
      executablePath: process.env.CHROMIUM_PATH || '/usr/bin/chromium',
      args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update',
        '--disable-sync', '--no-first-run', '--disable-quic'],
    },
  },
  webServer: [{
    command: 'rm -rf e2e/.tmp && mkdir -p e2e/.tmp && exec bin/moonji serve --config e2e/moonji.e2e.yaml',
    url: `${baseURL}/healthz`,
    reuseExistingServer: false,
    timeout: 60_000,
    stdout: 'ignore',
    stderr: 'pipe',
    env: {
      MOONJI_LISTEN: `127.0.0.1:${port}`,
      MOONJI_DEV_ADMIN_PASSWORD: 'e2e-admin-password',
    },
  }, {
    // The engine behind the gateway's `gpu` backend (model moonji-engine).
    command: 'exec bin/moonji engine --listen 127.0.0.1:18093 --config e2e/engine.e2e.yaml',
    port: 18093,
    reuseExistingServer: false,
    timeout: 60_000,
    stdout: 'ignore',
    stderr: 'pipe',
  }],
});
