// Fractional GPUs on the embedded default's simulated nodes: an admin shares an idle GPU
// (whichever earlier tests left idle) with MPS from the Nodes page and gives a team a shared quota; a member asks for a
// quarter of a GPU through the request form and sees it active on the shared GPU, and the
// Nodes page shows the share. Everything is put back afterwards (the share released, the
// GPU unshared) for the tests that follow.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  withPage, hydrated, eventually, BASE, ADMIN_SECOND_PASSWORD, fileBrowser, runTag, signInAs,
} from './helpers.mjs';

const browser = fileBrowser();

const suffix = runTag();
const TEAM = `Shared Lab ${suffix}`;
const MEMBER = `share-member-${suffix}`;
const PASSWORD = 'share password 123';
let teamId;
let shared; // { node, gpu, model }

// REST calls with the page's session: `[status, body]`.
async function call(page, method, path, data) {
  const r = await page.request.fetch(`${BASE}${path}`, {
    method, data, headers: { origin: BASE },
  });
  return [r.status(), await r.json().catch(() => null)];
}

async function api(page, method, path, data) {
  const [status, body] = await call(page, method, path, data);
  assert.ok(status < 300, `${method} ${path}: ${status} ${JSON.stringify(body)}`);
  return body;
}

const gpuCard = (page, uuid) => page.locator(`[data-testid=gpu][data-uuid="${uuid}"]`);

test('an admin shares an idle GPU with MPS from the Nodes page', async () => {
  await withPage(browser, 'share-admin', async (page, errors) => {
    await signInAs(page, 'admin', ADMIN_SECOND_PASSWORD);
    // A GPU nothing holds: switching is refused (409) while anything does.
    const nodes = await api(page, 'GET', '/api/v1/nodes?limit=50');
    for (const n of nodes.items) {
      for (const g of n.gpus.filter((g) => g.model && !g.sharing)) {
        const path = `/api/v1/nodes/${n.id}/gpus/${g.uuid}/sharing`;
        const [status] = await call(page, 'PUT', path, { sharing: 'mps' });
        if (status === 200) {
          await api(page, 'PUT', path, { sharing: 'off' });
          shared = { node: n.id, gpu: g.uuid, model: g.model };
          break;
        }
        assert.equal(status, 409, 'a busy GPU is refused, not broken');
      }
      if (shared) break;
    }
    assert.ok(shared, 'an idle GPU to share');

    await page.goto(`${BASE}/nodes`);
    await hydrated(page);
    const card = gpuCard(page, shared.gpu);
    await card.locator('details.set-sharing summary').click();
    await card.locator('select[name=sharing]').selectOption('mps');
    await card.locator('details.set-sharing button[type=submit]').click();
    await eventually(async () => {
      await page.reload();
      await hydrated(page);
      const c = gpuCard(page, shared.gpu);
      return (await c.locator('[data-testid=shared-badge]').count()) === 1
        && /ready/.test(await c.locator('[data-testid=shared-gpu]').innerText());
    }, { what: 'the GPU shown shared and ready', timeoutMs: 60000 });
    assert.match(await gpuCard(page, shared.gpu).locator('[data-testid=shared-badge]').innerText(), /MPS/);

    const team = await api(page, 'POST', '/api/v1/teams', { name: TEAM });
    teamId = team.id;
    await api(page, 'POST', '/api/v1/users', { username: MEMBER, password: PASSWORD });
    await api(page, 'POST', `/api/v1/teams/${teamId}/members`, { username: MEMBER, role: 'member' });
    await page.goto(`${BASE}/teams/${teamId}`);
    await hydrated(page);
    const form = page.locator('[data-testid=quota-form]');
    await form.locator('select[name=model]').selectOption(`${shared.model}:shared`);
    await form.locator('input[name=guaranteed]').fill('500');
    await form.locator('input[name=limit]').fill('1000');
    await form.locator('input[name=per_user]').fill('500');
    await form.locator('button[type=submit]').click();
    await page.locator(`[data-testid=quota-row][data-model="${shared.model}:shared"]`).waitFor();
    assert.deepEqual(errors, [], 'no uncaught page errors');
  });
});

test('a member gets a quarter of the shared GPU through the form', async () => {
  assert.ok(shared && teamId, 'the GPU was shared');
  await withPage(browser, 'share-member', async (page, errors) => {
    await signInAs(page, MEMBER, PASSWORD);
    await page.goto(`${BASE}/allocations`);
    await hydrated(page);
    const form = page.locator('[data-testid=request-form]');
    await form.locator('select[name=team_id]').selectOption(teamId);
    const kind = `${shared.model}:share:250`;
    const option = form.locator(`select[name=kind] option[value="${kind}"]`);
    await eventually(async () => (await option.count()) === 1, { what: 'the share offered' });
    assert.match(await option.innerText(), new RegExp(`25% share of ${shared.model}.*fits now`));
    await form.locator('select[name=kind]').selectOption(kind);
    await form.locator('button[type=submit]').click();
    await page.waitForURL(/\/allocations\/[0-9a-f-]{36}$/);
    const detail = page.locator('[data-testid=allocation-detail]');
    await eventually(async () => (await detail.getAttribute('data-state')) === 'active',
      { what: 'the share to become active', timeoutMs: 60000 });
    assert.match(await page.locator('[data-testid=devices]').innerText(), new RegExp(shared.gpu));

    // The Nodes page shows a quarter handed out, without saying whose.
    await page.goto(`${BASE}/nodes`);
    await hydrated(page);
    const card = gpuCard(page, shared.gpu);
    await eventually(async () => /250 of 1000 milli-GPU/.test(
      await card.locator('[data-testid=share-used]').innerText()),
    { what: 'the share on the Nodes page' });
    assert.doesNotMatch(await card.locator('[data-testid=shared-gpu]').innerText(), new RegExp(TEAM));
    assert.deepEqual(errors, [], 'no uncaught page errors');

    // Give it back, then unshare the GPU (as an admin) for the tests that follow.
    await page.goBack();
    await hydrated(page);
    await page.click('[data-testid=release]');
    await eventually(async () => /ended|releasing/.test(await detail.getAttribute('data-state')),
      { what: 'the share released' });
  });
  await withPage(browser, 'share-cleanup', async (page) => {
    await signInAs(page, 'admin', ADMIN_SECOND_PASSWORD);
    await eventually(async () => {
      const [status] = await call(page, 'PUT',
        `/api/v1/nodes/${shared.node}/gpus/${shared.gpu}/sharing`, { sharing: 'off' });
      return status === 200;
    }, { what: 'the GPU unshared', timeoutMs: 60000 });
  });
});
