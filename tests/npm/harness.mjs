// What the npm acceptance tests share: the environment ctest sets, the
// official openai client from tests/npm/node_modules (a clear failure when it
// is missing), and bounded waits. Imported by every *.test.mjs here.
import path from 'node:path';
import { createRequire } from 'node:module';

export const BINARY = process.env.SPILLWAY_BINARY;
export const SOURCE_DIR = process.env.SPILLWAY_SOURCE_DIR;
if (!BINARY || !SOURCE_DIR) {
  throw new Error('set SPILLWAY_BINARY (the spillway binary) and SPILLWAY_SOURCE_DIR (the repository root)');
}

// Under a sanitizer everything is several times slower: waits scale.
export const SLOWDOWN = process.env.SPILLWAY_SANITIZE ? 4 : 1;

export const MODEL = path.join(SOURCE_DIR, 'models', 'stories260K.gguf');

async function loadOpenAI() {
  try {
    const require = createRequire(path.join(SOURCE_DIR, 'tests', 'npm', 'package.json'));
    return (await import(require.resolve('openai'))).default;
  } catch (e) {
    throw new Error(
      `the openai npm package is not installed in ${path.join(SOURCE_DIR, 'tests', 'npm', 'node_modules')}: ` +
        `run scripts/setup or (cd tests/npm && npm install --no-audit --no-fund --no-package-lock) [${e.message}]`);
  }
}
export const OpenAI = await loadOpenAI();

// A promise with a deadline: rejects naming `what` after `ms` x `scale`.
export function bounded(promise, ms, what, scale = 1) {
  let timer;
  const deadline = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms * scale} ms: ${what}`)), ms * scale);
  });
  return Promise.race([promise, deadline]).finally(() => clearTimeout(timer));
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
