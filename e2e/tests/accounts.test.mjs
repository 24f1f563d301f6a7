// The first user journey: sign in (wrong, then right), dashboard, change password, sign out,
// sign in again. Plus: forms work before hydration.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  withPage, hydrated, signIn, BASE, ADMIN_PASSWORD, fileBrowser,
} from './helpers.mjs';

const browser = fileBrowser();

const NEW_PASSWORD = 'e2e second password 2';

test('admin signs in, changes password, signs out and back in', async () => {
  await withPage(browser, 'password-journey', async (page, errors) => {
    await signIn(page, 'admin', 'definitely-wrong-pw');
    const err = page.locator('.form-error');
    await err.waitFor();
    assert.match(await err.innerText(), /invalid username or password/);
    assert.equal(await page.inputValue('#username'), 'admin', 'typed username kept');

    // The sign-in page is plain HTML (no wasm bundle): its show/hide toggle is a few lines
    // of script.
    assert.equal(await page.locator('link[rel=modulepreload], link[rel=preload]').count(), 0,
      'the sign-in page loads no bundle');
    await page.fill('#password', ADMIN_PASSWORD);
    // Having typed, the visitor's browser prefetches it for the page after signing in.
    assert.equal(await page.locator('link[rel=prefetch][href$="_bg.wasm"]').count(), 1);
    await page.click('button[data-toggle-for=password]');
    assert.equal(await page.getAttribute('#password', 'type'), 'text');
    await page.click('button[data-toggle-for=password]');
    assert.equal(await page.getAttribute('#password', 'type'), 'password');

    await page.click('#sign-in');
    await page.waitForURL(`${BASE}/`);
    await page.locator('h1', { hasText: 'Dashboard' }).waitFor();
    await hydrated(page);
    assert.equal(await page.innerText('[data-testid=current-user]'), 'admin');

    await page.click('nav >> text=My account');
    await page.waitForURL(`${BASE}/account`);
    await page.locator('h2', { hasText: 'Change password' }).waitFor();
    await page.fill('#current_password', ADMIN_PASSWORD);
    await page.fill('#new_password', 'short');
    await page.fill('#confirm_password', 'short');
    await page.click('#change-password button[type=submit]');
    await page.locator('#new_password-error').waitFor();
    assert.match(await page.innerText('#new_password-error'), /at least 12/);

    await page.fill('#current_password', ADMIN_PASSWORD);
    await page.fill('#new_password', NEW_PASSWORD);
    await page.fill('#confirm_password', NEW_PASSWORD);
    await page.click('#change-password button[type=submit]');
    await page.locator('.notice', { hasText: 'Password changed.' }).waitFor();

    await page.click('text=Log out');
    await page.waitForURL(`${BASE}/login`);
    // Signed out, a page sends the visitor to sign in, remembering where they were going.
    await page.goto(`${BASE}/`);
    await page.waitForURL(`${BASE}/login?next=%2F`);

    await signIn(page, 'admin', NEW_PASSWORD);
    await page.waitForURL(`${BASE}/`);
    await page.locator('h1', { hasText: 'Dashboard' }).waitFor();
    await hydrated(page);
    assert.deepEqual(errors, [], 'no uncaught page errors');
  });
});

test('an anonymous visit to a page signs in and lands back on that page', async () => {
  await withPage(browser, 'next-after-login', async (page) => {
    const r = await page.request.get(`${BASE}/allocations?state=active`, { maxRedirects: 0 });
    assert.equal(r.status(), 303);
    assert.equal(r.headers().location, '/login?next=%2Fallocations%3Fstate%3Dactive');
    await page.goto(`${BASE}/allocations?state=active`);
    await page.waitForURL(/\/login\?next=/);
    await hydrated(page);
    await page.fill('#username', 'admin');
    await page.fill('#password', NEW_PASSWORD);
    // Having typed, the browser prefetches the bundle and the chunks of the page it is
    // headed for, which is loaded on demand.
    assert.equal(await page.locator('link[rel=prefetch][href$="_bg.wasm"]').count(), 1);
    assert.equal(await page.locator('link[rel=prefetch][href*="/pkg/split_work_"]').count(), 1);
    await page.click('#sign-in');
    await page.waitForURL(`${BASE}/allocations?state=active`);
    await hydrated(page);
    // The allocations page is loaded on demand (app/src/pages.rs): its response named the
    // chunks of its group for the browser to fetch beside the main module, the dashboard's
    // did not, and the page hydrated with them.
    assert.equal(await page.locator('link[rel=preload][href*="/pkg/split_work_"]').count(), 1);
    assert.equal(await page.locator('link[rel=preload][href*="/pkg/split_admin_"]').count(), 0);
    await page.click('nav >> text=Dashboard');
    await page.locator('h1', { hasText: 'Dashboard' }).waitFor();
    await page.goto(`${BASE}/`);
    await hydrated(page);
    assert.equal(await page.locator('link[rel=preload][href*="/pkg/split_"]').count(), 0);
  });
});

test('the login form works without JavaScript', async () => {
  await withPage(browser, 'no-js-login', async (page) => {
    await page.goto(`${BASE}/login`);
    await page.fill('#username', 'Admin');
    await page.fill('#password', 'wrong-password-again');
    await page.click('#sign-in');
    await page.locator('.form-error').waitFor();
    assert.equal(await page.inputValue('#username'), 'Admin', 'typed username kept');
    await page.fill('#password', NEW_PASSWORD);
    await page.click('#sign-in');
    await page.waitForURL(`${BASE}/`);
    await page.locator('h1', { hasText: 'Dashboard' }).waitFor();
  }, { javaScriptEnabled: false });
});
