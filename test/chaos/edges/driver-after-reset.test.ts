/**
 * The service's pools (src/store/db.ts, postgres.js 3.4) after a connection
 * reset: a query written to a connection whose RST the driver has not read
 * yet fails with ECONNRESET, as it should. The next query on that connection,
 * issued before the driver has seen the close (here: in the catch of the
 * failed one, as a retry or the next request does), must be answered or fail
 * too, never hang: a hung claim holds a client forever (SPEC: "none hangs").
 *
 * And the pool must then work again: a reset costs the queries it touched,
 * not the connection slot.
 *
 * In postgres.js 3.4.9 the next query hangs: the failed query stays the
 * connection's current one (porsager/postgres#1130, PR #1142), so the next
 * one is queued behind it, and the close that follows an error rejects
 * nothing queued. Every later query then fails with CONNECT_TIMEOUT: the slot
 * never connects again. One pool connection, so every query must use it.
 */
import { afterAll, afterEach, beforeAll, beforeEach, expect, test } from 'bun:test'
import { openPools, type Pools } from '../../../src/store/db'
import { createTestDatabase, type TestDatabase } from '../../support/db'
import { startTcpProxy, type TcpProxy } from '../../support/tcp-proxy'
import { waitFor } from '../../support/wait'

/** A query on a healthy local connection takes milliseconds; one unanswered by then hangs. */
const ANSWER_MS = 3_000
/** The pool reconnects within its backoff (0.1 s, then up to 0.5 s) and a 2 s connect timeout: by then it serves again. */
const RECOVER_MS = 5_000

let db: TestDatabase
let proxy: TcpProxy
let pools: Pools

beforeAll(async () => {
  db = await createTestDatabase('edges_driver')
  proxy = await startTcpProxy(db.url)
})
/** The service's pools with one connection each, fresh for each test. */
beforeEach(() => {
  pools = openPools(proxy.url, { shortMax: 1, workMax: 1, applicationName: 'test:edges-driver' })
})
afterEach(async () => {
  await pools.close(0)
})
afterAll(async () => {
  proxy?.stop()
  await db?.drop()
})

/** 'ok', the error's code, or 'hung'. */
function outcome(query: Promise<unknown>): Promise<string> {
  let timer: ReturnType<typeof setTimeout> | undefined
  const hung = new Promise<string>((resolve) => { timer = setTimeout(() => resolve('hung'), ANSWER_MS) })
  return Promise.race([query.then(() => 'ok', (error: { code?: string }) => String(error.code)), hung]).finally(() => clearTimeout(timer))
}

test('after a reset, the query that meets it fails, and the next one on the same connection is answered or fails: none hangs', async () => {
  expect(await outcome(pools.short`select 1`)).toBe('ok')
  proxy.reset()
  const steps: string[] = []
  const next = await outcome(pools.short`select 2`.catch((error: { code?: string }) => {
    steps.push(`select 2: ${error.code}`)
    return pools.short`select 3` // a retry, at once
  }))
  steps.push(`select 3: ${next}`)
  steps.push(`select 4: ${await outcome(pools.short`select 4`)}`)
  console.log(`[edges] pool after a reset: ${steps.join('; ')}`)
  expect(steps.filter((step) => step.endsWith('hung'))).toEqual([])
})

test('after such a reset, the pool serves again within seconds: the reset cost queries, not the connection slot', async () => {
  expect(await outcome(pools.short`select 1`)).not.toBe('hung')
  proxy.reset()
  const steps = [await outcome(pools.short`select 2`.catch(() => pools.short`select 3`))]
  const seen: string[] = []
  await waitFor(async () => {
    seen.push(await outcome(pools.short`select 5`))
    return seen.at(-1) === 'ok'
  }, () => `a query to succeed on the pool again (the retry: ${steps[0]}; then: ${seen.join(', ')})`, RECOVER_MS)
})
