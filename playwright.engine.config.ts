import { existsSync } from 'node:fs';
import { defineConfig } from '@playwright/test';

// The real-engine suite (`make test-engine`): e2e/engine-real/ through a real
// `moonji serve` in front of a real Ollama serving a real (tiny) model.
// scripts/test-engine.sh builds and starts Ollama and writes the gateway's
// configuration below before it runs Playwright with this file; the default
// suite (playwright.config.ts) leaves e2e/engine-real/ alone.
const port = process.env.MOONJI_ENGINE_E2E_PORT || '18180';
export const baseURL = `http://127.0.0.1:${port}`;
export const gatewayConfig = 'e2e/.tmp/engine-real/moonji.yaml';

if (!existsSync(gatewayConfig)) {
  throw new Error(`${gatewayConfig} is missing: run the real-engine suite with \`make test-engine\` `
    + '(scripts/test-engine.sh starts Ollama and writes it)');
}

export default defineConfig({
  testDir: './e2e/engine-real',
  // Its own output directory, which Playwright empties when the run starts:
  // the default one (test-results/) would take `make test`'s screenshots
  // (test-results/screenshots/) with it.
  outputDir: 'test-results/engine-real',
  // The model answers in milliseconds; the time goes to retries of the
  // stop tests and the first load of the model.
  timeout: 60_000,
  // Ollama runs one request at a time; the tests read the shared ledger.
  fullyParallel: false,
  workers: 1,
  reporter: [['list']],
  use: { baseURL },
  webServer: {
    command: `exec bin/moonji serve --config ${gatewayConfig}`,
    url: `${baseURL}/healthz`,
    reuseExistingServer: false,
    timeout: 60_000,
    stdout: 'ignore',
    stderr: 'pipe',
    env: {
      MOONJI_LISTEN: `127.0.0.1:${port}`,
      MOONJI_DEV_ADMIN_PASSWORD: 'engine-e2e-admin-password',
    },
  },
});
