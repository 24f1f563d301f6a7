// A multi-node (gang) job that runs (issue 42). The embedded default's simulated cluster
// has one node per GPU model, so this file starts two simulated L4 nodes of its own (real
// `tessera-agent --simulate` processes, sandboxed, each with a workload address range of
// its own): a two-node gang submitted from the jobs form runs on both, its page shows the
// Ranks table with two distinct nodes, and the log select shows each rank's own output.
// The nodes are stopped and revoked at the end, but stay listed (revoked): the name sorts
// this file last, after the files that assert the default cluster's nodes (telemetry,
// tenancy). The form's fields and errors and a waiting gang are gangs.test.mjs. The
// workload page's terminal is tried on a running gang's second rank.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, openSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  withPage, hydrated, eventually, BASE, ADMIN_SECOND_PASSWORD, fileBrowser, runTag, signInAs, api, signInAdmin, teamWith,
} from './helpers.mjs';

const browser = fileBrowser();

const suffix = runTag();
const TEAM = `Gang Run ${suffix}`;
const MEMBER = `gang-runner-${suffix}`;
const PASSWORD = 'gang password 2';
let teamId;

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

test('two simulated L4 nodes join; a team with room for a gang on them and a member', async () => {
  await withPage(browser, 'gang-nodes', async (page) => {
    await signInAdmin(page, ADMIN_SECOND_PASSWORD);
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
    teamId = await teamWith(page, {
      team: TEAM, members: [[MEMBER, 'member']], password: PASSWORD, model: 'L4-24GB', quota: { guaranteed: 0, limit: 4, per_user: 4 },
    });
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

test('the terminal on a running gang\'s page runs commands in the rank chosen', async () => {
  await withPage(browser, 'gang-terminal', async (page, errors) => {
    await signInAs(page, MEMBER, PASSWORD);
    const job = await api(page, 'POST', '/api/v1/jobs', {
      command: 'sleep 300', gpu: 'L4-24GB:whole', nodes: 2, name: 'e2e-gang-terminal',
    });
    try {
      await eventually(async () => {
        const j = await api(page, 'GET', `/api/v1/workloads/${job.id}`);
        if (j.state === 'failed' || j.state === 'lost') throw new Error(`the gang ${j.state}: ${j.message}`);
        return j.state === 'running';
      }, { what: 'the gang to run', timeoutMs: 120000 });
      await page.goto(`${BASE}/workloads/${job.id}`);
      await hydrated(page);
      const terminal = page.locator('[data-testid=terminal]');
      await terminal.locator('summary').click();
      const status = terminal.locator('[data-testid=terminal-status]');
      assert.match(await status.innerText(), /Not connected/);
      // Rank 1's sandbox: its own host name, variables and the workload's uid.
      await terminal.locator('[data-testid=terminal-rank]').selectOption('1');
      await terminal.locator('[data-testid=terminal-open]').click();
      await eventually(async () => /Connected/.test(await status.innerText()), { what: 'the shell to connect' });
      const input = terminal.locator('[data-testid=terminal-input]');
      const out = terminal.locator('[data-testid=terminal-output]');
      await input.fill('echo "rank=$RANK of $WORLD_SIZE on $(hostname) uid=$(id -u)"');
      await input.press('Enter');
      await eventually(async () => /rank=1 of 2 on rank-1 uid=\d+/.test(await out.innerText()),
        { what: 'the command\'s output' });
      assert.match(await out.innerText(), /^\$ echo "rank=\$RANK/m, 'the typed line is echoed');
      assert.doesNotMatch(await out.innerText(), /uid=0\b/, 'not root');
      // A failing command's stderr shows; the shell goes on; its exit ends the session.
      await input.fill('ls /no-such-folder; exit 3');
      await input.press('Enter');
      await eventually(async () => /exited with code 3/.test(await status.innerText()),
        { what: 'the shell\'s exit code' });
      assert.match(await out.innerText(), /no-such-folder/);
      assert.equal(await input.isDisabled(), true, 'nothing to type into after the exit');
      assert.deepEqual(errors, [], 'no uncaught page errors');
    } finally {
      await api(page, 'POST', `/api/v1/workloads/${job.id}/stop`);
    }
  });
});

test('cleanup: the L4 nodes stop and are revoked', async () => {
  await stopAgents();
  await withPage(browser, 'gang-cleanup', async (page) => {
    await signInAdmin(page, ADMIN_SECOND_PASSWORD);
    for (const nodeId of l4Ids) {
      await api(page, 'POST', `/api/v1/nodes/${nodeId}/revoke`);
    }
  });
});
