// Workload journey on the embedded default's simulated nodes, whose agents run workloads
// as real processes: a member gets a 1g.10gb slice, launches a JupyterLab named `e2e` from
// the allocation's page, sees it reach Running, opens it through the server's proxy on the
// notebook's own origin (the page config carries no notebook token; a hostile script there
// gets nothing of the portal, as the owner and as a visiting admin), stops it; then submits
// a job on the same slice and watches its log line arrive live and the job fail with exit
// code 3. And no other page can frame the portal.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  withPage, hydrated, eventually, BASE, ADMIN_SECOND_PASSWORD, fileBrowser, runTag, signInAs, api, signInAdmin, teamWith,
} from './helpers.mjs';

const browser = fileBrowser();

const suffix = runTag();
const TEAM = `Notebook Lab ${suffix}`;
const MEMBER = `nb-member-${suffix}`;
const PASSWORD = 'notebook password 1';
let teamId;
let allocationId;
let notebookUrl;

// Runs in a notebook's page: everything a malicious script there would try against the
// portal. Returns what each attempt got.
async function hostileScript({ portal }) {
  const attempt = async (url, init) => {
    try {
      const r = await fetch(url, init);
      return { status: r.status, type: r.type, body: (await r.text()).slice(0, 300) };
    } catch (e) {
      return { error: String(e) };
    }
  };
  const json = { 'content-type': 'application/json' };
  const out = {
    fnCrossOrigin: await attempt(`${portal}/fn/current_user`, { method: 'POST', credentials: 'include' }),
    tokenCrossOrigin: await attempt(`${portal}/api/v1/tokens`, {
      method: 'POST', credentials: 'include', headers: json, body: JSON.stringify({ name: 'stolen' }),
    }),
    tokenNoCors: await attempt(`${portal}/api/v1/tokens`, {
      method: 'POST', mode: 'no-cors', credentials: 'include', body: '{"name":"stolen"}',
    }),
    fnHere: await attempt('/fn/current_user', { method: 'POST' }),
    tokenHere: await attempt('/api/v1/tokens', { method: 'POST', headers: json, body: JSON.stringify({ name: 'stolen' }) }),
    meHere: await attempt('/api/v1/me'),
    cookie: document.cookie,
  };
  const register = async (script, scope) => {
    try {
      await navigator.serviceWorker.register(script, { scope });
      return 'registered';
    } catch (e) {
      return String(e);
    }
  };
  // A script the notebook really serves (JupyterLab's own bundle), asking for scope `/`.
  const served = [...document.querySelectorAll('script[src]')].map((s) => s.src).find((u) => u.startsWith(location.origin));
  out.swServedRoot = served ? await register(served, '/') : 'no script found';
  out.swPortal = await register(`${portal}/pkg/tessera.js`, `${portal}/`);
  document.cookie = `tessera_session=attacker; path=/; domain=${new URL(portal).hostname}`;
  document.cookie = 'tessera_session=attacker; path=/';
  return out;
}

function assertContained(r) {
  const detail = JSON.stringify(r, null, 1);
  // Cross-origin calls with the browser's credentials: unreadable, and refused (below: no token).
  assert.ok(r.fnCrossOrigin.error || r.fnCrossOrigin.status >= 400, detail);
  assert.ok(r.tokenCrossOrigin.error || r.tokenCrossOrigin.status >= 400, detail);
  // The notebook's origin has no portal routes and no portal session.
  for (const k of ['fnHere', 'tokenHere', 'meHere']) {
    assert.ok(r[k].status === 404 || r[k].status === 401 || r[k].status === 403, `${k}: ${detail}`);
    assert.doesNotMatch(r[k].body ?? '', /username|tsk_/, `${k}: ${detail}`);
  }
  // No credential is readable from script.
  assert.doesNotMatch(r.cookie, /tessera_session|tessera_notebook|tnp_/, detail);
  // No service worker for the whole origin, none for the portal.
  assert.match(r.swServedRoot, /scope|Service-Worker-Allowed|SecurityError|TypeError/i, detail);
  assert.notEqual(r.swServedRoot, 'registered', detail);
  assert.notEqual(r.swPortal, 'registered', detail);
}

// The page's user (signed in on the portal) has no token named `stolen`.
async function assertNoStolenToken(page) {
  const tokens = await api(page, 'GET', '/api/v1/tokens');
  assert.equal(tokens.items.filter((t) => t.name === 'stolen').length, 0, JSON.stringify(tokens));
}

async function detailState(page) {
  return page.locator('[data-testid=workload-detail]').getAttribute('data-state');
}

test('an admin makes a team with an H100 quota and a member', async () => {
  await withPage(browser, 'nb-admin', async (page) => {
    await signInAdmin(page, ADMIN_SECOND_PASSWORD);
    teamId = await teamWith(page, {
      team: TEAM, members: [[MEMBER, 'member']], password: PASSWORD, model: 'H100-80GB', quota: { guaranteed: 2, limit: 2, per_user: 2 },
    });
  });
});

test('a member launches a notebook on a slice, opens JupyterLab through the proxy, and stops it', async () => {
  await withPage(browser, 'nb-member', async (page, errors) => {
    await signInAs(page, MEMBER, PASSWORD);

    // Without an allocation the notebooks page offers a GPU of the notebook's own.
    await page.goto(`${BASE}/notebooks`);
    await hydrated(page);
    const oneClick = page.locator('[data-testid=launch-form]');
    assert.equal(await oneClick.locator('select[name=allocation_id]').inputValue(), 'new');
    assert.ok(await oneClick.locator('[data-testid=own-gpu]').isVisible());
    assert.equal(await oneClick.locator('select[name=gpu] option[value="H100-80GB:1g.10gb"]').count(), 1);

    // A 1g.10gb slice, as in the allocation journey.
    await page.goto(`${BASE}/allocations`);
    await hydrated(page);
    const form = page.locator('[data-testid=request-form]');
    await form.locator('select[name=team_id]').selectOption(teamId);
    await eventually(async () => (await form.locator('select[name=kind] option[value="H100-80GB:1g.10gb"]').count()) === 1,
      { what: 'the 1g.10gb kind offered' });
    await form.locator('select[name=kind]').selectOption('H100-80GB:1g.10gb');
    await form.locator('button[type=submit]').click();
    await page.waitForURL(/\/allocations\/[0-9a-f-]{36}$/);
    allocationId = page.url().split('/').pop();
    const alloc = page.locator('[data-testid=allocation-detail]');
    await eventually(async () => (await alloc.getAttribute('data-state')) === 'active',
      { what: 'the slice to become active', timeoutMs: 60000 });

    // The allocation's page leads to the launch form with the allocation chosen.
    await page.click('[data-testid=launch-notebook]');
    await page.waitForURL(`${BASE}/notebooks?allocation=${allocationId}`);
    await hydrated(page);
    const launchForm = page.locator('[data-testid=launch-form]');
    assert.equal(await launchForm.locator('select[name=allocation_id]').inputValue(), allocationId);
    assert.equal(await launchForm.locator('input[name=name]').inputValue(), 'default');

    // A bad name is refused next to the field; then `e2e` launches.
    await launchForm.locator('input[name=name]').fill('Not Valid');
    await launchForm.locator('button[type=submit]').click();
    await page.locator('#name-error').waitFor();
    assert.match(await page.locator('#name-error').innerText(), /lowercase/);
    await launchForm.locator('input[name=name]').fill('e2e');
    await launchForm.locator('textarea[name=env]').fill('E2E_GREETING=hello');
    await launchForm.locator('button[type=submit]').click();
    await page.waitForURL(/\/workloads\/[0-9a-f-]{36}$/);
    await hydrated(page);
    notebookUrl = page.url();
    const detail = page.locator('[data-testid=workload-detail]');
    assert.equal(await detail.getAttribute('data-kind'), 'notebook');
    await page.locator('[data-testid=steps]').waitFor();

    // The page follows it (no reload) until JupyterLab answers.
    await eventually(async () => (await detailState(page)) === 'running',
      { what: 'the notebook to be running', timeoutMs: 90000 });
    assert.match(await page.locator('[data-testid=device]').innerText(), /MIG-[0-9a-f-]+/);
    assert.match(await page.locator('[data-testid=env-names]').innerText(), /E2E_GREETING/);
    await page.locator('[data-testid=idle-panel]').waitFor();
    assert.equal(await page.locator('[data-testid=idle-decision]').getAttribute('data-decision'), 'active');
    const open = page.locator('[data-testid=open-notebook]');
    assert.match(await open.getAttribute('href'), new RegExp(`^/user/${MEMBER}/e2e/lab`));
    assert.equal(await open.getAttribute('target'), '_blank');

    // Open: JupyterLab through the authenticated proxy, in a new tab.
    const [lab] = await Promise.all([page.context().waitForEvent('page'), open.click()]);
    await lab.waitForLoadState('domcontentloaded');
    assert.match(lab.url(), new RegExp(`/user/${MEMBER}/e2e/lab`));
    assert.match(await lab.title(), /JupyterLab/);
    const config = JSON.parse(await lab.locator('#jupyter-config-data').textContent());
    assert.equal(config.token, '', 'the page config carries no notebook token');
    assert.equal(config.baseUrl, `/user/${MEMBER}/e2e/`);
    // The app itself loads through the proxy (scripts, REST and WebSocket calls).
    await lab.locator('.jp-LabShell').waitFor({ timeout: 60000 });
    // It runs on an origin of its own, not the portal's.
    assert.notEqual(new URL(lab.url()).origin, new URL(BASE).origin);
    assert.match(new URL(lab.url()).hostname, /^nb-[0-9a-f]{32}\.localhost$/);
    // A hostile script there (a package, an extension, a notebook's output) gets nothing
    // of the owner's portal powers.
    assertContained(await lab.evaluate(hostileScript, { portal: BASE }));
    await lab.close();
    await assertNoStolenToken(page);

    // The notebooks list and the dashboard show it running.
    await page.goto(`${BASE}/notebooks`);
    await hydrated(page);
    const row = page.locator('tr[data-testid=workload-row][data-name=e2e]');
    assert.equal(await row.getAttribute('data-state'), 'running');
    assert.equal(await row.locator('[data-testid=open-notebook]').count(), 1);
    await page.goto(`${BASE}/`);
    await hydrated(page);
    await page.locator('[data-testid=my-notebook][data-state=running]', { hasText: 'e2e' }).waitFor();

    // Back on its page: stop it (after confirming), and it ends as Stopped.
    await page.goto(notebookUrl);
    await hydrated(page);
    // Declining the confirmation leaves it running.
    const stop = page.locator('[data-testid=workload-detail] [data-testid=stop]');
    page.once('dialog', (d) => d.dismiss());
    await stop.click();
    await new Promise((r) => setTimeout(r, 1500));
    assert.equal(await detailState(page), 'running');
    page.once('dialog', (d) => { assert.match(d.message(), /Stop the notebook `e2e`/); d.accept(); });
    await stop.click();
    await eventually(async () => (await detailState(page)) === 'stopped',
      { what: 'the notebook to be stopped', timeoutMs: 60000 });
    assert.match(await page.locator('[data-testid=workload-message]').innerText(), new RegExp(`stopped by ${MEMBER}`));
    assert.equal(await page.locator('[data-testid=open-notebook]').count(), 0);
    assert.deepEqual(errors, [], 'no uncaught page errors');
  });
});

test('a platform admin opening the notebook is no more exposed than its owner', async () => {
  // The notebook `e2e` was stopped above: launch `e2e2` on the same slice, through the API.
  let notebookId;
  await withPage(browser, 'nb-relaunch', async (page) => {
    await signInAs(page, MEMBER, PASSWORD);
    const nb = await api(page, 'POST', '/api/v1/notebooks', { allocation_id: allocationId, name: 'e2e2' });
    notebookId = nb.id;
    await eventually(async () => (await api(page, 'GET', `/api/v1/workloads/${notebookId}`)).state === 'running',
      { what: 'the second notebook to run', timeoutMs: 90000 });
  });
  await withPage(browser, 'nb-admin-visit', async (page) => {
    await signInAdmin(page, ADMIN_SECOND_PASSWORD);
    await page.goto(`${BASE}/user/${MEMBER}/e2e2/lab`);
    await page.locator('.jp-LabShell').waitFor({ timeout: 60000 });
    assert.match(new URL(page.url()).hostname, /^nb-[0-9a-f]{32}\.localhost$/);
    assertContained(await page.evaluate(hostileScript, { portal: BASE }));
    // Back on the portal: still the admin, no token was made, the session cookie is ours.
    await page.goto(`${BASE}/`);
    await hydrated(page);
    await assertNoStolenToken(page);
    const cookies = await page.context().cookies(BASE);
    assert.ok(cookies.some((c) => c.name.endsWith('tessera_session') && c.value !== 'attacker'), JSON.stringify(cookies));
  });
  // Sign-in still works from scratch afterwards.
  await withPage(browser, 'nb-admin-again', async (page) => {
    await signInAdmin(page, ADMIN_SECOND_PASSWORD);
    await hydrated(page);
  });
  // A link into the notebook from the portal works once; a replayed one is refused.
  await withPage(browser, 'nb-replay', async (page) => {
    await signInAs(page, MEMBER, PASSWORD);
    const entry = await page.request.get(`${BASE}/user/${MEMBER}/e2e2/lab`, { maxRedirects: 0 });
    assert.equal(entry.status(), 303);
    const link = entry.headers().location;
    assert.match(link, /\/_tessera\/enter\?code=tnc_/);
    const first = await page.goto(link);
    assert.equal(first.status(), 200);
    assert.match(page.url(), new RegExp(`/user/${MEMBER}/e2e2/lab`));
    const again = await page.goto(link);
    assert.equal(again.status(), 403);
    assert.match(await page.locator('h1').innerText(), /expired/);
    await page.goto(`${BASE}/`);
    await api(page, 'POST', `/api/v1/workloads/${notebookId}/stop`);
  });
});

test('no other page can frame the portal', async () => {
  await withPage(browser, 'frame', async (page) => {
    await page.goto('about:blank');
    await page.setContent(`<iframe id="f" src="${BASE}/login" width="800" height="600"></iframe>`);
    await new Promise((r) => setTimeout(r, 2000));
    const frame = page.frames().find((f) => f !== page.mainFrame());
    const inside = frame ? await frame.locator('#username').count().catch(() => 0) : 0;
    assert.equal(inside, 0, 'the sign-in form rendered inside a frame');
    const r = await page.request.get(`${BASE}/login`);
    assert.match(r.headers()['content-security-policy'], /frame-ancestors 'none'/);
    assert.equal(r.headers()['x-frame-options'], 'DENY');
  }, { allowCspViolations: true });
});

test('a job prints its log live and fails with its exit code', async () => {
  await withPage(browser, 'nb-job', async (page, errors) => {
    await signInAs(page, MEMBER, PASSWORD);
    await page.goto(`${BASE}/allocations/${allocationId}`);
    await hydrated(page);
    // The stopped notebooks are listed on the allocation.
    await page.locator('[data-testid=allocation-workloads] tr[data-testid=workload-row][data-state=stopped]', { hasText: 'e2e2' }).waitFor();
    await page.click('[data-testid=submit-job]');
    await page.waitForURL(`${BASE}/jobs?allocation=${allocationId}`);
    await hydrated(page);
    const form = page.locator('[data-testid=submit-form]');
    assert.equal(await form.locator('select[name=allocation_id]').inputValue(), allocationId);
    await form.locator('input[name=name]').fill('e2e-job');
    await form.locator('textarea[name=command]').fill('echo hello-from-job; exit 3');
    await form.locator('button[type=submit]').click();
    await page.waitForURL(/\/workloads\/[0-9a-f-]{36}$/);
    await hydrated(page);
    const detail = page.locator('[data-testid=workload-detail]');
    assert.equal(await detail.getAttribute('data-kind'), 'job');
    assert.match(await page.locator('[data-testid=command]').innerText(), /hello-from-job/);

    // The log line arrives without a reload, then the job ends.
    const log = page.locator('[data-testid=log]');
    await eventually(async () => /hello-from-job/.test(await log.innerText()),
      { what: 'the log line', timeoutMs: 60000 });
    await eventually(async () => (await detailState(page)) === 'failed',
      { what: 'the job to fail', timeoutMs: 60000 });
    assert.equal((await page.locator('[data-testid=exit-code]').innerText()).trim(), '3');
    assert.match(await page.locator('[data-testid=attempt]').innerText(), /1 of 1/);
    assert.match(await page.locator('[data-testid=workload-message]').innerText(), /code 3/);
    await page.locator('[data-testid=log-complete]').waitFor();

    // The download has the whole log.
    const href = await page.locator('[data-testid=download-log]').getAttribute('href');
    assert.match(href, /^\/api\/v1\/workloads\/[0-9a-f-]{36}\/log\.txt$/);
    const r = await page.request.get(`${BASE}${href}`);
    assert.equal(r.status(), 200);
    assert.match(await r.text(), /hello-from-job/);

    // The jobs list shows it failed with its exit code.
    await page.goto(`${BASE}/jobs`);
    await hydrated(page);
    const row = page.locator('tr[data-testid=workload-row][data-name=e2e-job]');
    assert.equal(await row.getAttribute('data-state'), 'failed');
    assert.equal((await row.locator('[data-testid=exit-code]').innerText()).trim(), '3');
    // Filtered to the team, everyone's: still there.
    await page.locator('select[name=team]').selectOption(teamId);
    await page.locator('input[name=mine]').uncheck();
    await page.click('form.filters button[type=submit]');
    await page.waitForURL((u) => u.pathname === '/jobs' && u.searchParams.get('team') === teamId && !u.searchParams.has('mine'));
    await page.locator('tr[data-testid=workload-row][data-name=e2e-job]').waitFor();
    assert.deepEqual(errors, [], 'no uncaught page errors');
  });
});

test('a job submitted from Jobs with nothing chosen runs on the slice the member holds', async () => {
  await withPage(browser, 'nb-job-default', async (page, errors) => {
    await signInAs(page, MEMBER, PASSWORD);
    await page.goto(`${BASE}/jobs`);
    await hydrated(page);
    const form = page.locator('[data-testid=submit-form]');
    // Her free active slice is what "Run on" offers first; no new GPU is asked for.
    assert.equal(await form.locator('select[name=allocation_id]').inputValue(), allocationId);
    assert.equal(await form.locator('[data-testid=own-gpu]').isHidden(), true);
    await form.getByLabel('Command').fill('echo on-my-slice');
    await form.getByRole('button', { name: 'Submit job' }).click();
    await page.waitForURL(/\/workloads\/[0-9a-f-]{36}$/);
    const id = page.url().split('/').pop();
    const job = await api(page, 'GET', `/api/v1/workloads/${id}`);
    assert.equal(job.allocation_id, allocationId);
    assert.equal(job.owns_allocation, false);
    await eventually(async () => (await api(page, 'GET', `/api/v1/workloads/${id}`)).state === 'succeeded',
      { what: 'the job on her slice to succeed', timeoutMs: 60000 });
    // Choosing "a new GPU" shows what it will ask for: the kind (one free now preselected), how many, how long.
    await page.goto(`${BASE}/jobs`);
    await hydrated(page);
    await form.locator('select[name=allocation_id]').selectOption('new');
    await form.locator('[data-testid=own-gpu]').waitFor();
    assert.match(await form.locator('select[name=gpu] option:checked').innerText(), /free now/);
    // Below it, what that kind meets right now.
    assert.match(await form.locator('[data-testid=own-gpu-fits]').innerText(), /^(Fits now|Waits)/);
    assert.equal(await form.getByLabel('How many').inputValue(), '1');
    assert.deepEqual(errors, [], 'no uncaught page errors');
  });
});

test('the dashboard says where her work is: her slice, her finished jobs, what is free, the team\'s spend', async () => {
  await withPage(browser, 'nb-dashboard', async (page, errors) => {
    await signInAs(page, MEMBER, PASSWORD);
    await page.goto(`${BASE}/`);
    await hydrated(page);
    const work = page.locator('[data-testid=my-work]');
    const row = work.locator('tr[data-testid=my-work-row][data-what=allocation]', {
      has: page.locator(`a[href="/allocations/${allocationId}"]`),
    });
    await row.waitFor();
    assert.equal(await row.getAttribute('data-state'), 'active');
    assert.match(await row.innerText(), /min left/);
    // Her finished jobs, newest first, with how they ended; nobody else's.
    const recent = page.locator('[data-testid=recent-jobs] [data-testid=recent-job]');
    await recent.first().waitFor();
    const names = await recent.locator('a').allInnerTexts();
    assert.ok(names.includes('e2e-job'), names.join(', '));
    const mine = await api(page, 'GET', '/api/v1/workloads?kind=job&mine=true&limit=100');
    const hers = new Set(mine.items.map((w) => w.name));
    for (const n of names) assert.ok(hers.has(n), `${n} is hers`);
    assert.match(await page.locator('[data-testid=recent-job]', { hasText: 'e2e-job' }).innerText(), /exit 3/);
    await page.locator('[data-testid=free-now]').waitFor();
    await page.locator(`[data-testid=team-quotas][data-team="${teamId}"] [data-testid=team-spend]`).waitFor();
    assert.deepEqual(errors, [], 'no uncaught page errors');
  });
});

test('one click: a notebook with a GPU of its own reaches JupyterLab, and stopping it gives the GPU back', async () => {
  await withPage(browser, 'nb-one-click', async (page, errors) => {
    await signInAs(page, MEMBER, PASSWORD);
    await page.goto(`${BASE}/notebooks`);
    await hydrated(page);
    const form = page.locator('[data-testid=launch-form]');
    await form.locator('select[name=allocation_id]').selectOption('new');
    await form.locator('select[name=gpu]').selectOption('H100-80GB:1g.10gb');
    await form.locator('input[name=hours]').fill('2');
    await form.locator('input[name=name]').fill('quick');
    await form.locator('button[type=submit]').click();
    await page.waitForURL(/\/workloads\/[0-9a-f-]{36}$/);
    await hydrated(page);
    const id = page.url().split('/').pop();
    // It waits for its GPU, then runs, without a reload.
    await eventually(async () => (await detailState(page)) === 'running',
      { what: 'the one-click notebook to be running', timeoutMs: 120000 });
    const nb = await api(page, 'GET', `/api/v1/workloads/${id}`);
    assert.equal(nb.owns_allocation, true);
    const open = page.locator('[data-testid=open-notebook]');
    const [lab] = await Promise.all([page.context().waitForEvent('page'), open.click()]);
    await lab.waitForLoadState('domcontentloaded');
    assert.match(lab.url(), new RegExp(`/user/${MEMBER}/quick/lab`));
    await lab.locator('.jp-LabShell').waitFor({ timeout: 60000 });
    await lab.close();
    // Stopping it ends its allocation too.
    await api(page, 'POST', `/api/v1/workloads/${id}/stop`);
    await eventually(async () => (await api(page, 'GET', `/api/v1/allocations/${nb.allocation_id}`)).state === 'ended',
      { what: 'its allocation to end', timeoutMs: 60000 });
    assert.deepEqual(errors, [], 'no uncaught page errors');
  });
});
