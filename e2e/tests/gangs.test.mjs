// Multi-node (gang) jobs from the jobs form (issue 42). The embedded default's simulated
// cluster has one node per GPU model (sim-a100: 4 × A100, sim-h100: 2 × H100), so a gang
// of two H100 nodes cannot start there: it is submitted from the form, waits with a reason
// that speaks for the gang, shows as "2 nodes × 1 GPU" on its allocation's page, and is
// cancelled. Bad input shows its error on the field it belongs to. Then the file starts
// two simulated L4 nodes of its own (real `tessera-agent --simulate` processes with
// address ranges of their own, sandboxed as the default's are): a two-node gang submitted
// from the form runs on both, its page shows the Ranks table with two distinct nodes, and
// the log select shows each rank's own output. The nodes are stopped and revoked at the end.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, openSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  withPage, hydrated, signIn, eventually, BASE, ADMIN_PASSWORD, ADMIN_SECOND_PASSWORD, fileBrowser, runTag, signInAs, api,
} from './helpers.mjs';

const browser = fileBrowser();

const suffix = runTag();
const TEAM = `Gang Lab ${suffix}`;
const MEMBER = `gang-member-${suffix}`;
const PASSWORD = 'gang password 1';
let teamId;

// accounts.test.mjs changes the admin password; run alone, this file meets the first one.
async function signInAdmin(page) {
  await signIn(page, 'admin', ADMIN_SECOND_PASSWORD);
  try {
    await page.waitForURL(`${BASE}/`, { timeout: 5000 });
  } catch {
    await signInAs(page, 'admin', ADMIN_PASSWORD);
  }
}

// The error shown under the field whose input is `inputId` (in the same field box).
function errorUnder(page, inputId, field) {
  return page.locator(`#${inputId}`).locator('xpath=..').locator(`#${field}-error`);
}

test('an admin makes a team with room for whole H100s and a member', async () => {
  await withPage(browser, 'gang-admin', async (page) => {
    await signInAdmin(page);
    const team = await api(page, 'POST', '/api/v1/teams', { name: TEAM });
    teamId = team.id;
    await api(page, 'POST', '/api/v1/users', { username: MEMBER, password: PASSWORD });
    await api(page, 'POST', `/api/v1/teams/${teamId}/members`, { username: MEMBER, role: 'member' });
    // A whole H100 is 7 units: room for eight, so a too-large ask meets the node check,
    // not the quota.
    await api(page, 'PUT', `/api/v1/teams/${teamId}/quotas/H100-80GB`, { guaranteed: 0, limit: 56, per_user: 56 });
  });
});

test('the jobs form asks for nodes × GPUs per node, and bad values show on their fields', async () => {
  await withPage(browser, 'gang-form', async (page, errors) => {
    await signInAs(page, MEMBER, PASSWORD);
    await page.goto(`${BASE}/jobs`);
    await hydrated(page);
    const form = page.locator('[data-testid=submit-form]');
    // She holds nothing: "a new GPU" is the choice, with one node and no launcher.
    assert.equal(await form.locator('select[name=allocation_id]').inputValue(), 'new');
    await form.locator('select[name=gpu]').selectOption('H100-80GB:whole');
    const nodes = form.locator('[data-testid=own-gpu-nodes]');
    assert.equal(await nodes.inputValue(), '1');
    assert.equal(await form.getByLabel('How many').inputValue(), '1');
    assert.equal(await form.locator('[data-testid=gang-fields]').isHidden(), true);

    // Two nodes: the count is per node, a launcher appears, and the hint says the shape.
    await nodes.fill('2');
    await form.locator('[data-testid=gang-fields]').waitFor();
    assert.equal(await form.getByLabel('GPUs per node').inputValue(), '1');
    assert.match(await form.locator('[data-testid=gang-hint]').innerText(),
      /^2 nodes × 1 GPU, placed all at once; each node gets MASTER_ADDR, RANK, WORLD_SIZE… and \$TESSERA_HOSTFILE/);
    assert.match(await form.locator('[data-testid=own-gpu-fits]').innerText(), /^(Waits: .*2 nodes|Fits now if 2 nodes)/);
    const launcher = form.locator('select[name=launcher]');
    assert.deepEqual(await launcher.locator('option').allInnerTexts(),
      ['Every node runs the command', 'Only rank 0 runs it (mpirun)']);
    await form.getByLabel('Command').fill('hostname');

    // No node has three H100s: the error is the GPUs-per-node field's.
    await form.getByLabel('GPUs per node').fill('3');
    await form.getByRole('button', { name: 'Submit job' }).click();
    await errorUnder(page, 'job-count', 'gpus_per_node').waitFor();
    assert.match(await errorUnder(page, 'job-count', 'gpus_per_node').innerText(), /^at most 2: no node holds more H100-80GB GPUs/);
    assert.match(page.url(), /\/jobs/);

    // A gang is not retried (yet): the error is the retries field's.
    await form.getByLabel('GPUs per node').fill('1');
    await form.getByLabel('Retries on failure').fill('1');
    await form.getByRole('button', { name: 'Submit job' }).click();
    await errorUnder(page, 'job-retries', 'retries').waitFor();
    await form.getByLabel('Retries on failure').fill('0');

    // Zero nodes: the error is the nodes field's.
    await nodes.fill('0');
    await form.getByRole('button', { name: 'Submit job' }).click();
    await errorUnder(page, 'job-nodes', 'nodes').waitFor();
    assert.match(await errorUnder(page, 'job-nodes', 'nodes').innerText(), /1 to/);
    assert.equal(await page.locator('[data-testid=launch-error]').count(), 0, 'no error left over for the form as a whole');
    assert.deepEqual(errors, [], 'no uncaught page errors');
  });
});

test('a two-node gang submitted from the form waits as one, shows its shape, and is cancelled', async () => {
  await withPage(browser, 'gang-submit', async (page, errors) => {
    await signInAs(page, MEMBER, PASSWORD);
    await page.goto(`${BASE}/jobs`);
    await hydrated(page);
    const form = page.locator('[data-testid=submit-form]');
    await form.locator('select[name=allocation_id]').selectOption('new');
    await form.locator('select[name=gpu]').selectOption('H100-80GB:whole');
    await form.locator('[data-testid=own-gpu-nodes]').fill('2');
    await form.locator('[data-testid=gang-fields]').waitFor();
    await form.locator('select[name=launcher]').selectOption('rank0');
    await form.getByLabel('Command').fill('mpirun --hostfile $TESSERA_HOSTFILE hostname');
    await form.getByLabel('Name (optional)').fill('e2e-gang');
    await form.getByRole('button', { name: 'Submit job' }).click();
    await page.waitForURL(/\/workloads\/[0-9a-f-]{36}$/);
    await hydrated(page);
    const id = page.url().split('/').pop();

    // One job, owning one allocation for the whole gang: two nodes, one H100 each.
    const job = await api(page, 'GET', `/api/v1/workloads/${id}`);
    assert.equal(job.owns_allocation, true);
    assert.equal(job.state, 'queued');
    assert.deepEqual(job.ranks ?? [], [], 'no ranks while it waits');
    const alloc = await api(page, 'GET', `/api/v1/allocations/${job.allocation_id}`);
    assert.equal(alloc.nodes, 2);
    assert.equal(alloc.count, 2);
    // Only one node has H100s here: it waits, and says so for the gang.
    await eventually(async () => {
      await page.reload();
      await hydrated(page);
      const waiting = page.locator('[data-testid=waiting]');
      return (await waiting.count()) > 0 && /2 nodes/.test(await waiting.innerText());
    }, { what: 'the job page to say the gang waits for 2 nodes', timeoutMs: 60000 });
    assert.equal(await page.locator('[data-testid=workload-detail]').getAttribute('data-state'), 'queued');
    assert.equal(await page.locator('[data-testid=ranks]').count(), 0, 'no Ranks table while it waits');
    // The list shows it once.
    const mine = await api(page, 'GET', '/api/v1/workloads?kind=job&mine=true&limit=100');
    assert.equal(mine.items.filter((w) => w.name === 'e2e-gang').length, 1);

    // Its allocation's page counts nodes × GPUs per node.
    await page.goto(`${BASE}/allocations/${job.allocation_id}`);
    await hydrated(page);
    assert.equal(await page.locator('[data-testid=allocation-detail] [data-testid=count]').innerText(), '2 nodes × 1 GPU');

    // Cancelled, its request ends with it (nothing left queued for other tests).
    await api(page, 'POST', `/api/v1/workloads/${id}/stop`);
    await eventually(async () => ['ended', 'cancelled'].includes((await api(page, 'GET', `/api/v1/allocations/${job.allocation_id}`)).state),
      { what: 'the gang\'s allocation to end', timeoutMs: 60000 });
    assert.deepEqual(errors, [], 'no uncaught page errors');
  });
});

// ---- a gang that runs: two simulated L4 nodes of this file's own ----

const AGENT = process.env.TESSERA_AGENT_BIN
  ?? fileURLToPath(new URL(`../../${process.env.CARGO_TARGET_DIR ? '' : 'target/'}debug/tessera-agent`, import.meta.url));
const L4_NODES = [`e2e-gang-${suffix}-a`, `e2e-gang-${suffix}-b`];
const agents = [];
let l4Ids = [];

// Its log: agent.log in its state folder (named in a failure's output).
function startAgent(hostname, secret, i) {
  const state = mkdtempSync(join(tmpdir(), 'tessera-e2e-gang-'));
  console.log(`# ${hostname}: ${state}/agent.log`);
  const child = spawn(AGENT, [
    '--simulate', '--gpus', 'L4-24GB', '--hostname', hostname,
    '--server', BASE, '--join-token', secret, '--state-dir', state,
    '--heartbeat-interval-s', '1', '--reconcile-interval-s', '1',
    '--workload-interval-ms', '300', '--stop-workloads-on-exit',
    // Each node its own workload range, so the gang's routes between them are distinct.
    '--sandbox-net', `10.219.${i + 1}.0/24`,
    '--exit-with-pid', String(process.pid),
  ], { stdio: ['ignore', 'ignore', openSync(join(state, 'agent.log'), 'a')] });
  agents.push(child);
}

// Stops the agents (SIGINT: they stop their workloads first) and waits for them.
async function stopAgents() {
  await Promise.all(agents.splice(0).map((c) => new Promise((resolve) => {
    if (c.exitCode !== null) return resolve();
    const timer = setTimeout(() => { c.kill('SIGKILL'); resolve(); }, 20000);
    c.once('exit', () => { clearTimeout(timer); resolve(); });
    c.kill('SIGINT');
  })));
}
after(stopAgents);

test('two simulated L4 nodes join, and the team gets room for a gang on them', async () => {
  await withPage(browser, 'gang-nodes', async (page) => {
    await signInAdmin(page);
    for (const [i, host] of L4_NODES.entries()) {
      const jt = await api(page, 'POST', '/api/v1/join-tokens', { note: `e2e gang node ${host}` });
      startAgent(host, jt.secret, i);
    }
    await eventually(async () => {
      const nodes = await api(page, 'GET', '/api/v1/nodes?limit=200');
      const ours = (nodes.items ?? nodes).filter((n) => L4_NODES.includes(n.hostname) && n.gpus?.length > 0);
      l4Ids = ours.map((n) => n.id);
      return ours.length === 2;
    }, { what: 'both L4 nodes to report their GPUs', timeoutMs: 90000 });
    await api(page, 'PUT', `/api/v1/teams/${teamId}/quotas/L4-24GB`, { guaranteed: 0, limit: 4, per_user: 4 });
  });
});

test('a two-node gang from the form runs on both nodes: the Ranks table and each rank\'s log', async () => {
  await withPage(browser, 'gang-runs', async (page, errors) => {
    await signInAs(page, MEMBER, PASSWORD);
    await page.goto(`${BASE}/jobs`);
    await hydrated(page);
    const form = page.locator('[data-testid=submit-form]');
    await form.locator('select[name=allocation_id]').selectOption('new');
    await form.locator('select[name=gpu]').selectOption('L4-24GB:whole');
    await form.locator('[data-testid=own-gpu-nodes]').fill('2');
    await form.locator('[data-testid=gang-fields]').waitFor();
    assert.equal(await form.locator('select[name=launcher]').inputValue(), 'each');
    await form.getByLabel('Command').fill(
      // Rank 0 ends last: its end stops the members still running.
      'echo "rank $RANK of $WORLD_SIZE master $MASTER_ADDR"; test -s "$TESSERA_HOSTFILE" && echo hostfile-ok; '
      + 'if [ "$RANK" = 0 ]; then sleep 4; fi');
    await form.getByLabel('Name (optional)').fill('e2e-gang-runs');
    await form.getByRole('button', { name: 'Submit job' }).click();
    await page.waitForURL(/\/workloads\/[0-9a-f-]{36}$/);
    await hydrated(page);
    const id = page.url().split('/').pop();
    await eventually(async () => {
      const job = await api(page, 'GET', `/api/v1/workloads/${id}`);
      if (job.state === 'failed' || job.state === 'lost') throw new Error(`the gang ${job.state}: ${job.message}`);
      return job.state === 'succeeded';
    }, { what: 'the gang to succeed', timeoutMs: 120000 });

    // The page, once it ended: a Ranks table of two members on two distinct nodes.
    await page.reload();
    await hydrated(page);
    const rows = page.locator('[data-testid=ranks] tr[data-testid=rank-row]');
    await rows.first().waitFor();
    assert.equal(await rows.count(), 2);
    const nodes = await rows.evaluateAll((trs) => trs.map((tr) => tr.dataset.node));
    assert.deepEqual([...nodes].sort(), [...L4_NODES].sort(), 'one rank on each L4 node');
    assert.deepEqual(await rows.evaluateAll((trs) => trs.map((tr) => [tr.dataset.rank, tr.dataset.state])),
      [['0', 'succeeded'], ['1', 'succeeded']]);
    assert.match(await rows.nth(1).innerText(), /\b0\b/, 'rank 1 shows its exit code');

    // The log is rank 0's; the select shows rank 1's own output.
    const log = page.locator('[data-testid=log]');
    await eventually(async () => /rank 0 of 2/.test(await log.innerText()), { what: 'rank 0\'s log' });
    assert.match(await log.innerText(), /hostfile-ok/);
    const select = page.locator('[data-testid=log-rank]');
    assert.equal(await select.locator('option').count(), 2);
    await select.selectOption('1');
    await eventually(async () => /rank 1 of 2/.test(await log.innerText()), { what: 'rank 1\'s log' });
    assert.doesNotMatch(await log.innerText(), /rank 0 of 2/);
    const ranks = (await api(page, 'GET', `/api/v1/workloads/${id}`)).ranks;
    assert.equal(await page.locator('[data-testid=download-log]').getAttribute('href'),
      `/api/v1/workloads/${ranks[1].id}/log.txt`);
    // And back to rank 0.
    await select.selectOption('0');
    await eventually(async () => /rank 0 of 2/.test(await log.innerText()), { what: 'rank 0\'s log again' });

    // The list shows the job once.
    const mine = await api(page, 'GET', '/api/v1/workloads?kind=job&mine=true&limit=100');
    assert.equal(mine.items.filter((w) => w.name === 'e2e-gang-runs').length, 1);
    assert.deepEqual(errors, [], 'no uncaught page errors');
  });
});

test('cleanup: the L4 nodes stop and are revoked', async () => {
  await stopAgents();
  await withPage(browser, 'gang-cleanup', async (page) => {
    await signInAdmin(page);
    for (const nodeId of l4Ids) {
      await api(page, 'POST', `/api/v1/nodes/${nodeId}/revoke`);
    }
  });
});
