// Billing journey: an admin sets a price on the billing page; a member's 1g.10gb slice runs
// for a few seconds on a simulated H100 and is released; the metering pass (every second in
// `cargo xtask e2e`) bills it at the whole-H100 price pro rata (1/7); the usage page's chart
// and the team statement show the cost; the statement's CSV downloads and its BilledCost
// total equals the statement's total.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  withPage, hydrated, signIn, eventually, BASE, ADMIN_SECOND_PASSWORD, fileBrowser, runTag, api, teamWith,
} from './helpers.mjs';

const browser = fileBrowser();

const suffix = runTag();
const TEAM = `Billing Lab ${suffix}`;
const MEMBER = `bill-member-${suffix}`;
const PASSWORD = 'billing password 1';
let teamId;

// RFC 4180 rows (quoted fields may hold commas and doubled quotes).
function parseCsv(text) {
  const rows = [];
  let row = [];
  let field = '';
  let quoted = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (quoted) {
      if (c === '"' && text[i + 1] === '"') { field += '"'; i++; } else if (c === '"') quoted = false;
      else field += c;
    } else if (c === '"') quoted = true;
    else if (c === ',') { row.push(field); field = ''; } else if (c === '\n') { row.push(field); rows.push(row); row = []; field = ''; } else field += c;
  }
  if (field || row.length) { row.push(field); rows.push(row); }
  return rows;
}

// "12.34" → 1234 (minor units, exact).
const minor = (s) => {
  const m = s.trim().match(/^(-?)(\d+)(?:\.(\d{1,2}))?/);
  assert.ok(m, `an amount: ${s}`);
  const v = Number(m[2]) * 100 + Number((m[3] ?? '0').padEnd(2, '0'));
  return m[1] ? -v : v;
};

test('an admin sets a price on the billing page', async () => {
  await withPage(browser, 'billing-admin', async (page, errors) => {
    await signIn(page, 'admin', ADMIN_SECOND_PASSWORD);
    await page.waitForURL(`${BASE}/`);
    teamId = await teamWith(page, {
      team: TEAM, members: [[MEMBER, 'member']], password: PASSWORD, model: 'H100-80GB', quota: { guaranteed: 7, limit: 7, per_user: 7 },
    });

    await page.goto(`${BASE}/admin/billing`);
    await hydrated(page);
    const form = page.locator('[data-testid=rate-form]');
    await form.locator('select[name=kind]').selectOption('H100-80GB:whole');
    // 36,000.00 per whole-H100 hour: a 1g.10gb slice costs 1.43 a second, visible at once.
    await form.locator('input[name=price]').fill('36000.00');
    const hour = `${new Date().toISOString().slice(0, 13)}:00`;
    await form.locator('input[name=effective_from]').fill(hour);
    await form.locator('button[type=submit]').click();
    const row = page.locator('tr[data-testid=rate-row][data-kind="H100-80GB:whole"]');
    await row.first().waitFor();
    assert.match(await row.first().innerText(), /36,?000\.00/);
    assert.deepEqual(errors, [], 'no uncaught page errors');
  });
});

test("a member's slice runs, is metered, and shows on the usage page", async () => {
  await withPage(browser, 'billing-member', async (page, errors) => {
    await signIn(page, MEMBER, PASSWORD);
    await page.waitForURL(`${BASE}/`);
    const a = await api(page, 'POST', '/api/v1/allocations',
      { team_id: teamId, kind: 'H100-80GB:1g.10gb', purpose: 'billing e2e' });
    await eventually(async () => (await api(page, 'GET', `/api/v1/allocations/${a.id}`)).state === 'active',
      { what: 'the slice to become active', timeoutMs: 60000 });
    await new Promise((r) => setTimeout(r, 3000));
    await api(page, 'POST', `/api/v1/allocations/${a.id}/release`);
    let cost = 0;
    await eventually(async () => {
      const u = await api(page, 'GET', `/api/v1/usage?team=${teamId}`);
      cost = u.total.cost_minor;
      return cost > 0;
    }, { what: 'the released slice to be metered', timeoutMs: 30000 });

    await page.goto(`${BASE}/usage?team=${teamId}`);
    await hydrated(page);
    await page.locator('[data-testid=usage-page]').waitFor();
    assert.equal(minor((await page.locator('[data-testid=usage-total-cost]').innerText()).replace(/,/g, '')), cost);
    const chart = page.locator('[data-testid=cost-chart]');
    assert.ok(await chart.locator('rect').count() > 0, 'the cost chart draws bars');
    assert.deepEqual(errors, [], 'no uncaught page errors');
  });
});

test('the statement shows the cost and its CSV adds up to it', async () => {
  await withPage(browser, 'billing-statement', async (page, errors) => {
    await signIn(page, 'admin', ADMIN_SECOND_PASSWORD);
    await page.waitForURL(`${BASE}/`);
    await page.goto(`${BASE}/teams/${teamId}/statement`);
    await hydrated(page);
    const total = minor((await page.locator('[data-testid=statement-total]').first().innerText()).replace(/,/g, ''));
    assert.ok(total > 0, 'the statement shows a cost');
    await page.locator('tr[data-testid=statement-line][data-kind="H100-80GB:1g.10gb"]').waitFor();
    const href = await page.locator('[data-testid=statement-csv]').getAttribute('href');
    const r = await page.request.get(new URL(href, BASE).toString());
    assert.equal(r.status(), 200);
    assert.match(r.headers()['content-type'], /text\/csv/);
    const [header, ...rows] = parseCsv(await r.text());
    const billed = header.indexOf('BilledCost');
    assert.ok(billed >= 0 && header.includes('ResourceId') && header.includes('SubAccountName'));
    assert.ok(rows.length >= 1);
    assert.equal(rows.reduce((s, row) => s + minor(row[billed]), 0), total, 'CSV total = statement total');
    assert.ok(rows.every((row) => row[header.indexOf('ResourceId')].startsWith('MIG-')), 'MIG UUIDs as resources');
    assert.deepEqual(errors, [], 'no uncaught page errors');
  });
});
