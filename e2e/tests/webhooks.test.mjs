// A team's webhooks on the team page (docs/notifications.md): the team admin sends a test
// delivery and reads the answer next to the hook (the same answer as the REST API's test),
// opens the delivery log (empty: tests are not logged), turns the hook off and on again,
// and the page stays free of serious accessibility violations with the log open.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  withPage, hydrated, signInAs, eventually, BASE, fileBrowser, runTag, api, axeViolations, signInAdmin,
} from './helpers.mjs';

const browser = fileBrowser();

const suffix = runTag();
const TEAM = `Hooks Lab ${suffix}`;
const LEAD = `hooks-lead-${suffix}`;
const PASSWORD = 'hooks password 1';
// A public address (private ones are refused unless the platform allows them); whether
// it answers depends on the network, so the test accepts either outcome and compares it
// with the REST API's.
const HOOK_URL = 'https://93.184.216.34/tessera-e2e-hook';

let teamId;
let hookId;

test('setup: a team with its admin and one webhook', async () => {
  await withPage(browser, 'webhooks-setup', async (page) => {
    await signInAdmin(page);
    teamId = (await api(page, 'POST', '/api/v1/teams', { name: TEAM })).id;
    await api(page, 'POST', '/api/v1/users', { username: LEAD, password: PASSWORD });
    await api(page, 'POST', `/api/v1/teams/${teamId}/members`, { username: LEAD, role: 'team_admin' });
  });
  await withPage(browser, 'webhooks-setup-lead', async (page) => {
    await signInAs(page, LEAD, PASSWORD);
    hookId = (await api(page, 'POST', `/api/v1/teams/${teamId}/webhooks`, { url: HOOK_URL })).webhook.id;
  });
});

test('the team admin tests a webhook, reads its log and turns it off and on', async () => {
  await withPage(browser, 'webhooks-team-admin', async (page, errors) => {
    await signInAs(page, LEAD, PASSWORD);
    await page.goto(`${BASE}/teams/${teamId}`);
    await hydrated(page);
    const row = page.locator('[data-testid=webhook-row]', { hasText: HOOK_URL });
    await row.waitFor();
    assert.equal(await row.getAttribute('data-enabled'), 'true');

    // Send test: the answer shows next to the hook, as REST would answer it.
    await row.getByRole('button', { name: `Send test to ${HOOK_URL}` }).click();
    const result = row.locator('[data-testid=webhook-test-result]');
    await result.waitFor({ timeout: 30000 });
    const shown = await result.innerText();
    const rest = await api(page, 'POST', `/api/v1/teams/${teamId}/webhooks/${hookId}/test`);
    if (rest.delivered) {
      assert.match(shown, /^Test delivered/, shown);
    } else {
      assert.match(shown, /^Test failed/, shown);
      if (rest.status != null) assert.ok(shown.includes(`HTTP ${rest.status}`), shown);
    }

    // The delivery log, loaded when opened: tests are not in it.
    const log = page.locator('[data-testid=webhook-deliveries]').first();
    await log.locator('summary').click();
    await log.locator('[data-testid=no-deliveries]', { hasText: 'No deliveries yet.' }).waitFor();
    assert.deepEqual(await axeViolations(page), [], 'the team page with a delivery log open');

    // Off, then on again: the row and REST agree.
    await row.getByRole('button', { name: `Turn off ${HOOK_URL}` }).click();
    const off = page.locator('[data-testid=webhook-row][data-enabled=false]', { hasText: HOOK_URL });
    await off.waitFor();
    await off.locator('[data-testid=webhook-status]', { hasText: 'Off' }).waitFor();
    let hook = await api(page, 'GET', `/api/v1/teams/${teamId}/webhooks/${hookId}`);
    assert.equal(hook.enabled, false);
    assert.equal(hook.url, HOOK_URL);
    await off.getByRole('button', { name: `Turn on ${HOOK_URL}` }).click();
    await page.locator('[data-testid=webhook-row][data-enabled=true]', { hasText: HOOK_URL }).waitFor();
    await eventually(async () => {
      hook = await api(page, 'GET', `/api/v1/teams/${teamId}/webhooks/${hookId}`);
      return hook.enabled === true && hook.consecutive_failures === 0;
    }, { what: 'the hook to be on again', timeoutMs: 10000 });
    assert.deepEqual(errors, [], 'no uncaught page errors');
  });
});
