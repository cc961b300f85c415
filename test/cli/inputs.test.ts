/**
 * The CLI answers every value an operator types by its range (issue 27:
 * "no value a client or an operator sends is answered 500"): an id or a lease
 * beyond bigint is a usage error (exit 2) saying which, never "failed" with
 * PostgreSQL's words (exit 1, as it was), and nothing is done.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { writeServerSettings } from '../../src/core/settings'
import { stuckKey } from '../admin/support'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { runIdem } from '../support/cli'

let db: TestDatabase
beforeAll(async () => {
  db = await createTestDatabase('cli_inputs')
  await writeServerSettings(db.sql, { ttlSeconds: 30, retentionSeconds: 3600 })
})
afterAll(async () => {
  await db?.drop()
})

const idem = (args: string[]) => runIdem(db.url, args)

const BEYOND_BIGINT = '9999999999999999999'

test('an audit id, a --before or a --lease beyond bigint is a usage error (exit 2) naming it, and nothing is done', async () => {
  const lease = await stuckKey(db.sql, 'acme', 'cli-inputs-key')
  const cases: [string[], RegExp][] = [
    [['audit', BEYOND_BIGINT], /idem: an audit entry id is a whole number from 1 to 9223372036854775807/],
    [['audit', '--before', BEYOND_BIGINT], /idem: before must be an audit entry id/],
    [['expire', 'acme', 'cli-inputs-key', '--lease', BEYOND_BIGINT, '--yes'], /--lease .* must be a lease number as listed/],
  ]
  for (const [args, message] of cases) {
    const run = await idem(args)
    expect({ args, code: run.code }).toEqual({ args, code: 2 })
    expect(run.stderr).toMatch(message)
    expect(run.stderr).not.toContain('failed')
  }
  const [row] = await db.sql<{ lease: string; status: string }[]>`select lease::text, status from idempotency_key_states where key = 'cli-inputs-key'`
  expect(row).toEqual({ lease, status: 'processing' })
  // The largest bigint is an id: looked up, not refused.
  expect((await idem(['audit', '9223372036854775807'])).stderr).toContain('no audit entry 9223372036854775807')
})
