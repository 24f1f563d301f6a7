// Allocation journey on the embedded default's simulated nodes: an admin gives a team GPU
// quotas on the team page; a member requests a 1g.10gb slice and sees it active with the
// MIG UUID the agent reported; a second request beyond the per-user cap waits for approval
// and the team admin approves it; a request the cluster cannot hold shows its queue
// position and the reason it waits.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  withPage, hydrated, eventually, BASE, ADMIN_SECOND_PASSWORD, fileBrowser, runTag, signInAs, api,
} from './helpers.mjs';

const browser = fileBrowser();

const suffix = runTag();
const TEAM = `GPU Lab ${suffix}`;
const MEMBER = `alloc-member-${suffix}`;
const LEAD = `alloc-lead-${suffix}`;
const PASSWORD = 'allocation password 1';
let teamId;
let pendingUrl;

async function setQuota(page, model, guaranteed, limit, perUser) {
  const form = page.locator('[data-testid=quota-form]');
  await form.locator('select[name=model]').selectOption(model);
  await form.locator('input[name=guaranteed]').fill(String(guaranteed));
  await form.locator('input[name=limit]').fill(String(limit));
  await form.locator('input[name=per_user]').fill(String(perUser));
  await form.locator('button[type=submit]').click();
  await page.locator(`[data-testid=quota-row][data-model="${model}"]`).waitFor();
}

test('an admin gives the team GPU quotas on the team page', async () => {
  await withPage(browser, 'alloc-admin', async (page, errors) => {
    await signInAs(page, 'admin', ADMIN_SECOND_PASSWORD);
    const team = await api(page, 'POST', '/api/v1/teams', { name: TEAM });
    teamId = team.id;
    for (const [user, role] of [[MEMBER, 'member'], [LEAD, 'team_admin']]) {
      await api(page, 'POST', '/api/v1/users', { username: user, password: PASSWORD });
      await api(page, 'POST', `/api/v1/teams/${teamId}/members`, { username: user, role });
    }
    await page.goto(`${BASE}/teams/${teamId}`);
    await hydrated(page);
    // One H100 slice per member; five whole A100s' worth, more than one node has.
    await setQuota(page, 'H100-80GB', 2, 2, 1);
    await setQuota(page, 'A100-SXM4-40GB', 35, 35, 35);
    const h100 = page.locator('[data-testid=quota-row][data-model="H100-80GB"]');
    assert.match(await h100.innerText(), /2/);
    assert.deepEqual(errors, [], 'no uncaught page errors');
  });
});

async function request(page, kind, count = '1') {
  await page.goto(`${BASE}/allocations`);
  await hydrated(page);
  const form = page.locator('[data-testid=request-form]');
  await form.locator('select[name=team_id]').selectOption(teamId);
  await eventually(async () => (await form.locator(`select[name=kind] option[value="${kind}"]`).count()) === 1,
    { what: `kind ${kind} offered` });
  await form.locator('select[name=kind]').selectOption(kind);
  await form.locator('input[name=count]').fill(count);
  await form.locator('button[type=submit]').click();
  await page.waitForURL(/\/allocations\/[0-9a-f-]{36}$/);
  return page.locator('[data-testid=allocation-detail]');
}

test('a member gets a 1g.10gb slice with its MIG UUID, and sees why others wait', async () => {
  await withPage(browser, 'alloc-member', async (page, errors) => {
    await signInAs(page, MEMBER, PASSWORD);

    const detail = await request(page, 'H100-80GB:1g.10gb');
    await eventually(async () => (await detail.getAttribute('data-state')) === 'active',
      { what: 'the slice to become active', timeoutMs: 60000 });
    const devices = await page.locator('[data-testid=devices]').innerText();
    assert.match(devices, /MIG-[0-9a-f-]+/, 'the MIG UUID the agent reported');

    // Beyond the per-user cap (within the team's guarantee): waits for a team admin.
    const second = await request(page, 'H100-80GB:1g.10gb');
    assert.equal(await second.getAttribute('data-state'), 'pending_approval');
    assert.match(await page.locator('[data-testid=why-pending]').innerText(), /approval/i);
    pendingUrl = page.url();

    // Five whole A100s on one node: no node has that many, so it queues and says why.
    const queued = await request(page, 'A100-SXM4-40GB:whole', '5');
    assert.equal(await queued.getAttribute('data-state'), 'queued');
    await eventually(async () => {
      const pos = page.locator('[data-testid=queue-position]');
      return (await pos.count()) === 1 && /1/.test(await pos.innerText());
    }, { what: 'a queue position' });
    assert.ok((await page.locator('[data-testid=pending-reason]').innerText()).length > 10);
    assert.match(await page.locator('[data-testid=why-pending] [data-testid=eta]').innerText(), /unknown/i);
    // Cancel it, so it does not wait forever.
    await page.click('[data-testid=release]');
    await eventually(async () => (await queued.getAttribute('data-state')) === 'cancelled',
      { what: 'the request to be cancelled' });

    // The list shows the active slice.
    await page.goto(`${BASE}/allocations`);
    await hydrated(page);
    await page.locator('tr[data-testid=allocation-row][data-state=active]').first().waitFor();
    assert.deepEqual(errors, [], 'no uncaught page errors');
  });
});

test('the team admin approves the waiting request', async () => {
  await withPage(browser, 'alloc-lead', async (page, errors) => {
    await signInAs(page, LEAD, PASSWORD);
    await page.goto(pendingUrl);
    await hydrated(page);
    const detail = page.locator('[data-testid=allocation-detail]');
    assert.equal(await detail.getAttribute('data-state'), 'pending_approval');
    await page.fill('[data-testid=decide-form] input[name=reason], [data-testid=decide-form] textarea[name=reason]', 'deadline on Friday');
    await page.click('[data-testid=approve]');
    await eventually(async () => (await detail.getAttribute('data-state')) !== 'pending_approval',
      { what: 'the approval to take effect' });
    await eventually(async () => (await detail.getAttribute('data-state')) === 'active',
      { what: 'the approved slice to become active', timeoutMs: 60000 });
    assert.match(await page.locator('[data-testid=history]').innerText(), /deadline on Friday/);
    assert.deepEqual(errors, [], 'no uncaught page errors');
  });
});

test('the list updates itself from the live stream, without polling', async () => {
  await withPage(browser, 'alloc-live', async (page, errors) => {
    await signInAs(page, MEMBER, PASSWORD);
    await page.goto(`${BASE}/allocations`);
    await hydrated(page);
    const rows = page.locator('tr[data-testid=allocation-row]');
    await rows.first().waitFor();
    const before = await rows.count();
    // Longer than the list's poll period (5 s): with the stream open, it does not ask again.
    const reloads = [];
    page.on('request', (r) => { if (r.url().includes('/fn/list_allocations')) reloads.push(Date.now()); });
    await page.waitForTimeout(7000);
    assert.deepEqual(reloads, [], 'no polling while the live stream is open');

    // A request made elsewhere (the API, with this browser's session): the list shows it.
    const made = await page.request.post(`${BASE}/api/v1/allocations`, {
      headers: { origin: BASE },
      data: { team_id: teamId, kind: 'A100-SXM4-40GB:whole', count: 5 },
    });
    assert.equal(made.status(), 201, await made.text());
    const id = (await made.json()).id;
    const asked = Date.now();
    await eventually(async () => (await rows.count()) > before,
      { what: 'the new request in the list', timeoutMs: 4000, intervalMs: 100 });
    assert.ok(reloads.length >= 1 && reloads[0] - asked < 3000, `reloaded from the stream: ${reloads.map((t) => t - asked)}`);
    await page.locator(`tr[data-testid=allocation-row][data-state=queued][data-id="${id}"]`).waitFor();
    const cancelled = await page.request.post(`${BASE}/api/v1/allocations/${id}/release`, { headers: { origin: BASE } });
    assert.equal(cancelled.status(), 200, await cancelled.text());
    assert.deepEqual(errors, [], 'no uncaught page errors');
  });
});

test('the admin sees the approval in the audit trail and the queue page', async () => {
  await withPage(browser, 'alloc-audit', async (page, errors) => {
    await signInAs(page, 'admin', ADMIN_SECOND_PASSWORD);
    await page.goto(`${BASE}/admin/audit?action=allocation.approve`);
    await hydrated(page);
    const row = page.locator('tr[data-testid=audit-row][data-action="allocation.approve"]', { hasText: LEAD });
    await row.first().waitFor();
    await page.goto(`${BASE}/admin/queue`);
    await hydrated(page);
    await page.locator('h1', { hasText: /queue/i }).waitFor();
    assert.deepEqual(errors, [], 'no uncaught page errors');
  });
});

test('a member made a viewer while the form is open is told plainly why the request is refused', async () => {
  const demoted = `alloc-demoted-${suffix}`;
  await withPage(browser, 'alloc-demote-admin', async (admin) => {
    await signInAs(admin, 'admin', ADMIN_SECOND_PASSWORD);
    const user = await api(admin, 'POST', '/api/v1/users', { username: demoted, password: PASSWORD });
    await api(admin, 'POST', `/api/v1/teams/${teamId}/members`, { username: demoted, role: 'member' });
    await withPage(browser, 'alloc-demoted', async (page, errors) => {
      await signInAs(page, demoted, PASSWORD);
      await page.goto(`${BASE}/allocations`);
      await hydrated(page);
      const form = page.locator('[data-testid=request-form]');
      await form.locator('select[name=team_id]').selectOption(teamId);
      const slice = 'H100-80GB:1g.10gb';
      await eventually(async () => (await form.locator(`select[name=kind] option[value="${slice}"]`).count()) === 1,
        { what: 'the slice offered' });
      await form.locator('select[name=kind]').selectOption(slice);
      // The form was drawn for a member; the role changes before it is sent.
      await api(admin, 'PUT', `/api/v1/teams/${teamId}/members/${user.id}`, { role: 'viewer' });
      await form.locator('button[type=submit]').click();
      const refusal = page.locator('[data-testid=request-error]');
      await refusal.waitFor();
      assert.equal(await refusal.innerText(), 'You may not request GPUs for this team (viewers cannot).');
      assert.match(page.url(), /\/allocations$/, 'the form stays where it was');
      const mine = await api(page, 'GET', '/api/v1/allocations?mine=true');
      assert.equal(mine.total, 0, 'nothing was requested');
      assert.deepEqual(errors, [], 'no uncaught page errors');
    });
  });
});
