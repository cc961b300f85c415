/**
 * Revocation that revokes (issue 27, ASVS 3.3.3): a session is bound to the
 * credential that opened it. The service restarted with an operator removed
 * from ADMIN_TOKENS, or with their token rotated, ends their sessions at
 * once: the old cookie opens nothing and acts on nothing, and the sessions
 * page says why until the session's next request deletes it.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { credential } from '../../src/admin/operators'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { getPage, postForm, signIn, startAdmin, stuckKey, type AdminServer } from './support'

const ALICE = 'alice-token-0123456789abcdef0123456789'
const BOB = 'bob-token-0123456789abcdef0123456789ab'
const ALICE_ROTATED = 'alice-rotated-0123456789abcdef01234567'

let db: TestDatabase
let admin: AdminServer | undefined
beforeAll(async () => { db = await createTestDatabase('admin_revocation') })
afterAll(async () => {
  await admin?.stop()
  await db?.drop()
})

/** The admin as a restarted process sees it: the same database, these operators. */
async function restartWith(operators: Record<string, string>): Promise<string> {
  await admin?.stop()
  admin = startAdmin(db.pools, { operators: Object.entries(operators).map(([name, token]) => credential(name, token)) })
  return admin.url
}

test('an operator removed from ADMIN_TOKENS, or given a new token, is signed out everywhere at once', async () => {
  let url = await restartWith({ alice: ALICE, bob: BOB })
  const bob = await signIn(url, '', BOB)
  const alice = await signIn(url, '', ALICE)
  expect((await getPage(url, '/admin', bob)).response.status).toBe(200)

  // Bob is removed.
  url = await restartWith({ alice: ALICE })
  const listed = await getPage(url, '/admin/sessions', alice)
  expect(listed.response.status).toBe(200)
  expect(listed.html).toContain('revoked: this operator is no longer in ADMIN_TOKENS')
  // His old cookie cannot act (the first thing it tries after the restart): the force-expire is refused, nothing is written.
  const lease = await stuckKey(db.sql, 'acme', 'revoked-bob-key')
  const expire = await postForm(url, '/admin/keys/expire', { csrf: bob.csrf, tenant: 'acme', key: 'revoked-bob-key', lease }, { cookie: bob.cookie })
  expect(expire.status).toBe(401)
  const [audit] = await db.sql<{ n: number }[]>`select count(*)::int as n from idempotency_audit where actor like '%bob%'`
  expect(audit!.n).toBe(0)
  const [key] = await db.sql<{ status: string }[]>`select status from idempotency_key_states where key = 'revoked-bob-key'`
  expect(key!.status).toBe('processing')
  // Nor open a page.
  const page = await getPage(url, '/admin', bob)
  expect(page.response.status).toBe(303)
  expect(page.response.headers.get('location')).toStartWith('/admin/login')
  // His session is gone from the list once its cookie was tried.
  expect((await getPage(url, '/admin/sessions', alice)).html).not.toContain('revoked: this operator is no longer')

  // Alice's token is rotated: her old cookie ends too; the new token signs in.
  url = await restartWith({ alice: ALICE_ROTATED })
  expect((await getPage(url, '/admin/sessions', alice)).response.status).toBe(303)
  const again = await signIn(url, '', ALICE_ROTATED)
  expect((await getPage(url, '/admin', again)).response.status).toBe(200)
  const [sessions] = await db.sql<{ open: number }[]>`select count(*)::int as open from admin_sessions`
  expect(sessions!.open).toBe(1)
})
