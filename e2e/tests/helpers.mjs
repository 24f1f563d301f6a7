// Shared helpers for the browser tests: launch Debian's Chromium, screenshot on failure.
import { before, after } from 'node:test';
import assert from 'node:assert/strict';
import { chromium } from 'playwright-core';
import { mkdirSync } from 'node:fs';

export const BASE = process.env.TESSERA_URL ?? 'http://127.0.0.1:3000';
export const ADMIN_PASSWORD = process.env.TESSERA_ADMIN_PASSWORD;
if (!ADMIN_PASSWORD) throw new Error('set TESSERA_ADMIN_PASSWORD (cargo xtask e2e does)');
// accounts.test.mjs (which runs first) changes the admin password to this.
export const ADMIN_SECOND_PASSWORD = 'e2e second password 2';

export async function launch() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    headless: true,
    args: [
      '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
    ],
  });
}

// One Chromium for a test file: launched before its first test, closed after its last;
// `withPage` takes it like a launched one.
export function fileBrowser() {
  let launched;
  before(async () => { launched = await launch(); });
  after(async () => { await launched?.close(); });
  return { newContext: (options) => launched.newContext(options) };
}

// A short tag that keeps this run's team and user names apart from earlier runs'.
export const runTag = () => Date.now().toString(36).slice(-5);

// Runs `body(page)` in a fresh browser context; on failure saves a screenshot under
// e2e/artifacts/ and rethrows.
export async function withPage(browser, name, body, options = {}) {
  const { allowCspViolations, ...contextOptions } = options;
  const context = await browser.newContext(contextOptions);
  const page = await context.newPage();
  const consoleErrors = [];
  page.on('pageerror', (e) => consoleErrors.push(String(e)));
  // Every page runs under the portal's Content-Security-Policy: a violation fails the test.
  const cspViolations = [];
  page.on('console', (m) => {
    if (m.type() === 'error' && /Content Security Policy/i.test(m.text())) {
      cspViolations.push(`${page.url()}: ${m.text()}`);
    }
  });
  try {
    await body(page, consoleErrors);
    if (cspViolations.length && !allowCspViolations) {
      throw new Error(`Content-Security-Policy violations:\n${cspViolations.join('\n')}`);
    }
  } catch (e) {
    mkdirSync('artifacts', { recursive: true });
    const file = `artifacts/${name.replace(/[^a-z0-9]+/gi, '-')}.png`;
    await page.screenshot({ path: file, fullPage: true }).catch(() => {});
    console.error(`screenshot: e2e/${file}; page errors: ${consoleErrors.join(' | ') || 'none'}`);
    throw e;
  } finally {
    await context.close();
  }
}

// Waits until the page is interactive: hydrated by the wasm bundle, or a server-only page
// (the sign-in page, plain HTML whose forms work without it).
export async function hydrated(page) {
  await page.waitForSelector('body[data-hydrated="true"], body[data-server-only]', { timeout: 30000 });
}

export async function signIn(page, username, password) {
  await page.goto(`${BASE}/login`);
  await hydrated(page);
  await page.fill('#username', username);
  await page.fill('#password', password);
  await page.click('#sign-in');
}

// Signs in and waits for the dashboard, hydrated (the sign-in form posts without the
// bundle, so the dashboard is a full page load).
export async function signInAs(page, username, password) {
  await signIn(page, username, password);
  await page.waitForURL(`${BASE}/`);
  await hydrated(page);
}

// Signs the bootstrap admin in, whichever password it has now: accounts.test.mjs changes
// it, and a file may run before or after that one. `first` is the password tried first.
export async function signInAdmin(page, first = ADMIN_PASSWORD) {
  const other = first === ADMIN_PASSWORD ? ADMIN_SECOND_PASSWORD : ADMIN_PASSWORD;
  await signIn(page, 'admin', first);
  try {
    await page.waitForURL(`${BASE}/`, { timeout: 5000 });
    await hydrated(page);
  } catch {
    await signInAs(page, 'admin', other);
  }
}

// A REST call with the page's session (same-origin, as the CSRF guard requires): asserts a
// success and returns the JSON body.
export async function api(page, method, path, data) {
  const r = await page.request.fetch(`${BASE}${path}`, {
    method, data, headers: { origin: BASE },
  });
  assert.ok(r.ok(), `${method} ${path}: ${r.status()} ${await r.text()}`);
  return r.json();
}

// As an admin (on `page`): a new team `team` with the new users `members` (`[username,
// role]` pairs, each with `password`) and, when `quota` is given, its quota on `model`.
// Returns the team's id.
export async function teamWith(page, { team, members, password, model, quota }) {
  const { id } = await api(page, 'POST', '/api/v1/teams', { name: team });
  for (const [username, role] of members) {
    await api(page, 'POST', '/api/v1/users', { username, password });
    await api(page, 'POST', `/api/v1/teams/${id}/members`, { username, role });
  }
  if (quota) {
    await api(page, 'PUT', `/api/v1/teams/${id}/quotas/${model}`, quota);
  }
  return id;
}

// Calls `check` (which may reload the page) until it returns true, for up to `timeoutMs`.
export async function eventually(check, { timeoutMs = 30000, intervalMs = 1000, what = 'condition' } = {}) {
  const deadline = Date.now() + timeoutMs;
  let last;
  while (Date.now() < deadline) {
    try {
      if (await check()) return;
    } catch (e) {
      last = e;
    }
    await new Promise((r) => setTimeout(r, intervalMs));
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${last}` : ''}`);
}

// Waits (up to 15 s) until no panel or list still shows "Loading…".
export async function settled(page) {
  await page.waitForFunction(() => !document.querySelector('.loading'), null, { timeout: 15000 }).catch(() => {});
}

const AXE = new URL('../node_modules/axe-core/axe.min.js', import.meta.url);

// Runs axe-core (npm) on the page as it is now; returns its serious and critical
// violations as `rule: selector, …` lines (empty: none). Injected through the DevTools
// protocol, so the portal's Content-Security-Policy stays as it is.
export async function axeViolations(page) {
  const { readFileSync } = await import('node:fs');
  await page.evaluate(readFileSync(AXE, 'utf8'));
  const violations = await page.evaluate(async () => {
    // eslint-disable-next-line no-undef
    const r = await axe.run(document, { resultTypes: ['violations'] });
    return r.violations.map((v) => ({
      id: v.id, impact: v.impact, help: v.help, targets: v.nodes.map((n) => n.target.join(' ')),
    }));
  });
  return violations
    .filter((v) => v.impact === 'serious' || v.impact === 'critical')
    .map((v) => `${v.id} (${v.impact}: ${v.help}): ${v.targets.slice(0, 5).join(', ')}`);
}
