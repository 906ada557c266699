// Copies the pinned front-end libraries from node_modules into static/vendor,
// where the Go binary embeds them: Moonji serves its own copies, no CDN.
// Run with `npm run vendor` after changing a version in package.json.
import { copyFileSync, mkdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const out = join(root, 'static', 'vendor');

const files = [
  { pkg: 'htmx.org', version: '2.0.11', from: 'dist/htmx.min.js', to: 'htmx.min.js' },
  { pkg: 'htmx-ext-sse', version: '2.2.4', from: 'dist/sse.min.js', to: 'htmx-ext-sse.min.js' },
  // The dashboards' charts (/admin, /usage); loaded only by those pages.
  { pkg: 'chart.js', version: '4.6.1', from: 'dist/chart.umd.min.js', to: 'chart.umd.min.js' },
];

mkdirSync(out, { recursive: true });
for (const f of files) {
  const dir = join(root, 'node_modules', f.pkg);
  const { version } = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8'));
  if (version !== f.version) {
    throw new Error(`${f.pkg} is ${version} in node_modules, want ${f.version} (run npm ci)`);
  }
  copyFileSync(join(dir, f.from), join(out, f.to));
  console.log(`${f.pkg}@${version} ${f.from} -> static/vendor/${f.to}`);
}
