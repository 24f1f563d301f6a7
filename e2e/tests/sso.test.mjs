// Single sign-on in a real browser: a user who has never been to Tessera clicks "Sign in
// with Test IdP", signs in at the identity provider (oidc-provider, started by `cargo xtask
// e2e` with the group map `gpu-vision-admins=SSO Vision:team_admin`), and lands on the
// dashboard as a team admin of "SSO Vision".
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  withPage, hydrated, signIn, BASE, ADMIN_SECOND_PASSWORD, fileBrowser,
} from './helpers.mjs';

const IDP = process.env.TESSERA_IDP_URL;
if (!IDP) throw new Error('set TESSERA_IDP_URL (cargo xtask e2e starts the identity provider)');

const browser = fileBrowser();

const TEAM = 'SSO Vision';
const USER = `erin-${Date.now().toString(36).slice(-5)}`;

async function idpUser(username, groups) {
  const r = await fetch(`${IDP}/__test/users`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ username, password: `${username}-password`, groups }),
  });
  assert.equal(r.status, 200, 'identity provider accepted the test user');
}

test('a new user signs in through the identity provider and lands in the mapped team', async () => {
  await withPage(browser, 'sso-admin-team', async (page) => {
    await signIn(page, 'admin', ADMIN_SECOND_PASSWORD);
    await page.waitForURL(`${BASE}/`);
    await page.goto(`${BASE}/teams`);
    await hydrated(page);
    await page.fill('#team-name', TEAM);
    await page.click('#create-team button[type=submit]');
    await page.locator('[data-testid=teams] a', { hasText: TEAM }).waitFor();
  });
  await idpUser(USER, ['gpu-vision-admins', 'some-unmapped-group']);

  await withPage(browser, 'sso-sign-in', async (page, errors) => {
    await page.goto(`${BASE}/login`);
    await hydrated(page);
    const button = page.locator('form.sso button', { hasText: 'Sign in with Test IdP' });
    await button.waitFor();
    await button.click();

    // At the identity provider.
    await page.waitForURL((url) => url.href.startsWith(`${IDP}/interaction/`));
    assert.equal(await page.title(), 'Test IdP sign-in');
    await page.fill('input[name=username]', USER);
    await page.fill('input[name=password]', 'not the password');
    await page.click('button[type=submit]');
    await page.locator('[role=alert]', { hasText: 'Wrong username or password' }).waitFor();
    await page.fill('input[name=username]', USER);
    await page.fill('input[name=password]', `${USER}-password`);
    await page.click('button[type=submit]');

    // Back at Tessera, signed in.
    await page.waitForURL(`${BASE}/`);
    await hydrated(page);
    await page.locator('h1', { hasText: 'Dashboard' }).waitFor();
    assert.equal(await page.innerText('[data-testid=current-user]'), USER);

    await page.goto(`${BASE}/teams`);
    await hydrated(page);
    const row = page.locator('[data-testid=teams] tr', { hasText: TEAM });
    await row.waitFor();
    assert.match(await row.innerText(), /Team admin/);
    assert.deepEqual(errors, [], 'no uncaught page errors');
  });
});

test('the admin sees the new user marked as a single sign-on user', async () => {
  await withPage(browser, 'sso-admin-users', async (page) => {
    await signIn(page, 'admin', ADMIN_SECOND_PASSWORD);
    await page.waitForURL(`${BASE}/`);
    await page.goto(`${BASE}/admin/users`);
    await hydrated(page);
    await page.locator(`tr[data-username="${USER}"] .badge`, { hasText: 'SSO' }).waitFor();
    assert.equal(
      await page.locator('tr[data-username="admin"] .badge', { hasText: 'SSO' }).count(),
      0,
      'the local admin is not marked',
    );
  });
});

test('a failed single sign-on explains itself on the sign-in page', async () => {
  await withPage(browser, 'sso-error', async (page) => {
    await page.goto(`${BASE}/login?sso_error=disabled`);
    await hydrated(page);
    await page.locator('[role=alert]', { hasText: 'Your account is disabled' }).waitFor();
    // The password form is still there.
    await page.locator('#sign-in').waitFor();
  });
});
