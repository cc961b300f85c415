/**
 * Statements that commit while their answer is lost: the claim (issue 16,
 * item 4) and the completing COMMIT (item 5).
 *
 * A claim that commits while its answer is lost: the
 * claim's INSERT runs and commits in the database (autocommit), then the
 * connection is reset before the answer reaches the service, which sees
 * ECONNRESET and cannot know the claim is its own. The key is then in
 * `processing`, owned by a process that lives, with nobody working on it.
 *
 * The proxy (tcp-proxy.ts, `action: 'hold-reply'`) forwards the claim, holds
 * the server's answer, and the test checks the claim's row is committed
 * before it resets the connection: the fault lands exactly between the
 * commit and the answer. Expected, with the 30 s TTL:
 * - the service sends the claim again on a fresh connection with the same
 *   lease (core/recovery.ts), finds the key in processing under it, and
 *   goes on: the client gets its 201, and the retry is counted;
 * - when the database stays out of reach until the claim's deadline (the
 *   proxy frozen), the client gets a 503 problem+json (with Retry-After);
 *   a retry within RETRY_MS gets a 2xx, not 409 for the whole TTL; an
 *   operator's force-expire (admin JSON API) is not refused with "a live
 *   worker holds this key" (nobody works on it), at the latest once the
 *   process's heartbeat (every 2 s) has said so, well within RETRY_MS;
 * - one payment and one charge at the provider's ledger.
 *
 * A COMMIT that commits while its answer is lost: the key is done under the
 * request's lease, which the service reads before it would send the
 * completion again: the client gets the stored answer (before recovery: a
 * 503), and a retry replays the same payment.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { PROBLEM_JSON, send } from '../../support/answers'
import { createTestDatabase, type TestDatabase } from '../../support/db'
import { payment } from '../../support/http'
import { spawnProvider, type ProviderProcess } from '../../support/provider-process'
import { ADMIN_TOKEN } from '../../support/server'
import { startService, type ServiceProcess } from '../../support/service-process'
import { startTcpProxy, type TcpProxy } from '../../support/tcp-proxy'
import { waitFor } from '../../support/wait'
import { payUntilAnswered } from '../clients'

const TTL_SECONDS = 30
/** A retry gets its 2xx by then: seconds, where waiting out the TTL would take 30. */
const RETRY_MS = 5_000

let db: TestDatabase
let provider: ProviderProcess
let proxy: TcpProxy
let service: ServiceProcess

beforeAll(async () => {
  db = await createTestDatabase('edges_lost_claim')
  provider = await spawnProvider()
  proxy = await startTcpProxy(db.url)
  service = await startService(proxy.url, provider.url, { IDEMPOTENCY_TTL_SECONDS: String(TTL_SECONDS) })
})
afterAll(async () => {
  await service?.stop('SIGKILL')
  proxy?.stop()
  await provider?.stop()
  await db?.drop()
})

const isShortPool = (startup: Readonly<Record<string, string>>) => /^idempotent-post:\d+:short$/.test(startup.application_name ?? '')
/** Where completions go: the declarative one beside the claims (short, src/core/lane.ts), the transactional one in the work pool. */
const isCompletionPool = (startup: Readonly<Record<string, string>>) => /^idempotent-post:\d+:(short|work)$/.test(startup.application_name ?? '')

/**
 * Sends a payment whose claim commits and whose claim answer is lost; returns the client's answer and the lease
 * the claim took. `unreachable`: the proxy freezes every connection, new ones too, until the answer came (so
 * the claim cannot be sent again in time).
 */
async function loseClaimAnswer(key: string, customer: string, options: { unreachable?: boolean } = {}) {
  const trap = proxy.trap({ connection: isShortPool, before: /insert into idempotency_keys/i, action: 'hold-reply' })
  const answer = send(service.url, key, payment({ customer }))
  const hit = await trap
  await hit.reply!.complete
  // Landed between the commit and the answer: the row is there, committed, in processing.
  const [row] = await db.sql<{ status: string; lease: string }[]>`select status, lease from idempotency_key_states where tenant = 'acme' and key = ${key}`
  expect(row?.status).toBe('processing')
  if (options.unreachable) proxy.freeze()
  hit.connection.reset()
  const first = await answer
  if (options.unreachable) proxy.thaw()
  return { first, lease: row!.lease }
}

async function claimRetries(): Promise<number> {
  const text = await (await fetch(`${service.url}/metrics`)).text()
  return text.split('\n').filter((line) => line.startsWith('idempotency_statement_retries_total{') && line.includes('statement="claim"'))
    .reduce((sum, line) => sum + Number(line.slice(line.lastIndexOf(' ') + 1)), 0)
}

async function expectOnce(key: string, customer: string) {
  const payments = await db.sql<{ provider_ref: string }[]>`select provider_ref from payments where tenant = 'acme' and idempotency_key = ${key}`
  const charges = await provider.charges(customer)
  expect({ payments: payments.length, charges: charges.length }).toEqual({ payments: 1, charges: 1 })
  expect(payments[0]!.provider_ref).toBe(charges[0]!.id)
}

test('the claim committed, its answer lost: sent again with its lease, it is found to be ours, and the client gets its 201; one payment, one charge', async () => {
  const key = `lost-claim-recovered-${crypto.randomUUID()}`
  const customer = `cus_${key}`
  const before = await claimRetries()
  const { first } = await loseClaimAnswer(key, customer)
  expect({ status: first.status, replayed: first.replayed ?? false }).toEqual({ status: 201, replayed: false })
  expect(await claimRetries()).toBeGreaterThan(before)
  await expectOnce(key, customer)
}, 20_000)

test('the claim committed, its answer lost, the database out of reach until the claim\'s deadline: 503 problem, and a retry within seconds gets 201 (not 409 for the TTL); one payment, one charge', async () => {
  const key = `lost-claim-${crypto.randomUUID()}`
  const customer = `cus_${key}`
  const { first } = await loseClaimAnswer(key, customer, { unreachable: true })
  expect({ status: first.status, type: first.contentType?.startsWith(PROBLEM_JSON), retryAfter: Number(first.retryAfter) >= 1 })
    .toEqual({ status: 503, type: true, retryAfter: true })

  const since = Date.now()
  const attempts = await payUntilAnswered(key, payment({ customer }), { url: () => service.url, pauseMs: 200, deadlineMs: RETRY_MS }).catch((error: Error) => error)
  if (attempts instanceof Error) throw attempts
  expect(attempts.at(-1)!.status).toBe(201)
  await expectOnce(key, customer)
  console.log(`[edges] lost claim answer: the client got ${first.status} ${first.code}; a retry got 201 after ${Date.now() - since} ms (${attempts.map((a) => a.status).join(', ')})`)
}, 20_000)

test('the claim committed, its answer lost: an operator\'s force-expire is not refused as "a live worker holds this key"; then one payment, one charge', async () => {
  const key = `lost-claim-op-${crypto.randomUUID()}`
  const customer = `cus_${key}`
  const { first, lease } = await loseClaimAnswer(key, customer, { unreachable: true })
  expect(first.status).toBe(503)

  const [before] = await db.sql<{ status: string; lease: string }[]>`select status, lease from idempotency_key_states where tenant = 'acme' and key = ${key}`
  const expire = async () => {
    const response = await fetch(`${service.url}/admin/api/keys/expire`, {
      method: 'POST',
      headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' },
      body: JSON.stringify({ tenant: 'acme', key, lease: before!.lease }),
    })
    return { status: response.status, ...(await response.json() as { code?: string; outcome?: string }) }
  }
  // An operator acts within seconds, and may try again when told the worker is alive: liveness is
  // judged per request, so the refusal may last until the process's next heartbeat (2 s), never the TTL.
  const since = Date.now()
  const tries: { status: number; outcome?: string }[] = []
  await waitFor(async () => {
    tries.push(await expire())
    return tries.at(-1)!.outcome !== 'worker_alive'
  }, () => `the force-expire not to be refused as "a live worker holds this key" (${tries.length} tries, all worker_alive)`, RETRY_MS, 250)
  const result = tries.at(-1)!
  console.log(`[edges] lost claim answer: the key was ${before!.status} (lease ${before!.lease}, the claim's ${lease}); ` +
    `force-expire answered ${tries.map((t) => `${t.status} ${t.outcome}`).join(', ')} within ${Date.now() - since} ms`)
  // Either the operator cleared it (nobody works on it), or the service had already given it back:
  // in neither case is it left in processing under the lost claim's lease.
  expect(['expired', 'unchanged']).toContain(result.outcome!)
  const [after] = await db.sql<{ status: string; lease: string }[]>`select status, lease from idempotency_key_states where tenant = 'acme' and key = ${key}`
  expect(after!.status === 'processing' && after!.lease === before!.lease).toBe(false)

  const attempts = await payUntilAnswered(key, payment({ customer }), { url: () => service.url, pauseMs: 200, deadlineMs: RETRY_MS })
  expect(attempts.at(-1)!.status).toBe(201)
  await expectOnce(key, customer)
}, 20_000)

test('the COMMIT committed, its answer lost: the key is done, so the client is not sent away for the TTL, and an immediate retry replays', async () => {
  const key = `lost-commit-${crypto.randomUUID()}`
  const customer = `cus_${key}`
  // The COMMIT of the transactional form, or the completing statement of the declarative one (it commits as it ends).
  const trap = proxy.trap({ connection: isCompletionPool, before: /^\s*commit\s*$|done as \(\s*update idempotency_keys/i, action: 'hold-reply' })
  const answer = send(service.url, key, payment({ customer }))
  const hit = await trap
  await hit.reply!.complete
  // Landed between the commit and its answer: the key is done, its payment committed.
  const [row] = await db.sql<{ status: string }[]>`select status from idempotency_key_states where tenant = 'acme' and key = ${key}`
  expect(row?.status).toBe('done')
  hit.connection.reset()
  const first = await answer
  console.log(`[edges] lost COMMIT answer: ${first.status} ${first.code ?? ''}, Retry-After ${first.retryAfter}: ${first.detail ?? ''}`)
  // The service reads the key before sending the completion again: done under its lease, so the commit was its own.
  expect(first.status).toBe(201)
  const retry = await send(service.url, key, payment({ customer }))
  expect({ status: retry.status, replayed: retry.replayed, paymentId: retry.paymentId }).toEqual({ status: 201, replayed: true, paymentId: first.paymentId })
  await expectOnce(key, customer)
}, 20_000)
