// The Images admin page (issue 36, docs/workloads.md "Environments"): a platform admin
// allows a registry, sees the empty state give way to the entry (and REST agree), removes
// it after confirming, and the empty state comes back. The page is reached from the admin
// navigation and has no serious accessibility violations.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  withPage, hydrated, signInAs, BASE, fileBrowser, runTag, api, axeViolations, signInAdmin,
} from './helpers.mjs';

const browser = fileBrowser();
const ENTRY = `ghcr.io/e2e-${runTag()}`;

test('a platform admin allows a registry and removes it again', async () => {
  await withPage(browser, 'images-allow-list', async (page, errors) => {
    await signInAdmin(page);
    await page.getByRole('link', { name: 'Images', exact: true }).click();
    await page.waitForURL(`${BASE}/admin/images`);
    await hydrated(page);
    const before = await api(page, 'GET', '/api/v1/registries');
    const empty = page.locator('[data-testid=no-registries]');
    if (before.length === 0) {
      await empty.waitFor();
      assert.match(await empty.innerText(), /No registry is allowed yet/);
    }
    assert.deepEqual(await axeViolations(page), [], 'the Images page');

    await page.fill('#allow-entry', ENTRY);
    await page.getByRole('button', { name: 'Allow', exact: true }).click();
    const row = page.locator(`[data-testid=allowed-registry][data-entry="${ENTRY}"]`);
    await row.waitFor();
    assert.equal(await empty.count(), 0, 'the empty state is gone');
    assert.ok((await api(page, 'GET', '/api/v1/registries')).includes(ENTRY));

    // A bad entry is refused next to the field, and nothing is added.
    await page.fill('#allow-entry', 'not a registry');
    await page.getByRole('button', { name: 'Allow', exact: true }).click();
    await page.locator('#registry-error').waitFor();
    assert.equal(
      (await api(page, 'GET', '/api/v1/registries')).length,
      before.length + 1,
      'the bad entry was not added',
    );

    page.once('dialog', (d) => d.accept());
    await row.getByRole('button', { name: 'Remove' }).click();
    await row.waitFor({ state: 'detached' });
    assert.ok(!(await api(page, 'GET', '/api/v1/registries')).includes(ENTRY));
    if (before.length === 0) await empty.waitFor();
    assert.deepEqual(errors, []);
  });
});

test('a team admin saves a registry login on the team page; the password never comes back', async () => {
  const suffix = runTag();
  const LEAD = `images-lead-${suffix}`;
  const PASSWORD = 'images password 1';
  const SECRET = `s3cret-${suffix}-token`;
  let teamId;
  await withPage(browser, 'images-team-setup', async (page) => {
    await signInAdmin(page);
    teamId = (await api(page, 'POST', '/api/v1/teams', { name: `Images Lab ${suffix}` })).id;
    await api(page, 'POST', '/api/v1/users', { username: LEAD, password: PASSWORD });
    await api(page, 'POST', `/api/v1/teams/${teamId}/members`, { username: LEAD, role: 'team_admin' });
  });
  await withPage(browser, 'images-team-login', async (page, errors) => {
    await signInAs(page, LEAD, PASSWORD);
    await page.goto(`${BASE}/teams/${teamId}`);
    await hydrated(page);
    const section = page.locator('[data-testid=team-images]');
    await section.locator('[data-testid=no-images]').waitFor();
    await section.locator('[data-testid=no-logins]').waitFor();
    // The profile form offers the node's environment first, as the default.
    const env = page.locator('#profile-image');
    assert.equal(await env.locator('option').first().innerText(), 'Node environment (default)');
    assert.equal(await env.inputValue(), '');

    const password = page.locator('#login-password');
    assert.equal(await password.getAttribute('type'), 'password');
    assert.equal(await password.getAttribute('autocomplete'), 'off');
    await page.fill('#login-registry', 'ghcr.io');
    await page.fill('#login-username', 'bot');
    await password.fill(SECRET);
    await page.getByRole('button', { name: 'Save login' }).click();
    const row = section.locator('[data-testid=registry-login][data-registry="ghcr.io"]');
    await row.waitFor();
    assert.match(await row.innerText(), /bot/);
    const logins = await api(page, 'GET', `/api/v1/teams/${teamId}/registry-logins`);
    assert.deepEqual(logins.map((l) => [l.registry, l.username]), [['ghcr.io', 'bot']]);

    // A fresh load of the page: the password is nowhere in it.
    await page.reload();
    await hydrated(page);
    await row.waitFor();
    assert.ok(!(await page.content()).includes(SECRET), 'the password is not in the page');
    assert.equal(await page.inputValue('#login-password'), '');

    page.once('dialog', (d) => d.accept());
    await row.getByRole('button', { name: 'Remove' }).click();
    await section.locator('[data-testid=no-logins]').waitFor();
    assert.deepEqual(errors, []);
  });
});
