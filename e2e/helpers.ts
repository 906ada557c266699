import { execFileSync } from 'node:child_process';

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
