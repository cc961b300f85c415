/**
 * postgres.js 3.4.9 with several hosts in the URL (a failover setup:
 * `host1:port1,host2:port2`) treats a connection as connecting until its
 * first query is answered, and skips an error on a connecting connection to
 * try the next host: a first query whose server went away under it was never
 * settled. In a failover under load that left queries pending forever (the
 * service's heartbeat among them, and its SIGTERM drain waiting on it:
 * test/scale/failover.scale.ts). Driver fix 4 (src/store/driver-fixes.ts)
 * rejects such a query, as with one host.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { openPools } from '../../../src/store/db'
import { createTestDatabase, type TestDatabase } from '../../support/db'
import { startTcpProxy, type TcpProxy } from '../../support/tcp-proxy'

/** A query on a healthy local connection takes milliseconds; one unanswered by then hangs. */
const ANSWER_MS = 5_000

let db: TestDatabase
let proxy: TcpProxy
beforeAll(async () => {
  db = await createTestDatabase('edges_multi_host')
  proxy = await startTcpProxy(db.url)
})
afterAll(async () => {
  proxy?.stop()
  await db?.drop()
})

/** 'ok', the error's code, or 'hung'. */
function outcome(query: Promise<unknown>): Promise<string> {
  let timer: ReturnType<typeof setTimeout> | undefined
  const hung = new Promise<string>((resolve) => { timer = setTimeout(() => resolve('hung'), ANSWER_MS) })
  return Promise.race([query.then(() => 'ok', (error: { code?: string }) => String(error.code ?? error)), hung]).finally(() => clearTimeout(timer))
}

// Catches: driver fix 4 missing (the first query of a new connection to the first of two hosts, reset under it, hangs).
test('two hosts: a first query whose connection is reset under it is settled (answered from the next host or rejected), never left pending', async () => {
  const real = new URL(db.url)
  const through = new URL(proxy.url)
  // The proxy first, the server itself second: the connection that dies is to the first host.
  const url = `postgres://${real.username}${real.password ? `:${real.password}` : ''}@127.0.0.1:${through.port},127.0.0.1:${real.port}${real.pathname}${real.search}`
  const pools = openPools(url, { shortMax: 1, workMax: 1, applicationName: 'test:edges-multi-host' })
  try {
    const trapped = proxy.trap({ before: /select 'first' as query/, action: 'reset' })
    const first = outcome(pools.short`select 'first' as query`)
    await trapped
    expect(await first).not.toBe('hung')
    // And the pool serves afterwards.
    expect(await outcome(pools.short`select 1`)).toBe('ok')
  } finally {
    await pools.close(0)
  }
})
