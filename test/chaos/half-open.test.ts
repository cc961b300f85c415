/**
 * Bounded processing (docs/explanation/invariants.md) against half-open database connections (issue 8, "Why" 2).
 *
 * Service A reaches PostgreSQL through a TCP proxy (test/support/tcp-proxy.ts)
 * that freezes connections: no bytes either way, no FIN, no RST, and its
 * kernel still answers keepalives, so neither A nor the database learns
 * anything (a partition or a hung host). Service B reaches the same database
 * directly and charges through the same provider simulator. The test then
 * proves, at the database and at the provider's ledger:
 * - every request A had in flight is answered (503/504 problem+json, or 201),
 *   none hangs;
 * - every key A had in flight is completed by a retry through B within
 *   TTL + grace, with exactly one payment and exactly one charge per key;
 * - A holds no transaction open and no row lock meanwhile: its completion is
 *   one statement, so a partition can freeze it only before it runs or after
 *   it committed, never half-way.
 *
 * Bounds are liveness bounds with generous grace; the figures are printed.
 */
import { afterAll, afterEach, beforeAll, expect, test } from 'bun:test'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { payment, postPayment } from '../support/http'
import { startServer, type ServerProcess } from '../support/server'
import { startTcpProxy, type TcpProxy, type TrapHit } from '../support/tcp-proxy'
import { waitFor } from '../support/wait'
import { payUntilAnswered, type Attempt } from './clients'

const TTL_SECONDS = 2
const PROVIDER_DELAY_MS = 1_000
/** Generous: two shared cores, spawned services, a provider with a 1 s delay on every call, B's retry pauses. */
const GRACE_MS = 10_000
const TTL_MS = TTL_SECONDS * 1_000
/**
 * A's in-flight requests must be answered by then, each counted from its own
 * send. A frozen completion is given up on the client side after
 * COMPLETION_TIMEOUT_MS (7 s), and the release that follows waits up to 2 s on
 * a frozen pool: about 10 s after the send, hence the larger grace.
 */
const ANSWER_BOUND_MS = TTL_MS + 15_000
/** B completes a key whose frozen worker holds no lock on it by then. */
const RECLAIM_BOUND_MS = TTL_MS + GRACE_MS
const PROBLEM_JSON = 'application/problem+json'

let db: TestDatabase
let proxy: TcpProxy | undefined
let a: ServerProcess | undefined
let b: ServerProcess | undefined

beforeAll(async () => {
  db = await createTestDatabase('half_open')
})
afterEach(async () => {
  proxy?.thaw()
  await b?.stop('SIGKILL')
  await a?.stop('SIGKILL') // stops the provider too (B only borrowed it)
  proxy?.stop()
  a = b = proxy = undefined
})
afterAll(async () => {
  await db?.drop()
})

/** A through the proxy, B direct, one provider (1 s per charge), TTL 2 s. */
async function startServices(): Promise<{ a: ServerProcess; b: ServerProcess; proxy: TcpProxy }> {
  proxy = await startTcpProxy(db.url)
  a = await startServer(proxy.url, { IDEMPOTENCY_TTL_SECONDS: String(TTL_SECONDS), PAYMENT_PROVIDER_DELAY_MS: String(PROVIDER_DELAY_MS) })
  b = await startServer(db.url, { IDEMPOTENCY_TTL_SECONDS: String(TTL_SECONDS) }, { provider: a.provider })
  return { a, b, proxy }
}

/** The pool of single statements, where completions go beside claims (src/core/lane.ts). */
const isShort = (startup: Readonly<Record<string, string>>) => /:short$/.test(startup.application_name ?? '')

interface Answer {
  readonly key: string
  readonly status: number | 'hung'
  readonly contentType: string | null
  readonly retryAfter: string | null
  readonly paymentId?: string
  readonly ms: number
}

/** One POST to A, bounded by the liveness bound: a hang shows as 'hung'. */
async function postToA(url: string, key: string, customer: string): Promise<Answer> {
  const started = performance.now()
  try {
    const response = await postPayment(url, payment({ customer }), { key, signal: AbortSignal.timeout(ANSWER_BOUND_MS) })
    const text = await response.text()
    return {
      key,
      status: response.status,
      contentType: response.headers.get('content-type'),
      retryAfter: response.headers.get('retry-after'),
      ...(response.status === 201 ? { paymentId: (JSON.parse(text) as { id: string }).id } : {}),
      ms: performance.now() - started,
    }
  } catch {
    return { key, status: 'hung', contentType: null, retryAfter: null, ms: performance.now() - started }
  }
}

/** A's answer must be a 201 or a 503/504 problem+json with Retry-After, never a hang. */
function expectAnsweredProperly(answer: Answer): void {
  expect({ key: answer.key, status: answer.status }).not.toEqual({ key: answer.key, status: 'hung' })
  expect([201, 503, 504]).toContain(answer.status as number)
  if (answer.status !== 201) {
    expect(answer.contentType).toStartWith(PROBLEM_JSON)
    expect(Number(answer.retryAfter)).toBeGreaterThanOrEqual(1)
  }
}

/** Backends of the given application_name in the state, from the database itself (not through the proxy). */
async function backends(applicationName: string, state = 'idle in transaction'): Promise<number[]> {
  const rows = await db.sql<{ pid: number }[]>`
    select pid from pg_stat_activity where datname = current_database() and application_name = ${applicationName} and state = ${state}`
  return rows.map((row) => row.pid)
}

/** Exactly one payment per key, exactly one charge per key's customer at the provider, and they match; every 2xx carried that payment. */
async function expectExactlyOnce(provider: ServerProcess['provider'], keys: Map<string, string>, twoHundreds: Map<string, (string | undefined)[]>): Promise<void> {
  const problems: string[] = []
  for (const [key, customer] of keys) {
    const rows = await db.sql<{ id: string; provider_ref: string }[]>`
      select id::text, provider_ref from payments where tenant = 'acme' and idempotency_key = ${key}`
    const charges = await provider.charges(customer)
    if (rows.length !== 1) problems.push(`${key}: ${rows.length} payments`)
    if (charges.length !== 1) problems.push(`${key}: ${charges.length} charges at the provider`)
    if (rows.length === 1 && charges.length === 1 && rows[0]!.provider_ref !== charges[0]!.id)
      problems.push(`${key}: the payment refers to ${rows[0]!.provider_ref}, the provider charged ${charges[0]!.id}`)
    for (const id of twoHundreds.get(key) ?? [])
      if (id !== undefined && id !== rows[0]?.id) problems.push(`${key}: a 2xx carried ${id}, stored ${rows[0]?.id}`)
    const [row] = await db.sql<{ status: string }[]>`select status from idempotency_key_states where tenant = 'acme' and key = ${key}`
    if (row?.status !== 'done') problems.push(`${key}: key is ${row?.status}, not done`)
  }
  expect(problems).toEqual([])
}

/** B retries the key until a 2xx, within `boundMs`; returns its attempts and the time from `since` to the success. */
async function retryThroughB(url: string, key: string, customer: string, since: number, boundMs: number): Promise<{ attempts: Attempt[]; ms: number }> {
  const attempts = await payUntilAnswered(key, payment({ customer }), { url: () => url, pauseMs: 200, deadlineMs: boundMs, attemptTimeoutMs: boundMs })
  return { attempts, ms: Date.now() - since }
}

const summary = (values: number[]) => `min ${Math.round(Math.min(...values))} ms, max ${Math.round(Math.max(...values))} ms`

test('a partition of A while some keys are completing and others are at the provider: every request answered, every key completed once by B', async () => {
  const { a, b, proxy } = await startServices()
  const run = crypto.randomUUID().slice(0, 8)
  const completing = Array.from({ length: 4 }, (_, i) => `ho-c${i}-${run}`)
  const external = Array.from({ length: 4 }, (_, i) => `ho-x${i}-${run}`)
  const customers = new Map([...completing, ...external].map((key) => [key, `cus_${key}`]))

  // Wave 1 completes: its completing statement (the fence, the answer and the
  // payment in one) is cut on its connection on its way to the database. The
  // statement form holds no transaction open and no lock across round trips,
  // so nothing of A's is left for the database to end.
  // Completions share statements (batched), so the first is trapped and the
  // rest go on or queue behind it: all four are past the provider below.
  const trap = proxy.trap({ connection: isShort, before: /done as \(\s*update idempotency_keys/ })
  const answers: Promise<Answer>[] = completing.map((key) => postToA(a.url, key, customers.get(key)!))
  const hit: TrapHit = await trap
  const appName = hit.startup.application_name!
  await waitFor(async () => (await Promise.all(completing.map(async (key) => (await a.provider.charges(customers.get(key)!)).length))).every((n) => n === 1),
    'every wave-1 request to have charged and gone on to its completion')
  expect(await backends(appName)).toEqual([]) // no transaction of A's is open

  // Wave 2 is in its external phase (at the provider, no connection held) when everything freezes.
  answers.push(...external.map((key) => postToA(a.url, key, customers.get(key)!)))
  await waitFor(() => a.provider.pending() === external.length, `the ${external.length} charges of wave 2 at the provider`)
  proxy.freeze() // A's every connection, and any new one: a partition between A and its database
  const frozenAt = Date.now()
  const frozen = proxy.counts.frozen

  // B retries every key A had in flight, from the moment of the partition.
  const retries = [...customers].map(([key, customer]) => retryThroughB(b.url, key, customer, frozenAt, RECLAIM_BOUND_MS))

  const answered = await Promise.all(answers)
  for (const answer of answered) expectAnsweredProperly(answer)
  for (const answer of answered) expect(answer.ms).toBeLessThan(ANSWER_BOUND_MS)

  const completed = await Promise.all(retries)
  for (const { ms } of completed) expect(ms).toBeLessThan(RECLAIM_BOUND_MS)

  expect(await backends(appName)).toEqual([]) // and none was opened meanwhile
  expect(proxy.counts.frozen).toBeGreaterThanOrEqual(frozen) // still partitioned throughout

  const twoHundreds = new Map<string, (string | undefined)[]>()
  for (const [i, key] of [...customers.keys()].entries())
    twoHundreds.set(key, [...completed[i]!.attempts.map((x) => x.paymentId), ...answered.filter((x) => x.key === key).map((x) => x.paymentId)])
  await expectExactlyOnce(a.provider, customers, twoHundreds)

  // The partition heals: A serves again by itself.
  proxy.thaw()
  const healedAt = Date.now()
  const after = await payUntilAnswered(`ho-after-${run}`, payment({ customer: `cus_ho-after-${run}` }), { url: () => a.url, pauseMs: 200, deadlineMs: GRACE_MS })
  expect(after.at(-1)!.status).toBe(201)

  const statuses = answered.reduce<Record<string, number>>((acc, x) => ({ ...acc, [String(x.status)]: (acc[String(x.status)] ?? 0) + 1 }), {})
  console.log(`[half-open] partition: ${frozen} connections frozen; A's 8 in-flight requests answered ${JSON.stringify(statuses)}, ` +
    `${summary(answered.map((x) => x.ms))} after their send (bound ${ANSWER_BOUND_MS} ms); ` +
    `B completed all 8 keys ${summary(completed.map((x) => x.ms))} after the freeze (bound ${RECLAIM_BOUND_MS} ms), ` +
    `${completed.reduce((n, x) => n + x.attempts.length, 0)} attempts; A answered 201 again ${Date.now() - healedAt} ms after the thaw`)
}, 90_000)
