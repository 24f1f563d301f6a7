// Telemetry on the nodes page: the simulated agents report every 10 s; each GPU shows its
// newest values and a sparkline, says "n/a (MIG on)" where the driver has no utilization,
// and the values are there without JavaScript too.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  withPage, hydrated, signIn, eventually, BASE, ADMIN_SECOND_PASSWORD, fileBrowser,
} from './helpers.mjs';

const browser = fileBrowser();
let signedIn; // the admin's cookies, for the page without JavaScript

const gpuCard = (page, model, mig) => page.locator('[data-testid=gpu]', {
  has: page.locator('.gpu-head', {
    has: page.locator('[data-testid=gpu-model]', { hasText: model }),
  }).filter({ has: page.locator('.badge', { hasText: new RegExp(`^${mig}$`) }) }),
});

// Reloads /nodes until all six simulated GPUs show telemetry and an H100 has had MIG
// switched on by its demo layout (and reported since).
async function waitForTelemetry(page) {
  await eventually(async () => {
    const gpus = await page.locator('[data-testid=gpu]').count();
    const shown = await page.locator('[data-testid=gpu] [data-testid=telemetry]').count();
    const migOn = gpuCard(page, 'H100-80GB', 'MIG on')
      .locator('[data-testid=telemetry-utilization]', { hasText: 'n/a (MIG on)' });
    if (gpus === 6 && shown === 6 && await migOn.count() > 0) return true;
    await page.reload();
    return false;
  }, { what: 'telemetry for every GPU', timeoutMs: 45000, intervalMs: 2000 });
}

test('every GPU shows its current values and a history chart', async () => {
  await withPage(browser, 'telemetry-nodes', async (page, errors) => {
    await signIn(page, 'admin', ADMIN_SECOND_PASSWORD);
    await page.waitForURL(`${BASE}/`);
    await page.goto(`${BASE}/nodes`);
    await hydrated(page);
    await waitForTelemetry(page);
    signedIn = await page.context().storageState();

    // Admins see the portal's own server process: the embedded default runs one, leading.
    const servers = page.locator('[data-testid=server-list] tbody tr');
    assert.equal(await servers.count(), 1, 'one portal server');
    assert.equal(await servers.first().locator('.badge').innerText(), 'leader');

    // MIG on: the driver has no whole-GPU utilization, and the page does not make one up.
    const h100 = gpuCard(page, 'H100-80GB', 'MIG on').first();
    const na = h100.locator('[data-testid=telemetry-utilization]');
    assert.equal(await na.innerText(), 'n/a (MIG on)');
    assert.match(await h100.locator('[data-testid=telemetry-mig]').innerText(),
      /^[1-9]\d* devices?, \d+ process(es)?$/);

    // MIG off: a percentage, and every gauge a number with its unit.
    const a100 = gpuCard(page, 'A100-SXM4-40GB', 'MIG off').first();
    assert.match(await a100.locator('[data-testid=telemetry-utilization]').innerText(), /^\d{1,3} %$/);
    assert.match(await a100.locator('[data-testid=telemetry-memory]').innerText(),
      /^[\d.]+ GiB \/ [\d.]+ GiB$/);
    assert.match(await a100.locator('[data-testid=telemetry-temperature]').innerText(), /^\d+ °C$/);
    assert.match(await a100.locator('[data-testid=telemetry-power]').innerText(), /^\d+ W$/);
    assert.equal(await a100.locator('[data-testid=telemetry-mig]').innerText(), 'off');
    assert.equal(await a100.locator('.meter').count(), 1, 'memory bar');

    const paths = page.locator('[data-testid=sparkline] path');
    assert.ok(await paths.count() >= 6, 'at least a memory line per GPU');
    assert.match(await paths.first().getAttribute('d'), /^M[\d.]+ [\d.]+/);
    assert.match(await a100.locator('figure.spark').getAttribute('title'),
      /UTC \(\d+ samples?\) · memory \d+–\d+ % · utilization \d+–\d+ %$/);
    assert.equal(await page.locator('[data-testid=telemetry-empty]').count(), 0);

    // "Refresh" reloads the node cards and, with them, their telemetry.
    await page.click('button.refresh');
    await eventually(
      async () => await page.locator('[data-testid=gpu] [data-testid=telemetry]').count() === 6,
      { what: 'telemetry after Refresh', timeoutMs: 10000, intervalMs: 250 },
    );
    assert.deepEqual(errors, [], 'no uncaught page errors');
  });
});

test('telemetry is server-rendered: it shows without JavaScript', async () => {
  assert.ok(signedIn, 'the first test signed in');
  await withPage(browser, 'telemetry-no-js', async (page) => {
    const response = await page.goto(`${BASE}/nodes`);
    assert.equal(response.status(), 200);
    assert.equal(await page.locator('[data-testid=gpu] [data-testid=telemetry]').count(), 6);
    assert.equal(await page.locator('text=Loading telemetry').count(), 0);
    const h100 = gpuCard(page, 'H100-80GB', 'MIG on').first();
    assert.equal(await h100.locator('[data-testid=telemetry-utilization]').innerText(),
      'n/a (MIG on)');
    assert.ok(await page.locator('[data-testid=sparkline] path').count() >= 6);
  }, { javaScriptEnabled: false, storageState: signedIn });
});
