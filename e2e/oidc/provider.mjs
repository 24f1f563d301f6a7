// A real OpenID Provider for tests: `oidc-provider` (a certified Node implementation) on
// loopback, with one confidential test client, a few users with group claims, and a
// login page of its own.
//
//   node e2e/oidc/provider.mjs --redirect-uri http://127.0.0.1:3000/auth/oidc/callback \
//        [--port 0] [--client-id tessera] [--client-secret …] [--claims-in userinfo]
//
// `--claims-in userinfo` keeps profile and group claims out of the ID token (only `sub`),
// as the spec has it for the code flow; clients must ask the userinfo endpoint.
//
// Prints one JSON line on stdout once listening: {"issuer": "http://127.0.0.1:PORT"}.
//
// Test controls (loopback only, not part of OpenID Connect):
//   POST /__test/users   {"username", "password", "groups": [...], "email"?, "name"?}
//        adds or replaces a user (the next sign-in sees the new groups).
//   POST /__test/rotate  {}
//        rotates the signing key: from now on ID tokens are signed with a new key (new
//        `kid`), which the JWKS endpoint publishes beside the old one.
//   POST /__test/fault   {"mode": "bad-signature" | "expired" | "none"}
//        tampers with the ID token of the next token response only:
//        bad-signature: re-signed with a key the provider never published (same `kid`);
//        expired: re-signed with the provider's own key, but `exp` an hour in the past.

import http from 'node:http';
import process from 'node:process';
import { parseArgs } from 'node:util';
import {
  SignJWT, decodeJwt, decodeProtectedHeader, exportJWK, generateKeyPair,
} from 'jose';

// Two start-up warnings that do not apply to a throwaway test provider (Node 20 is
// "unsupported" but works; the in-memory adapter is what a test wants).
const warn = console.warn;
console.warn = (...a) => {
  const text = String(a[0] ?? '');
  if (/Unsupported runtime|in-memory adapter/.test(text)) return;
  warn(...a);
};

const { default: Provider } = await import('oidc-provider');

const { values: args } = parseArgs({
  options: {
    port: { type: 'string', default: '0' },
    'redirect-uri': { type: 'string', multiple: true, default: [] },
    'client-id': { type: 'string', default: 'tessera' },
    'client-secret': { type: 'string', default: 'tessera-test-client-secret-0123456789' },
    'claims-in': { type: 'string', default: 'id_token' },
  },
});

const users = new Map();
function putUser(u) {
  users.set(u.username, {
    username: u.username,
    password: u.password,
    groups: u.groups ?? [],
    email: u.email ?? `${u.username}@idp.test`,
    name: u.name ?? u.username,
  });
}
putUser({ username: 'alice', password: 'alice-password', groups: ['gpu-vision-admins'] });
putUser({ username: 'bob', password: 'bob-password', groups: ['gpu-vision'] });
putUser({ username: 'carol', password: 'carol-password', groups: ['gpu-unknown'] });

// The signing key the provider publishes, and one it never does (for forged tokens).
const kid = 'test-signing-key';
const signing = await generateKeyPair('RS256', { extractable: true });
const forger = await generateKeyPair('RS256', { extractable: true });
const signingJwk = { ...(await exportJWK(signing.privateKey)), kid, alg: 'RS256', use: 'sig' };

let fault = 'none';
// Set by /__test/rotate: the key ID tokens are signed with from then on, and its public JWK.
let rotated = null;

const server = http.createServer();
await new Promise((resolve) => { server.listen(Number(args.port), '127.0.0.1', resolve); });
const issuer = `http://127.0.0.1:${server.address().port}`;

const provider = new Provider(issuer, {
  clients: [{
    client_id: args['client-id'],
    client_secret: args['client-secret'],
    redirect_uris: args['redirect-uri'],
    response_types: ['code'],
    grant_types: ['authorization_code'],
    token_endpoint_auth_method: 'client_secret_basic',
  }],
  jwks: { keys: [signingJwk] },
  scopes: ['openid', 'profile', 'email', 'groups'],
  claims: {
    openid: ['sub'],
    profile: ['name', 'preferred_username'],
    email: ['email'],
    groups: ['groups'],
  },
  // By default the scopes' claims go in the ID token itself, as Keycloak/Azure AD group
  // mappers put them; `--claims-in userinfo` leaves them to the userinfo endpoint.
  conformIdTokenClaims: args['claims-in'] === 'userinfo',
  features: { devInteractions: { enabled: false } },
  pkce: { required: () => true },
  ttl: {
    AuthorizationCode: 60, IdToken: 300, AccessToken: 300, Interaction: 600,
    Session: 3600, Grant: 3600,
  },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  // A first-party client: no consent screen.
  async loadExistingGrant(ctx) {
    const grantId = ctx.oidc.result?.consent?.grantId
      || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) {
      const found = await ctx.oidc.provider.Grant.find(grantId);
      if (found) return found;
    }
    const grant = new ctx.oidc.provider.Grant({
      clientId: ctx.oidc.client.clientId,
      accountId: ctx.oidc.session.accountId,
    });
    grant.addOIDCScope('openid profile email groups');
    await grant.save();
    return grant;
  },
  async findAccount(ctx, sub) {
    const u = users.get(sub);
    if (!u) return undefined;
    return {
      accountId: sub,
      async claims() {
        return {
          sub, name: u.name, preferred_username: u.username, email: u.email, groups: u.groups,
        };
      },
    };
  },
});

async function tamper(idToken, mode) {
  const claims = decodeJwt(idToken);
  const header = decodeProtectedHeader(idToken);
  const now = Math.floor(Date.now() / 1000);
  if (mode === 'expired') {
    return new SignJWT({ ...claims, iat: now - 7200, exp: now - 3600 })
      .setProtectedHeader(header).sign(signing.privateKey);
  }
  return new SignJWT(claims).setProtectedHeader(header).sign(forger.privateKey);
}

async function resign(idToken) {
  const header = { ...decodeProtectedHeader(idToken), kid: rotated.jwk.kid };
  return new SignJWT(decodeJwt(idToken)).setProtectedHeader(header).sign(rotated.privateKey);
}

provider.use(async (ctx, next) => {
  await next();
  if (ctx.path === '/token' && ctx.status === 200 && ctx.body?.id_token) {
    let idToken = ctx.body.id_token;
    if (rotated) idToken = await resign(idToken);
    if (fault !== 'none') {
      const mode = fault;
      fault = 'none';
      idToken = await tamper(idToken, mode);
    }
    ctx.body = { ...ctx.body, id_token: idToken };
  }
  if (ctx.path === '/jwks' && ctx.status === 200 && rotated && Array.isArray(ctx.body?.keys)) {
    ctx.body = { keys: [...ctx.body.keys, rotated.jwk] };
  }
});

const escape = (s) => String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

function loginPage(uid, error) {
  return `<!doctype html><html><head><title>Test IdP sign-in</title></head><body>
<h1>Test IdP</h1>
${error ? `<p role="alert">${escape(error)}</p>` : ''}
<form method="post" action="/interaction/${escape(uid)}/login">
<label>Username <input name="username" autocomplete="username" autofocus></label>
<label>Password <input name="password" type="password" autocomplete="current-password"></label>
<button type="submit">Sign in</button>
</form></body></html>`;
}

async function readBody(req) {
  const chunks = [];
  for await (const c of req) chunks.push(c);
  return Buffer.concat(chunks).toString('utf8');
}

function send(res, status, type, body) {
  res.writeHead(status, { 'content-type': type, 'cache-control': 'no-store' });
  res.end(body);
}

async function interaction(req, res, path) {
  const m = path.match(/^\/interaction\/([^/]+)(\/login)?$/);
  if (!m) return send(res, 404, 'text/plain', 'not found');
  const details = await provider.interactionDetails(req, res);
  if (details.uid !== m[1]) return send(res, 400, 'text/plain', 'interaction mismatch');
  if (req.method === 'GET') return send(res, 200, 'text/html', loginPage(details.uid));
  const form = new URLSearchParams(await readBody(req));
  const u = users.get(form.get('username') ?? '');
  if (!u || u.password !== form.get('password')) {
    return send(res, 200, 'text/html', loginPage(details.uid, 'Wrong username or password.'));
  }
  return provider.interactionFinished(
    req,
    res,
    { login: { accountId: u.username } },
    { mergeWithLastSubmission: false },
  );
}

async function control(req, res, path) {
  const body = JSON.parse((await readBody(req)) || '{}');
  if (path === '/__test/users') {
    putUser(body);
  } else if (path === '/__test/rotate') {
    const pair = await generateKeyPair('RS256', { extractable: true });
    const jwk = {
      ...(await exportJWK(pair.publicKey)), kid: `rotated-${Date.now()}`, alg: 'RS256', use: 'sig',
    };
    rotated = { privateKey: pair.privateKey, jwk };
  } else if (path === '/__test/fault') {
    if (!['none', 'bad-signature', 'expired'].includes(body.mode)) {
      return send(res, 400, 'text/plain', 'unknown fault');
    }
    fault = body.mode;
  } else {
    return send(res, 404, 'text/plain', 'not found');
  }
  return send(res, 200, 'application/json', '{"ok":true}');
}

const callback = provider.callback();
server.on('request', (req, res) => {
  const path = new URL(req.url, issuer).pathname;
  let handled;
  if (path.startsWith('/interaction/')) handled = interaction(req, res, path);
  else if (path.startsWith('/__test/') && req.method === 'POST') handled = control(req, res, path);
  else return callback(req, res);
  return handled.catch((e) => {
    console.error(e);
    if (!res.headersSent) send(res, 500, 'text/plain', String(e?.message ?? e));
  });
});

process.stdout.write(`${JSON.stringify({ issuer })}\n`);
