// Multi-node (gang) jobs from the jobs form (issue 42). The embedded default's simulated
// cluster has one node per GPU model (sim-a100: 4 × A100, sim-h100: 2 × H100), so a gang
// of two H100 nodes cannot start there: it is submitted from the form, waits with a reason
// that speaks for the gang, shows as "2 nodes × 1 GPU" on its allocation's page, and is
// cancelled. Bad input shows its error on the field it belongs to. A gang that runs (the
// Ranks table, each rank's log) is zz-gangs-running.test.mjs, which adds nodes of its own
// and so runs last.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  withPage, hydrated, eventually, BASE, ADMIN_SECOND_PASSWORD, fileBrowser, runTag, signInAs, api, signInAdmin, teamWith,
} from './helpers.mjs';

const browser = fileBrowser();

const suffix = runTag();
const TEAM = `Gang Lab ${suffix}`;
const MEMBER = `gang-member-${suffix}`;
const PASSWORD = 'gang password 1';
let teamId;

// The error shown under the field whose input is `inputId` (in the same field box).
function errorUnder(page, inputId, field) {
  return page.locator(`#${inputId}`).locator('xpath=..').locator(`#${field}-error`);
}

test('an admin makes a team with room for whole H100s and a member', async () => {
  await withPage(browser, 'gang-admin', async (page) => {
    await signInAdmin(page, ADMIN_SECOND_PASSWORD);
    // A whole H100 is 7 units: room for eight, so a too-large ask meets the node check,
    // not the quota.
    teamId = await teamWith(page, {
      team: TEAM, members: [[MEMBER, 'member']], password: PASSWORD, model: 'H100-80GB', quota: { guaranteed: 0, limit: 56, per_user: 56 },
    });
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

    // Too many retries: the error is the retries field's (a gang may be retried, as a whole).
    await form.getByLabel('GPUs per node').fill('1');
    await form.getByLabel('Retries on failure').fill('9');
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

