// First and repeat page loads as a researcher on a VPN sees them: headless Chromium with
// the network throttled through CDP (default 10 Mbit/s both ways, 40 ms latency). For each
// run: bytes transferred (compressed, as on the wire) and the time from navigation until
// the page is interactive: `body[data-hydrated]` (the wasm bundle has hydrated it), or for
// a server-only page (`body[data-server-only]`, the sign-in page) the document parsed, its
// forms working without the bundle.
//
//   TESSERA_URL=http://127.0.0.1:3000 TESSERA_ADMIN_PASSWORD=… node bench/pageload.mjs
//   (bench/pageload.sh starts a server and runs this; figures in docs/benchmarks.md §12)
import { chromium } from 'playwright-core';

const BASE = process.env.TESSERA_URL ?? 'http://127.0.0.1:3000';
const PASSWORD = process.env.TESSERA_ADMIN_PASSWORD;
const RUNS = Number(process.env.RUNS ?? 5);
const MBIT = Number(process.env.MBIT ?? 10);
const LATENCY = Number(process.env.LATENCY_MS ?? 40);

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});

// Counts bytes and requests from `start()` (a navigation) until the page is interactive
// and the network idle; `ms` until interactive.
async function measure(page, cdp, start) {
  let bytes = 0;
  let requests = 0;
  const done = (e) => { bytes += e.encodedDataLength; requests += 1; };
  cdp.on('Network.loadingFinished', done);
  const t0 = performance.now();
  await start();
  const body = await page.waitForSelector('body[data-hydrated="true"], body[data-server-only]',
    { timeout: 60000 });
  if (await body.getAttribute('data-server-only') !== null) {
    await page.waitForLoadState('domcontentloaded');
  }
  const ms = performance.now() - t0;
  // Requests the page makes once interactive (server functions) count too.
  await page.waitForLoadState('networkidle');
  cdp.off('Network.loadingFinished', done);
  return { bytes, requests, ms };
}

const visit = (page, cdp, path) => measure(page, cdp,
  () => page.goto(`${BASE}${path}`, { waitUntil: 'commit' }));

async function throttled(context) {
  const page = await context.newPage();
  const cdp = await context.newCDPSession(page);
  await cdp.send('Network.enable');
  await cdp.send('Network.emulateNetworkConditions', {
    offline: false,
    latency: LATENCY,
    downloadThroughput: (MBIT * 1e6) / 8,
    uploadThroughput: (MBIT * 1e6) / 8,
  });
  return { page, cdp };
}

// Signing in: the sign-in page prefetches the bundle once the visitor types, so what the
// first signed-in page costs depends on how long the typing took. `typingMs` 0 is a
// password manager filling the form and submitting at once (the bundle is mostly not
// there yet); TYPING_MS (default 2000) is a person typing. Bytes and time count from the
// click; the bytes prefetched while typing are reported on their own.
const TYPING_MS = Number(process.env.TYPING_MS ?? 2000);
async function signIn(page, cdp, typingMs, landing = '/') {
  let typed = 0;
  const during = (e) => { typed += e.encodedDataLength; };
  cdp.on('Network.loadingFinished', during);
  await page.fill('#username', 'admin');
  await page.fill('#password', PASSWORD);
  await page.waitForTimeout(typingMs);
  cdp.off('Network.loadingFinished', during);
  const r = await measure(page, cdp, () => Promise.all([
    page.waitForURL(`${BASE}${landing}`, { waitUntil: 'commit' }), page.click('#sign-in')]));
  return { ...r, typed };
}

const AT_ONCE = 'sign in at once → first dashboard';
const TYPED = `sign in after typing for ${TYPING_MS / 1000} s → first dashboard`;
const rows = {
  'first visit /login': [], 'repeat visit /login': [], [AT_ONCE]: [], [TYPED]: [],
  'signed in, repeat visit /': [],
  'signed in, first visit /allocations (its chunks not cached)': [],
  'signed in, repeat visit /allocations': [],
};
for (let i = 0; i < RUNS; i += 1) {
  for (const [name, typingMs] of PASSWORD ? [[AT_ONCE, 0], [TYPED, TYPING_MS]] : [[null, 0]]) {
    const context = await browser.newContext();
    const { page, cdp } = await throttled(context);
    if (!name || typingMs === 0) {
      rows['first visit /login'].push(await visit(page, cdp, '/login'));
      rows['repeat visit /login'].push(await visit(page, cdp, '/login'));
    } else {
      await visit(page, cdp, '/login');
    }
    if (name) {
      rows[name].push(await signIn(page, cdp, typingMs));
      if (typingMs === 0) {
        rows['signed in, repeat visit /'].push(await visit(page, cdp, '/'));
        // A page loaded on demand (`app/src/pages.rs`): the main module is cached, the
        // page's group of chunks is not yet.
        rows['signed in, first visit /allocations (its chunks not cached)']
          .push(await visit(page, cdp, '/allocations'));
        rows['signed in, repeat visit /allocations'].push(await visit(page, cdp, '/allocations'));
      }
    }
    await context.close();
  }
}
// A deep link opened with nothing cached: `/allocations` (loaded on demand) sends the
// visitor to sign in first, and the sign-in page prefetches the bundle and that page's
// chunks while they type.
const DEEP = ['at once', 0], DEEP_TYPED = [`after typing for ${TYPING_MS / 1000} s`, TYPING_MS];
for (const [how, typingMs] of PASSWORD ? [DEEP, DEEP_TYPED] : []) {
  const name = `deep link /allocations, sign in ${how}`;
  rows[name] = [];
  for (let i = 0; i < RUNS; i += 1) {
    const context = await browser.newContext();
    const { page, cdp } = await throttled(context);
    await visit(page, cdp, '/allocations');
    rows[name].push(await signIn(page, cdp, typingMs, '/allocations'));
    await context.close();
  }
}
await browser.close();

const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[Math.floor(s.length / 2)]; };
console.log(`${RUNS} runs at ${MBIT} Mbit/s, ${LATENCY} ms latency (medians)\n`);
console.log('| visit | transferred | requests | interactive after | prefetched while typing |');
console.log('|---|---:|---:|---:|---:|');
for (const [name, runs] of Object.entries(rows)) {
  if (!runs.length) continue;
  const kb = median(runs.map((r) => r.bytes)) / 1024;
  const typed = runs[0].typed === undefined ? '' : `${(median(runs.map((r) => r.typed)) / 1024).toFixed(1)} KiB`;
  console.log(`| ${name} | ${kb.toFixed(1)} KiB | ${median(runs.map((r) => r.requests))} | ${(median(runs.map((r) => r.ms)) / 1000).toFixed(2)} s | ${typed} |`);
}
