// Tenancy journey: an admin creates a team and a member; the member signs in, sees the
// simulated cluster on the dashboard and the nodes page, cannot reach admin pages, signs out.
// Then the admin side of the cluster pages: a MIG layout, a join token, an API token.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  withPage, hydrated, signIn, eventually, BASE, ADMIN_SECOND_PASSWORD, fileBrowser, runTag,
} from './helpers.mjs';

const browser = fileBrowser();

const suffix = runTag();
const TEAM = `Vision Lab ${suffix}`;
const MEMBER = `member-${suffix}`;
const MEMBER_PASSWORD = 'member password 12';

async function signInAs(page, username, password) {
  await signIn(page, username, password);
  await page.waitForURL(`${BASE}/`);
  await page.locator('h1', { hasText: 'Dashboard' }).waitFor();
  await hydrated(page);
}

test('admin creates a team and a user, and adds the user as a member', async () => {
  await withPage(browser, 'tenancy-admin-team', async (page, errors) => {
    await signInAs(page, 'admin', ADMIN_SECOND_PASSWORD);

    await page.click('nav >> text=Users');
    await page.waitForURL(`${BASE}/admin/users`);
    await page.fill('#new-username', MEMBER);
    await page.fill('#new-user-password', MEMBER_PASSWORD);
    await page.click('#create-user button[type=submit]');
    await page.locator('.notice', { hasText: `User ${MEMBER} created.` }).waitFor();
    await page.locator(`tr[data-username="${MEMBER}"]`).waitFor();
    assert.equal(await page.inputValue('#new-user-password'), '', 'password cleared');

    await page.click('nav >> text=Teams');
    await page.waitForURL(`${BASE}/teams`);
    await page.fill('#team-name', 'x');
    await page.click('#create-team button[type=submit]');
    await page.locator('#name-error').waitFor();
    assert.equal(await page.inputValue('#team-name'), 'x', 'typed name kept');
    await page.fill('#team-name', TEAM);
    await page.click('#create-team button[type=submit]');
    await page.locator('[data-testid=teams] a', { hasText: TEAM }).waitFor();
    await page.locator('.notice a', { hasText: TEAM }).click();
    await page.waitForURL(/\/teams\/[0-9a-f-]{36}$/);
    await page.locator('h1', { hasText: TEAM }).waitFor();

    await page.fill('#member-username', 'nobody-by-this-name');
    await page.click('#add-member button[type=submit]');
    await page.locator('#username-error').waitFor();
    assert.match(await page.innerText('#username-error'), /no user/);
    assert.equal(await page.inputValue('#member-username'), 'nobody-by-this-name');

    await page.fill('#member-username', MEMBER);
    await page.selectOption('#member-role', 'member');
    await page.click('#add-member button[type=submit]');
    const row = page.locator(`tr[data-username="${MEMBER}"]`);
    await row.waitFor();
    assert.equal(await row.locator('[data-testid=member-role]').innerText(), 'Member');
    assert.deepEqual(errors, [], 'no uncaught page errors');
  });
});

test('the member sees the cluster and the nodes, but no admin pages', async () => {
  await withPage(browser, 'tenancy-member', async (page, errors) => {
    await signInAs(page, MEMBER, MEMBER_PASSWORD);
    assert.equal(await page.innerText('[data-testid=current-user]'), MEMBER);
    const nav = page.locator('nav[aria-label=Main]');
    for (const link of ['Dashboard', 'Nodes', 'Teams', 'My account']) {
      assert.equal(await nav.getByRole('link', { name: link, exact: true }).count(), 1, link);
    }
    for (const link of ['Users', 'Join tokens']) {
      assert.equal(await nav.getByRole('link', { name: link, exact: true }).count(), 0, link);
    }

    // The simulated nodes register within seconds of the server starting.
    const summary = page.locator('[data-testid=cluster-summary]');
    await eventually(async () => {
      const text = await summary.innerText();
      if (/4× A100-SXM4-40GB/.test(text) && /2× H100-80GB/.test(text)) return true;
      await page.reload();
      return false;
    }, { what: 'the simulated GPUs on the dashboard' });
    assert.match(await page.innerText('[data-testid=nodes-online]'), /2\s*\/\s*2/);
    assert.equal(await page.innerText('[data-testid=gpus-total]'), '6');

    await nav.getByRole('link', { name: 'Teams', exact: true }).click();
    await page.waitForURL(`${BASE}/teams`);
    await page.locator('[data-testid=teams] a', { hasText: TEAM }).click();
    await page.locator('h1', { hasText: TEAM }).waitFor();
    assert.match(await page.innerText('[data-testid=my-role]'), /Your role: Member/);
    assert.equal(await page.locator('#add-member').count(), 0, 'members cannot add members');

    await nav.getByRole('link', { name: 'Nodes', exact: true }).click();
    await page.waitForURL(`${BASE}/nodes`);
    await page.locator('[data-testid=node]').first().waitFor();
    assert.equal(await page.locator('[data-testid=servers]').count(), 0, 'no server list for members');
    const nodes = page.locator('[data-testid=node]');
    const models = [];
    for (let i = 0; i < await nodes.count(); i++) {
      const node = nodes.nth(i);
      assert.equal(await node.locator('[data-testid=node-status]').innerText(), 'online');
      models.push((await node.locator('[data-testid=gpu-model]').allInnerTexts()).join(','));
    }
    assert.deepEqual(models.sort(), [
      'A100-SXM4-40GB,A100-SXM4-40GB,A100-SXM4-40GB,A100-SXM4-40GB',
      'H100-80GB,H100-80GB',
    ]);
    assert.equal(await page.locator('text=Set MIG layout').count(), 0, 'no admin forms');
    assert.equal(await page.locator('text=Revoke node').count(), 0, 'no admin forms');

    for (const path of ['/admin/users', '/admin/join-tokens']) {
      const response = await page.goto(`${BASE}${path}`);
      assert.equal(response.status(), 403, path);
      await hydrated(page);
      await page.locator('[data-testid=forbidden]').waitFor();
      assert.match(await page.innerText('[data-testid=forbidden]'), /do not have permission/);
    }

    // Another team's page (or a made-up one) is simply not found.
    const missing = await page.goto(`${BASE}/teams/00000000-0000-4000-8000-000000000000`);
    assert.equal(missing.status(), 404);
    await page.locator('[data-testid=not-found]').waitFor();

    await hydrated(page);
    await page.click('text=Log out');
    await page.waitForURL(`${BASE}/login`);
    await page.goto(`${BASE}/nodes`);
    await page.waitForURL(`${BASE}/login?next=%2Fnodes`);
    assert.deepEqual(errors, [], 'no uncaught page errors');
  });
});

test('admin sets a MIG layout, creates a join token and an API token', async () => {
  await withPage(browser, 'tenancy-admin-cluster', async (page, errors) => {
    await signInAs(page, 'admin', ADMIN_SECOND_PASSWORD);

    // Hopper applies a MIG mode change at once, so the simulated H100 shows the layout.
    await page.click('nav >> text=Nodes');
    await page.waitForURL(`${BASE}/nodes`);
    const h100 = page.locator('[data-testid=gpu]', {
      has: page.locator('[data-testid=gpu-model]', { hasText: 'H100-80GB' }),
    }).first();
    await h100.waitFor();
    const uuid = await h100.getAttribute('data-uuid');
    const gpu = page.locator(`[data-testid=gpu][data-uuid="${uuid}"]`);
    await gpu.locator('summary', { hasText: 'Set MIG layout' }).click();
    await gpu.locator('select[name=mode]').selectOption('enabled');
    await gpu.locator('input[name=layout]').fill('3g.40gb@1');
    await gpu.locator('button', { hasText: 'Save layout' }).click();
    await gpu.locator('.field-error').waitFor();
    assert.equal(await gpu.locator('input[name=layout]').inputValue(), '3g.40gb@1', 'typed kept');

    await gpu.locator('input[name=layout]').fill('3g.40gb@0, 2g.20gb@4, 1g.10gb@6');
    await gpu.locator('button', { hasText: 'Save layout' }).click();
    await gpu.locator('.notice', { hasText: 'Saved' }).waitFor();
    await eventually(async () => {
      if (await gpu.locator('[data-testid=mig-instance]').count() === 3) return true;
      await page.reload();
      return false;
    }, { what: 'the agent to apply the MIG layout', timeoutMs: 45000 });
    const first = gpu.locator('[data-testid=mig-instance]', { hasText: '3g.40gb' });
    assert.match(await first.getAttribute('title'), /MIG-/);
    assert.match(await first.getAttribute('style'), /grid-column: 1 \/ span 4/);
    assert.equal(await gpu.locator('.slice.empty').count(), 1, 'slice 7 stays empty');

    await page.click('nav >> text=Join tokens');
    await page.waitForURL(`${BASE}/admin/join-tokens`);
    await page.fill('#join-note', `e2e ${suffix}`);
    await page.click('#create-join-token button[type=submit]');
    const command = page.locator('[data-testid=secret-box] [data-testid=command]');
    await command.waitFor();
    assert.match(await command.innerText(),
      new RegExp(`^tessera-agent --server ${BASE} --join-token \\S+$`));
    const row = page.locator('[data-testid=join-token]', { hasText: `e2e ${suffix}` });
    await row.waitFor();
    assert.match(await row.innerText(), /0 \/ 1/);
    assert.match(await row.innerText(), /usable/);
    await row.locator('button', { hasText: 'Revoke' }).click();
    await page.locator('[data-testid=join-token]', { hasText: `e2e ${suffix}` })
      .locator('text=revoked').waitFor();

    await page.click('nav >> text=My account');
    await page.waitForURL(`${BASE}/account`);
    await page.fill('#token-name', 'ci scripts');
    await page.fill('#token-days', '30');
    await page.click('#create-token button[type=submit]');
    const secret = await page.locator('[data-testid=secret-box] [data-testid=secret]').innerText();
    const token = page.locator('[data-testid=api-token]', { hasText: 'ci scripts' });
    await token.waitFor();
    assert.ok(secret.startsWith((await token.locator('code').innerText()).replace('…', '')));
    await token.locator('button', { hasText: 'Revoke' }).click();
    await page.locator('[data-testid=api-tokens]').waitFor({ state: 'detached' });
    await page.locator('.empty-state', { hasText: 'No API tokens' }).waitFor();
    assert.deepEqual(errors, [], 'no uncaught page errors');
  });
});

test('a team can be created without JavaScript', async () => {
  await withPage(browser, 'tenancy-no-js', async (page) => {
    await page.goto(`${BASE}/login`);
    await page.fill('#username', 'admin');
    await page.fill('#password', ADMIN_SECOND_PASSWORD);
    await page.click('#sign-in');
    await page.waitForURL(`${BASE}/`);
    await page.goto(`${BASE}/teams`);
    await page.fill('#team-name', '!!');
    await page.click('#create-team button[type=submit]');
    await page.locator('#name-error').waitFor();
    assert.equal(await page.inputValue('#team-name'), '!!', 'typed name kept');
    await page.fill('#team-name', `No Script ${suffix}`);
    await page.click('#create-team button[type=submit]');
    await page.locator('[data-testid=teams] a', { hasText: `No Script ${suffix}` }).waitFor();
  }, { javaScriptEnabled: false });
});
