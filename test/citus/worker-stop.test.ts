/**
 * A worker lost under load (issue 47): in the first trial one worker stopped
 * for 5 s gave no tenant a 2xx for about 11 s, those on the healthy worker
 * included (every claim touched every worker, with a 2PC over all of them),
 * and the heartbeat (a reference table, written on every node) made live
 * owners look gone. Clients of four tenants, two on each worker, pay fresh
 * keys all along, and:
 * - worker 1 stopped for 5 s: the other worker's tenants are served during
 *   it (2xx, no 5xx); after it returns one payment and one charge per key,
 *   nothing stuck, the stopped worker's tenants paid again;
 * - worker 1 stopped for longer than the heartbeat's liveness window: the
 *   requests in flight on the other worker are not taken over;
 * - worker 1 frozen (SIGSTOP) for 5 s: the other worker's tenants keep
 *   paying, with no 5xx; afterwards exactly once holds.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import postgres from 'postgres'
import { isCitus } from '../../src/store/citus'
import { PROCESS_ALIVE_SECONDS } from '../../src/core/processes'
import type { CitusCluster, CitusDatabase } from '../support/citus'
import { payment, postPayment } from '../support/http'
import { startGatedProvider, startServer, type GatedProvider, type ServerProcess } from '../support/server'
import { waitFor, waitUntil } from '../support/wait'
import { freezeNode } from './support/freeze'
import { exactlyOnceProblems, leftProcessing, runLoad, serverErrors, tally, type Attempt } from './support/load'
import { apiKeyOf, apiKeys } from './support/tenants'
import { startTwoWorkers } from './support/two-workers'

/** The fault's length, as the issue sets it. */
const DOWN_MS = 5_000

let cluster: CitusCluster
let db: CitusDatabase
let sql: postgres.Sql
/** Charges pass at once (after the simulator's 20 ms) unless a test holds them. */
let provider: GatedProvider
let server: ServerProcess
/** A second process on the same database: a retry landing on the process running its key is answered from memory (http/running-keys.ts), one landing here claims. */
let other: ServerProcess
/** Two tenants on the worker that is stopped, two on the one that stays. */
let downTenants: string[]
let upTenants: string[]

/** The scenarios of this file share tenants: each counts the payments under its own key prefixes only. */
const otherScenario = (...mine: string[]) => (key: string) => !mine.some((prefix) => key.startsWith(prefix))

/** What the stop scenario saw, for the assertions of the two tests below. */
let seen: { attempts: Attempt[]; stoppedAt: number; restartedAt: number } | undefined

beforeAll(async () => {
  ;({ cluster, db, sql, downTenants, upTenants } = await startTwoWorkers('worker_stop', 2))
  provider = await startGatedProvider({ delayMs: 20 })
  const env = { API_KEYS: apiKeys([...downTenants, ...upTenants]) }
  ;[server, other] = await Promise.all([startServer(db.url, env, { provider }), startServer(db.url, env, { provider })])
}, 120_000)

afterAll(async () => {
  await Promise.all([server?.stop(), other?.stop()])
  await provider?.stop()
  await sql?.end({ timeout: 1 })
  await cluster?.stop()
})

test('a worker stopped for 5 s under load: after it returns, one payment and one charge per key, nothing stuck', async () => {
  expect(await isCitus(sql)).toBe(true)
  const attempts: Attempt[] = []
  const tenants = [...downTenants, ...upTenants]
  const load = runLoad({ url: () => server.url, attempts, pauseMs: 200 }, tenants, 2, 'stop')
  const paidAll = () => tenants.map((t) => load.paid(t))
  const paidOf = (list: string[]) => list.reduce((sum, t) => sum + load.paid(t), 0)
  await waitFor(() => tenants.every((t) => load.paid(t) >= 5), () => `every tenant paid 5 keys before the fault (${paidAll()})`, 30_000)

  const stopping = performance.now()
  await cluster.workers[0]!.stop()
  const stoppedAt = performance.now()
  const upBefore = paidOf(upTenants)
  // The fault lasts DOWN_MS from the stop, and as long as the healthy worker's tenants need to have paid
  // 20 keys while it is down (on a busy machine the load may crawl: the fault must meet the load).
  await waitFor(() => performance.now() - stoppedAt >= DOWN_MS && paidOf(upTenants) - upBefore >= 20,
    () => `${DOWN_MS} ms down and 20 keys paid by ${upTenants} meanwhile (${paidOf(upTenants) - upBefore} so far)`, 45_000)
  const upDuring = paidOf(upTenants) - upBefore
  // Readiness names the worker the coordinator cannot reach, and stays 200: this process still serves the other tenants.
  const readyz = await fetch(`${server.url}/readyz`)
  const ready = `${readyz.status} ${(await readyz.text()).slice(0, 300)}`
  await cluster.workers[0]!.start()
  const restartedAt = performance.now()
  const downAtRestart = paidOf(downTenants)
  // The stopped worker's tenants pay again once it is back.
  await waitFor(() => paidOf(downTenants) - downAtRestart >= 10, () => `${downTenants} to pay 10 more keys after the restart (${paidOf(downTenants) - downAtRestart})`, 45_000)
  await load.stop()
  seen = { attempts, stoppedAt: stopping, restartedAt }

  const during = attempts.filter((a) => a.ended >= stopping && a.started <= restartedAt)
  console.log(`citus worker stop: down ${Math.round(restartedAt - stoppedAt)} ms; ${upTenants} paid ${upDuring} keys meanwhile; answers during: `
    + `down worker ${JSON.stringify(tally(during.filter((a) => downTenants.includes(a.tenant))))}, `
    + `up worker ${JSON.stringify(tally(during.filter((a) => upTenants.includes(a.tenant))))}; all answers ${JSON.stringify(tally(attempts))}; `
    + `longest attempt of the down worker's tenants during: ${Math.round(Math.max(...during.filter((a) => downTenants.includes(a.tenant)).map((a) => a.ended - a.started)))} ms; `
    + `/readyz while down: ${ready}; `
    + `5xx of the up worker's tenants during: ${JSON.stringify(serverErrors(during.filter((a) => upTenants.includes(a.tenant))).slice(0, 5))}`)

  expect(upDuring).toBeGreaterThanOrEqual(20)
  expect(ready).toStartWith('200 ')
  expect(ready).toContain(`127.0.0.1:${cluster.workers[0]!.port}`)
  expect(await exactlyOnceProblems(sql, provider.url, load.keys, attempts, otherScenario('stop-'))).toEqual([])
  expect(await leftProcessing(sql)).toEqual({ keys: 0, listed: 0 })
  // A 5xx only for the stopped worker's tenants, and only for an attempt that met the fault.
  expect(serverErrors(attempts.filter((a) => a.ended < stopping))).toEqual([])
  expect(serverErrors(attempts.filter((a) => upTenants.includes(a.tenant) && (a.ended < stopping || a.started > restartedAt)))).toEqual([])
}, 100_000)

test('while a worker is down, the tenants on the other worker get no 5xx', () => {
  if (!seen) throw new Error('the scenario above did not run to its end')
  const { attempts, stoppedAt, restartedAt } = seen
  const upDuring = attempts.filter((a) => upTenants.includes(a.tenant) && a.ended >= stoppedAt && a.started <= restartedAt)
  expect(upDuring.length).toBeGreaterThan(0)
  expect(serverErrors(upDuring)).toEqual([])
})

/** What the live-requests scenario saw: each key's answers at the process running it and at the other one, and its row. */
let live: { tenant: string; key: string; first: number; retry: number; attempts: number }[] | undefined

/**
 * The heartbeat lives in a reference table, written on every node: while a
 * worker is down it fails, and after PROCESS_ALIVE_SECONDS a live process
 * looked gone (issue 47). A request in flight on the healthy worker's tenant
 * must not be taken over meanwhile: a retry of it at another process (one
 * at the process running it is answered from memory, http/running-keys.ts)
 * is a 409, its key claimed once, and its own completion is the payment.
 * Whatever the retry gets, exactly once holds: one payment, one charge.
 */
test(`a worker down longer than the heartbeat's ${PROCESS_ALIVE_SECONDS} s, requests in flight on the other worker: one payment and one charge each`, async () => {
  const keys = upTenants.map((tenant) => ({ tenant, key: `live-${tenant}-${crypto.randomUUID().slice(0, 8)}` }))
  const send = async ({ tenant, key }: { tenant: string; key: string }, url: string) => {
    const response = await postPayment(url, payment({ customer: `cus_${key}` }), { key, apiKey: apiKeyOf(tenant) })
    const text = await response.text()
    return { status: response.status, text, id: response.ok ? (JSON.parse(text) as { id: string }).id : undefined }
  }
  provider.hold(keys.length)
  const first = Promise.all(keys.map((k) => send(k, server.url)))
  first.catch(() => undefined) // awaited below
  await waitFor(() => provider.held() === keys.length, () => `${keys.length} charges held at the provider (${provider.held()})`, 15_000)

  await cluster.workers[0]!.stop()
  const stoppedAt = performance.now()
  let retries: Awaited<ReturnType<typeof send>>[]
  try {
    // The fault's length: longer than the liveness window, so a heartbeat that cannot be written has aged out.
    await waitFor(() => performance.now() - stoppedAt >= (PROCESS_ALIVE_SECONDS + 2) * 1000, `${PROCESS_ALIVE_SECONDS + 2} s with worker 1 down`, 30_000)
    const [beat] = await sql<{ age: number }[]>`select extract(epoch from now() - max(heartbeat_at))::float8 as age from idempotency_processes`
    retries = await Promise.all(keys.map((k) => send(k, other.url)))
    console.log(`citus worker stop, live requests: newest heartbeat ${beat!.age.toFixed(1)} s old; retries at the other process answered ${JSON.stringify(retries.map((r) => `${r.status} ${r.text.slice(0, 120)}`))}`)
  } finally {
    provider.release()
    await cluster.workers[0]!.start()
  }
  const answers = await first
  live = []
  for (const [i, { tenant, key }] of keys.entries()) {
    const [row] = await sql<{ attempts: number; status: string }[]>`select attempts, status from idempotency_key_states where tenant = ${tenant} and key = ${key}`
    const paid = await sql<{ id: string; provider_ref: string }[]>`select id::text, provider_ref from payments where tenant = ${tenant} and idempotency_key = ${key}`
    live.push({ tenant, key, first: answers[i]!.status, retry: retries[i]!.status, attempts: row!.attempts })
    expect(row!.status).toBe('done')
    expect(paid).toHaveLength(1)
    // Every answer a 201 of that payment or a 409 (in progress, or a run that lost its claim), never a 5xx.
    for (const answer of [answers[i]!, retries[i]!]) {
      expect([201, 409]).toContain(answer.status)
      if (answer.status === 201) expect(answer.id).toBe(paid[0]!.id)
    }
    expect((await provider.charges(`cus_${key}`)).map((c) => c.id)).toEqual([paid[0]!.provider_ref])
  }
}, 60_000)

// Red before the heartbeat wrote each node's copy on its own (core/processes.ts beatOnEveryNode): the retry at the
// other process took the key over (201, attempts 2) once the heartbeat had failed for PROCESS_ALIVE_SECONDS.
test('... and those requests are not taken over: the retry is a 409, each key claimed once', () => {
  if (!live) throw new Error('the scenario above did not run to its end')
  expect(live.map((k) => ({ retry: k.retry, attempts: k.attempts }))).toEqual(live.map(() => ({ retry: 409, attempts: 1 })))
})

/** What the frozen-worker scenario saw of the other worker's tenants while it was frozen. */
let frozen: { upDuring: number; upErrors: string[] } | undefined

/**
 * A worker that stalls rather than stops (its processes SIGSTOPped: connections
 * accepted, never answered) holds every call sent to it until a timeout. The
 * lane sends each worker's calls through a pool of their own
 * (core/worker-pools.ts), so the other worker's tenants never wait behind
 * them: more clients on the frozen worker's tenants than a pool has
 * connections. Whatever they saw, afterwards: one payment and one charge per
 * key, nothing stuck.
 */
test('a worker frozen for 5 s under load: afterwards one payment and one charge per key, nothing stuck', async () => {
  const attempts: Attempt[] = []
  const tenants = [...downTenants, ...upTenants]
  // 6 clients on each of the frozen worker's two tenants: 12 requests in flight there, its pool has 8 connections.
  const crowd = runLoad({ url: () => server.url, attempts, pauseMs: 200 }, downTenants, 6, 'frozen')
  const others = runLoad({ url: () => server.url, attempts, pauseMs: 200 }, upTenants, 2, 'thawed')
  const paidOf = (list: string[]) => list.reduce((sum, t) => sum + crowd.paid(t) + others.paid(t), 0)
  await waitFor(() => tenants.every((t) => crowd.paid(t) + others.paid(t) >= 5), 'every tenant paid 5 keys before the freeze', 30_000)

  const frozenAt = performance.now()
  const thaw = freezeNode(cluster.home, 'worker1')
  let sessions = ''
  try {
    const upBefore = paidOf(upTenants)
    // The fault's length: DOWN_MS, and as long as the other worker's tenants need to pay 20 keys meanwhile, up to 15 s
    // (past that, what they saw is the finding: the test below).
    const served = await waitUntil(() => performance.now() - frozenAt >= DOWN_MS && paidOf(upTenants) - upBefore >= 20, 15_000)
    if (!served) sessions = await sessionsOf(sql)
    frozen = { upDuring: paidOf(upTenants) - upBefore, upErrors: [] }
  } finally {
    thaw()
  }
  const thawedAt = performance.now()
  const downAtThaw = paidOf(downTenants)
  await waitFor(() => paidOf(downTenants) - downAtThaw >= 10, () => `${downTenants} to pay 10 more keys after the thaw`, 45_000)
  await Promise.all([crowd.stop(), others.stop()])

  const during = attempts.filter((a) => a.ended >= frozenAt && a.started <= thawedAt)
  frozen.upErrors = serverErrors(attempts.filter((a) => upTenants.includes(a.tenant)), true)
  console.log(`citus worker frozen: ${Math.round(thawedAt - frozenAt)} ms; ${upTenants} paid ${frozen.upDuring} keys meanwhile; answers during: `
    + `frozen worker ${JSON.stringify(tally(during.filter((a) => downTenants.includes(a.tenant))))}, `
    + `other worker ${JSON.stringify(tally(during.filter((a) => upTenants.includes(a.tenant))))}; `
    + `5xx of the other worker's tenants: ${JSON.stringify(frozen.upErrors.slice(0, 3))}${sessions ? `\nthe service's sessions on the coordinator while they were not served:\n${sessions}` : ''}`)

  const failedKeys = attempts.filter((a) => upTenants.includes(a.tenant) && a.status !== 'network-error' && a.status >= 500).map((a) => a.key)
  if (failedKeys.length) console.log(`the service's log about the other worker's 5xx:\n${server.output().split('\n')
    .filter((line) => failedKeys.some((key) => line.includes(key)) && /"level":"(warn|error)"/.test(line)).slice(0, 4).map((line) => line.slice(0, 700)).join('\n')}`)

  const keys = new Map([...crowd.keys, ...others.keys])
  expect(await exactlyOnceProblems(sql, provider.url, keys, attempts, otherScenario('frozen-', 'thawed-'))).toEqual([])
  expect(await leftProcessing(sql)).toEqual({ keys: 0, listed: 0 })
}, 90_000)

// Red (F2, /tmp/coord/h3-findings.md) while the lane's calls of every worker shared the short pool: postgres.js
// queued the other worker's calls behind calls hanging on the frozen one, for up to their statement timeout.
test('... and meanwhile the other worker\'s tenants keep paying, with no 5xx', () => {
  if (!frozen) throw new Error('the scenario above did not run to its end')
  expect(frozen.upDuring).toBeGreaterThanOrEqual(20)
  expect(frozen.upErrors).toEqual([])
})

/** The service's sessions on the coordinator, grouped: what they run and wait for (the finding's evidence). */
async function sessionsOf(sql: postgres.Sql): Promise<string> {
  const rows = await sql<{ application_name: string; state: string; wait: string; query: string; n: number }[]>`
    select application_name, state, coalesce(wait_event_type || ':' || wait_event, '') as wait,
           left(regexp_replace(query, '\s+', ' ', 'g'), 90) as query, count(*)::int as n
      from pg_stat_activity where datname = current_database() and application_name like 'idempotent-post:%'
     group by 1, 2, 3, 4 order by n desc`
  return rows.map((r) => `${r.n} × ${r.application_name} ${r.state} ${r.wait} ${r.query}`).join('\n')
}
