// Accessibility and the researcher's day on small and large screens: axe-core (npm) finds
// no serious or critical violation on any page, as a platform admin and, on the pages a
// member uses, as a member; the dashboard and the jobs page fit a 390 px phone without
// horizontal scrolling; the dashboard shows the member her running job and her own spend
// this month, her team admin the request waiting for them, the platform admin node health
// and the queue, and nobody another team's work; the job form's "a new GPU" says what it
// costs and starts from the member's last choice. With TESSERA_DOCS_IMAGES=1 it writes the
// screenshots in docs/images/ (always in e2e/artifacts/).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, mkdirSync } from 'node:fs';
import {
  withPage, hydrated, signInAs, eventually, BASE, fileBrowser, runTag, api, axeViolations, settled, signInAdmin,
} from './helpers.mjs';

const browser = fileBrowser();

const suffix = runTag();
const TEAM = `A11y Lab ${suffix}`;
const OTHER_TEAM = `A11y Other ${suffix}`;
const MEMBER = `a11y-member-${suffix}`;
const LEAD = `a11y-lead-${suffix}`;
const OTHER = `a11y-other-${suffix}`;
const PASSWORD = 'a11y password 1';
const JOB = `a11y-job-${suffix}`;
const OTHER_JOB = `other-secret-${suffix}`;
const A100 = 'A100-SXM4-40GB:whole';
const SLICE = 'H100-80GB:1g.10gb';
let teamId;
let otherTeamId;
let allocationId;
let otherAllocationId;
let waitingId;
let jobId;

const active = async (page, id) => (await api(page, 'GET', `/api/v1/allocations/${id}`)).state === 'active';

// "1,234.56" → 123456.
const minor = (s) => {
  const m = s.replace(/,/g, '').trim().match(/^(-?)(\d+)(?:\.(\d{1,2}))?/);
  assert.ok(m, `an amount: ${s}`);
  return Number(m[2]) * 100 + Number((m[3] ?? '0').padEnd(2, '0'));
};

async function assertAccessible(page, path) {
  await page.goto(`${BASE}${path}`);
  await hydrated(page);
  await settled(page);
  const found = await axeViolations(page);
  assert.deepEqual(found, [], `${path}: serious or critical accessibility violations`);
}

async function screenshot(page, name) {
  mkdirSync('artifacts', { recursive: true });
  await page.screenshot({ path: `artifacts/${name}`, fullPage: true });
  if (process.env.TESSERA_DOCS_IMAGES === '1') {
    mkdirSync('../docs/images', { recursive: true });
    copyFileSync(`artifacts/${name}`, `../docs/images/${name}`);
  }
}

test('setup: two teams, a member holding a priced whole A100 and running a job, a request waiting for her team admin', async () => {
  await withPage(browser, 'a11y-setup', async (page) => {
    await signInAdmin(page);
    const hour = `${new Date().toISOString().slice(0, 13)}:00:00Z`;
    // 3,600.00 an hour: a second of it is a visible 1.00.
    await api(page, 'POST', '/api/v1/rates', { kind: A100, price_minor_per_hour: 360000, effective_from: hour });
    teamId = (await api(page, 'POST', '/api/v1/teams', { name: TEAM })).id;
    otherTeamId = (await api(page, 'POST', '/api/v1/teams', { name: OTHER_TEAM })).id;
    for (const [user, team, role] of [[MEMBER, teamId, 'member'], [LEAD, teamId, 'team_admin'], [OTHER, otherTeamId, 'member']]) {
      await api(page, 'POST', '/api/v1/users', { username: user, password: PASSWORD });
      await api(page, 'POST', `/api/v1/teams/${team}/members`, { username: user, role });
    }
    await api(page, 'PUT', `/api/v1/teams/${teamId}/quotas/A100-SXM4-40GB`, { guaranteed: 14, limit: 14, per_user: 14 });
    // One slice per member without asking; within the guarantee, her team admin approves more.
    await api(page, 'PUT', `/api/v1/teams/${teamId}/quotas/H100-80GB`, { guaranteed: 7, limit: 7, per_user: 1 });
    await api(page, 'PUT', `/api/v1/teams/${otherTeamId}/quotas/H100-80GB`, { guaranteed: 1, limit: 1, per_user: 1 });
  });
  await withPage(browser, 'a11y-setup-member', async (page) => {
    await signInAs(page, MEMBER, PASSWORD);
    // A few seconds of an A100, given back: metered (every second here) into her spend.
    const first = (await api(page, 'POST', '/api/v1/allocations', { team_id: teamId, kind: A100 })).id;
    await eventually(() => active(page, first), { what: 'her first A100 to be active', timeoutMs: 60000 });
    await new Promise((r) => setTimeout(r, 3000));
    await api(page, 'POST', `/api/v1/allocations/${first}/release`);
    allocationId = (await api(page, 'POST', '/api/v1/allocations',
      { team_id: teamId, kind: A100, duration_minutes: 120, purpose: 'a11y e2e' })).id;
    await eventually(() => active(page, allocationId), { what: 'her A100 to be active', timeoutMs: 60000 });
    jobId = (await api(page, 'POST', '/api/v1/jobs',
      { allocation_id: allocationId, name: JOB, command: 'sleep 600' })).id;
    const waiting = await api(page, 'POST', '/api/v1/allocations', { team_id: teamId, kind: SLICE, count: 2 });
    waitingId = waiting.id;
    assert.equal(waiting.state, 'pending_approval');
    assert.equal(waiting.approver, 'team_admin');
  });
  await withPage(browser, 'a11y-setup-other', async (page) => {
    await signInAs(page, OTHER, PASSWORD);
    otherAllocationId = (await api(page, 'POST', '/api/v1/allocations', { team_id: otherTeamId, kind: SLICE })).id;
    await eventually(() => active(page, otherAllocationId), { what: 'the other slice to be active', timeoutMs: 60000 });
    await api(page, 'POST', '/api/v1/jobs', { allocation_id: otherAllocationId, name: OTHER_JOB, command: 'sleep 600' });
  });
});

test('every page has no serious or critical accessibility violation, as a platform admin', async () => {
  await withPage(browser, 'a11y-admin', async (page, errors) => {
    await signInAdmin(page);
    const paths = [
      '/', '/account', '/nodes', '/allocations', `/allocations/${allocationId}`, `/allocations/${waitingId}`,
      '/notebooks', '/jobs', `/workloads/${jobId}`, '/teams', `/teams/${teamId}`, `/teams/${teamId}/statement`,
      '/usage', '/bookings', '/admin/users', '/admin/join-tokens', '/admin/audit', '/admin/queue', '/admin/billing',
    ];
    for (const path of paths) await assertAccessible(page, path);
    assert.deepEqual(errors, [], 'no uncaught page errors');
  });
  // Signed out: the sign-in page.
  await withPage(browser, 'a11y-login', async (page) => {
    await assertAccessible(page, '/login');
  });
});

test("the member's pages have no serious or critical accessibility violation", async () => {
  await withPage(browser, 'a11y-member', async (page, errors) => {
    await signInAs(page, MEMBER, PASSWORD);
    for (const path of [
      '/', '/account', '/nodes', '/allocations', `/allocations/${allocationId}`, '/notebooks', '/jobs',
      `/workloads/${jobId}`, '/teams', `/teams/${teamId}`, '/usage', '/bookings',
    ]) {
      await assertAccessible(page, path);
    }
    // The job form with "a new GPU" chosen: its own fields are labelled too.
    await page.goto(`${BASE}/jobs`);
    await hydrated(page);
    await page.locator('[data-testid=submit-form] select[name=allocation_id]').selectOption('new');
    await page.locator('[data-testid=own-gpu]').waitFor();
    assert.deepEqual(await axeViolations(page), [], '/jobs with a new GPU');
    assert.deepEqual(errors, [], 'no uncaught page errors');
  });
});

test('the forms are keyboard-reachable and show where the focus is', async () => {
  await withPage(browser, 'a11y-keyboard', async (page) => {
    await signInAs(page, MEMBER, PASSWORD);
    await page.goto(`${BASE}/jobs`);
    await hydrated(page);
    const form = page.locator('[data-testid=submit-form]');
    await form.locator('select[name=allocation_id]').waitFor();
    // Tab from the top of the page until the command field has the focus.
    let reached = false;
    for (let i = 0; i < 60 && !reached; i++) {
      await page.keyboard.press('Tab');
      reached = await page.evaluate(() => document.activeElement?.id === 'job-command');
    }
    assert.ok(reached, 'Tab reaches the command field');
    const outline = await page.evaluate(() => {
      const s = getComputedStyle(document.activeElement);
      return { style: s.outlineStyle, width: parseFloat(s.outlineWidth) };
    });
    assert.notEqual(outline.style, 'none', 'the focused field shows an outline');
    assert.ok(outline.width >= 2, `outline ${outline.width}px`);
    // Every visible form control on the page has a label (axe says so too; this names them).
    const unlabelled = await page.evaluate(() => [...document.querySelectorAll('input:not([type=hidden]), select, textarea')]
      .filter((el) => el.offsetParent !== null)
      .filter((el) => !(el.labels?.length || el.getAttribute('aria-label') || el.getAttribute('aria-labelledby')))
      .map((el) => el.name || el.id));
    assert.deepEqual(unlabelled, []);
  });
});

test('the dashboard and the jobs page fit a 390 px phone without horizontal scrolling', async () => {
  await withPage(browser, 'a11y-phone', async (page, errors) => {
    await signInAs(page, MEMBER, PASSWORD);
    for (const path of ['/', '/jobs']) {
      await page.goto(`${BASE}${path}`);
      await hydrated(page);
      await settled(page);
      const { scroll, client } = await page.evaluate(() => ({
        scroll: document.scrollingElement.scrollWidth, client: document.scrollingElement.clientWidth,
      }));
      assert.ok(scroll <= client, `${path}: ${scroll} px wide in a ${client} px viewport`);
      await page.screenshot({ path: `artifacts/phone${path === '/' ? '-dashboard' : path.replace('/', '-')}.png`, fullPage: true });
    }
    assert.deepEqual(errors, [], 'no uncaught page errors');
  }, { viewport: { width: 390, height: 844 } });
});

test("the dashboard shows the member her running job and her spend, and no other team's work", async () => {
  await withPage(browser, 'a11y-dashboard', async (page, errors) => {
    await signInAs(page, MEMBER, PASSWORD);
    await page.locator(`tr[data-testid=my-work-row][data-what=job]`, { hasText: JOB }).waitFor();
    await page.locator(`tr[data-testid=my-work-row][data-what=allocation] a[href="/allocations/${allocationId}"]`).waitFor();
    // Her spend this month: what the usage API says of her (read before and after), above zero.
    await eventually(async () => {
      const before = (await api(page, 'GET', `/api/v1/usage?team=${teamId}`)).total.cost_minor;
      await page.reload();
      await hydrated(page);
      const shown = minor(await page.locator('[data-testid=my-spend]').innerText());
      const after = (await api(page, 'GET', `/api/v1/usage?team=${teamId}`)).total.cost_minor;
      return shown > 0 && before <= shown && shown <= after;
    }, { what: 'her metered spend on the dashboard', timeoutMs: 60000 });
    assert.match(await page.locator('[data-testid=my-gpu-hours]').innerText(), /^\d+\.\d\d$/);
    // Her team's budget line is there; a member approves nothing and sees no node health.
    await page.locator(`[data-testid=team-quotas][data-team="${teamId}"] [data-testid=team-spend]`).waitFor();
    assert.equal(await page.locator('[data-testid=pending-approvals]').count(), 0);
    assert.equal(await page.locator('[data-testid=node-health]').count(), 0);
    // Nothing of the other team: not its job, its allocation, its user or its name.
    const html = await page.content();
    for (const secret of [OTHER_JOB, otherAllocationId, OTHER, OTHER_TEAM]) {
      assert.ok(!html.includes(secret), `the dashboard shows ${secret}`);
    }
    await page.setViewportSize({ width: 1366, height: 900 });
    await screenshot(page, 'dashboard.png');
    assert.deepEqual(errors, [], 'no uncaught page errors');
  }, { viewport: { width: 1366, height: 900 } });
  // And the other team's member sees none of hers.
  await withPage(browser, 'a11y-dashboard-other', async (page) => {
    await signInAs(page, OTHER, PASSWORD);
    await page.locator('tr[data-testid=my-work-row][data-what=job]', { hasText: OTHER_JOB }).waitFor();
    await settled(page);
    const html = await page.content();
    for (const secret of [JOB, allocationId, waitingId, MEMBER, TEAM]) {
      assert.ok(!html.includes(secret), `the other team's dashboard shows ${secret}`);
    }
  });
});

test('her team admin sees the request waiting for them; the platform admin sees node health and the queue', async () => {
  await withPage(browser, 'a11y-lead', async (page, errors) => {
    await signInAs(page, LEAD, PASSWORD);
    const panel = page.locator('[data-testid=pending-approvals]');
    await panel.waitFor();
    await panel.locator(`a[href="/allocations/${waitingId}"]`).waitFor();
    assert.match(await panel.locator('[data-testid=pending-approvals-count]').innerText(), /^1 request waits/);
    assert.ok(!(await page.content()).includes(OTHER_JOB));
    assert.equal(await page.locator('[data-testid=node-health]').count(), 0);
    assert.deepEqual(errors, [], 'no uncaught page errors');
  });
  await withPage(browser, 'a11y-admin-dashboard', async (page, errors) => {
    await signInAdmin(page);
    const health = page.locator('[data-testid=node-health]');
    await health.waitFor();
    const nodes = (await api(page, 'GET', '/api/v1/nodes?limit=200')).items;
    const up = nodes.filter((n) => n.online && !n.revoked).length;
    assert.equal(Number(await health.locator('[data-testid=nodes-up]').innerText()), up);
    const queued = await api(page, 'GET', '/api/v1/allocations?state=pending&limit=1');
    assert.match(await health.locator('[data-testid=queue-length]').innerText(), new RegExp(`^${queued.total} request`));
    // The platform admin may decide every waiting request, hers included.
    await page.locator(`[data-testid=pending-approvals] a[href="/allocations/${waitingId}"]`).waitFor();
    assert.deepEqual(errors, [], 'no uncaught page errors');
  });
});

test("the job form's new GPU says what it costs and starts from her last choice", async () => {
  await withPage(browser, 'a11y-job-form', async (page, errors) => {
    await signInAs(page, MEMBER, PASSWORD);
    await page.goto(`${BASE}/jobs`);
    await hydrated(page);
    const form = page.locator('[data-testid=submit-form]');
    // Her A100 runs a job, so nothing of hers is free: a new GPU is the default.
    assert.equal(await form.locator('select[name=allocation_id]').inputValue(), 'new');
    await form.getByLabel('GPU or MIG slice').selectOption(A100);
    await form.getByLabel('How many').fill('2');
    await form.getByLabel('Time limit (hours)').fill('3');
    // 2 × 3 h × 3,600.00.
    const estimate = form.locator('[data-testid=own-gpu-estimate]');
    await eventually(async () => /21,?600\.00/.test(await estimate.innerText()), { what: 'the estimate for 2 A100s for 3 hours' });
    await form.getByLabel('Command').fill('echo remembered');
    await form.getByLabel('Name (optional)').fill(`${JOB}-2`);
    await page.setViewportSize({ width: 1366, height: 900 });
    await screenshot(page, 'job-form.png');
    // Submitted with a retry count the server refuses: no job, but the choice is hers now.
    await form.getByLabel('Retries on failure').fill('9');
    await form.getByRole('button', { name: 'Submit job' }).click();
    await form.locator('.field-error').first().waitFor();
    await page.goto(`${BASE}/jobs`);
    await hydrated(page);
    await form.locator('select[name=allocation_id]').selectOption('new');
    await eventually(async () => (await form.getByLabel('GPU or MIG slice').inputValue()) === A100,
      { what: 'the remembered kind' });
    assert.equal(await form.getByLabel('How many').inputValue(), '2');
    assert.equal(await form.getByLabel('Time limit (hours)').inputValue(), '3');
    await eventually(async () => /21,?600\.00/.test(await form.locator('[data-testid=own-gpu-estimate]').innerText()),
      { what: 'the estimate of the remembered choice' });
    assert.deepEqual(errors, [], 'no uncaught page errors');
  }, { viewport: { width: 1366, height: 900 } });
});

test('cleanup: the jobs stop and the GPUs are given back', async () => {
  await withPage(browser, 'a11y-cleanup', async (page) => {
    await signInAs(page, MEMBER, PASSWORD);
    await api(page, 'POST', `/api/v1/workloads/${jobId}/stop`);
    await api(page, 'POST', `/api/v1/allocations/${allocationId}/release`);
    await api(page, 'POST', `/api/v1/allocations/${waitingId}/release`);
  });
  await withPage(browser, 'a11y-cleanup-other', async (page) => {
    await signInAs(page, OTHER, PASSWORD);
    await api(page, 'POST', `/api/v1/allocations/${otherAllocationId}/release`);
  });
});
