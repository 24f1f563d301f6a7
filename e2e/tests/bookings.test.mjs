// Bookings journey on the embedded default's simulated nodes: a team admin books a 1g.10gb
// slice from the form on /bookings (a window that ends before it starts is refused next to
// the end field, the typed values kept), sees the booking on the week's calendar on the
// day it covers with its time range and team, and cancels it (after a confirmation); a
// member of the team sees the calendar but no booking form and no cancel button.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  withPage, hydrated, BASE, ADMIN_SECOND_PASSWORD, fileBrowser, runTag, signInAs, api, settled, signInAdmin,
} from './helpers.mjs';

const browser = fileBrowser();

const suffix = runTag();
const TEAM = `Booking Lab ${suffix}`;
const LEAD = `book-lead-${suffix}`;
const MEMBER = `book-member-${suffix}`;
const PASSWORD = 'booking password 1';
const SLICE = 'H100-80GB:1g.10gb';

// Two days ahead (UTC), as the datetime-local inputs take it.
const day = new Date(Date.now() + 2 * 86400000).toISOString().slice(0, 10);
let bookingId;

test('a team admin books from the form, sees it on the calendar and cancels it', async () => {
  await withPage(browser, 'bookings-admin', async (page) => {
    await signInAdmin(page, ADMIN_SECOND_PASSWORD);
    const team = await api(page, 'POST', '/api/v1/teams', { name: TEAM });
    for (const [user, role] of [[LEAD, 'team_admin'], [MEMBER, 'member']]) {
      await api(page, 'POST', '/api/v1/users', { username: user, password: PASSWORD });
      await api(page, 'POST', `/api/v1/teams/${team.id}/members`, { username: user, role });
    }
    await api(page, 'PUT', `/api/v1/teams/${team.id}/quotas/H100-80GB`, { guaranteed: 0, limit: 14, per_user: 14 });
  });

  await withPage(browser, 'bookings-lead', async (page, errors) => {
    await signInAs(page, LEAD, PASSWORD);
    await page.click('nav >> text=Bookings');
    await page.waitForURL(`${BASE}/bookings`);
    await page.goto(`${BASE}/bookings?week=${day}`);
    await hydrated(page);
    await settled(page);
    const form = page.locator('[data-testid=book-form]');
    await form.locator('select[name=kind]').selectOption(SLICE);
    await form.locator('input[name=count]').fill('1');
    await form.locator('input[name=starts_at]').fill(`${day}T12:00`);
    await form.locator('input[name=ends_at]').fill(`${day}T10:00`);
    await form.locator('textarea[name=purpose]').fill(`workshop ${suffix}`);
    await form.locator('button[type=submit]').click();
    await page.locator('#ends_at-error').waitFor();
    assert.match(await page.innerText('#ends_at-error'), /after/);
    assert.equal(await form.locator('input[name=starts_at]').inputValue(), `${day}T12:00`, 'typed start kept');

    await form.locator('input[name=starts_at]').fill(`${day}T10:00`);
    await form.locator('input[name=ends_at]').fill(`${day}T12:00`);
    await form.locator('button[type=submit]').click();
    await page.locator('[data-testid=booked]').waitFor();
    assert.match(await page.innerText('[data-testid=booked]'), new RegExp(`1 × ${SLICE} for ${TEAM}`));

    const entry = page.locator('[data-testid=booking]', { hasText: `workshop ${suffix}` });
    await entry.waitFor();
    bookingId = await entry.getAttribute('data-id');
    assert.match(bookingId, /^[0-9a-f-]{36}$/);
    const text = await entry.innerText();
    assert.match(text, /10:00–12:00/);
    assert.match(text, new RegExp(TEAM));
    assert.equal(await entry.getAttribute('data-state'), 'booked');
    // On the column of its day: the day's header is the cell's column.
    const column = await entry.evaluate((li) => li.closest('td').cellIndex);
    const heads = await page.locator('[data-testid=booking-calendar] thead th time').evaluateAll(
      (ts) => ts.map((t) => t.getAttribute('datetime')),
    );
    assert.equal(heads[column], day);

    page.once('dialog', (d) => d.accept());
    await entry.locator('[data-testid=cancel-booking]').click();
    await page.locator(`[data-testid=booking][data-id="${bookingId}"]`).waitFor({ state: 'detached' });
    const after = await api(page, 'GET', `/api/v1/bookings/${bookingId}`);
    assert.equal(after.state, 'cancelled');
    assert.deepEqual(errors, [], 'no uncaught page errors');
  });
});

test('a member reads the calendar without the booking form or cancel buttons', async () => {
  await withPage(browser, 'bookings-member', async (page) => {
    await signInAs(page, LEAD, PASSWORD);
    await api(page, 'POST', '/api/v1/bookings', {
      team_id: (await api(page, 'GET', `/api/v1/bookings/${bookingId}`)).team_id,
      kind: SLICE, starts_at: `${day}T14:00`, ends_at: `${day}T15:00`, purpose: `member view ${suffix}`,
    });
  });
  await withPage(browser, 'bookings-member-view', async (page) => {
    await signInAs(page, MEMBER, PASSWORD);
    await page.goto(`${BASE}/bookings?week=${day}`);
    await hydrated(page);
    await settled(page);
    const entry = page.locator('[data-testid=booking]', { hasText: `member view ${suffix}` });
    await entry.waitFor();
    assert.match(await entry.innerText(), /14:00–15:00/);
    assert.equal(await entry.locator('[data-testid=cancel-booking]').count(), 0);
    assert.equal(await page.locator('[data-testid=book-form]').count(), 0);
  });
});
