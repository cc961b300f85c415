/**
 * A key stays bound to its first request for the whole retention, released
 * or not (issue 16, item 3; SPEC's table: "whether the first is finished,
 * still processing, or was released after a failure or a deadline"). After
 * its execution failed, ran into its deadline, or was force-expired, the same
 * key with another body (an edited description) is a 422, never a new
 * request with a new downstream key and a second charge; the original body
 * then finishes with the charge already made.
 *
 * Counted where it lands: the provider simulator's ledger (a process of its
 * own, whose faults are its own PAYMENT_PROVIDER_* settings; restarted on the
 * same port and ledger to change them) and the payments table. Each case
 * records every step (status, charges so far) and compares the whole
 * sequence, so a failure shows the story.
 *
 * (a) every provider answer lost (PAYMENT_PROVIDER_LOST_RESPONSE_RATE=1): 502;
 *     the provider recovers; the edited body: 422; the original: 201 with
 *     the one charge.
 * (b) a deadline: the provider takes longer than the request's deadline (TTL
 *     1 s, so 800 ms), the client gets 504, the provider charges after it.
 * (c) X, Y, X with every answer lost: never more than one charge.
 * (d) the worker is SIGSTOPped while its charge is made, an operator
 *     force-expires its key (past the TTL), and the edited body is a 422.
 */
import { afterAll, afterEach, beforeAll, expect, test } from 'bun:test'
import { send, type Answer } from '../../support/answers'
import { createTestDatabase, type TestDatabase } from '../../support/db'
import { payment, type PaymentBody } from '../../support/http'
import { spawnProvider, type ProcessFaults, type ProviderProcess } from '../../support/provider-process'
import { ADMIN_TOKEN, gateProvider } from '../../support/server'
import { startService, type ServiceProcess } from '../../support/service-process'
import { waitFor } from '../../support/wait'

let db: TestDatabase
let provider: ProviderProcess
const services: ServiceProcess[] = []

beforeAll(async () => {
  db = await createTestDatabase('edges_edited')
  provider = await spawnProvider()
})
afterEach(async () => {
  for (const service of services.splice(0)) {
    try { process.kill(service.pid, 'SIGCONT') } catch { /* gone */ }
    await service.stop('SIGKILL')
  }
})
afterAll(async () => {
  await provider?.stop()
  await db?.drop()
})

async function serve(providerUrl: string, ttlSeconds: number): Promise<ServiceProcess> {
  const service = await startService(db.url, providerUrl, { IDEMPOTENCY_TTL_SECONDS: String(ttlSeconds) })
  services.push(service)
  return service
}

/** One payment with its edited twin: same key, same amount and customer, another description. */
function bodies(label: string): { key: string; x: PaymentBody; y: PaymentBody } {
  const run = `${label}-${crypto.randomUUID().slice(0, 8)}`
  const x = payment({ customer: `cus_${run}`, description: 'order 1' })
  return { key: `edited-${run}`, x, y: { ...x, description: 'order 1 (edited)' } }
}

interface Step {
  readonly step: string
  readonly status: Answer['status']
  /** Charges the provider's ledger holds for the customer after the step. */
  readonly charges: number
}

/** Sends, then counts the customer's charges at the ledger. */
async function step(name: string, url: string, key: string, body: PaymentBody): Promise<Step & { answer: Answer }> {
  const answer = await send(url, key, body)
  return { step: name, status: answer.status, charges: (await provider.charges(body.customer)).length, answer }
}

const story = (steps: (Step & { answer?: Answer })[]) => steps.map(({ step, status, charges }) => ({ step, status, charges }))

async function restartProvider(faults: ProcessFaults): Promise<void> {
  await provider.restart(faults)
}

/** The original body finished with the charge already made: one payment, referring to the one charge, and the 201 carries it. */
async function expectFinishedOnce(key: string, body: PaymentBody, created: Answer): Promise<void> {
  const charges = await provider.charges(body.customer)
  const payments = await db.sql<{ id: string; provider_ref: string; description: string | null }[]>`
    select id::text, provider_ref, description from payments where tenant = 'acme' and idempotency_key = ${key}`
  expect({ charges: charges.length, payments: payments.length }).toEqual({ charges: 1, payments: 1 })
  expect(payments[0]).toEqual({ id: created.paymentId!, provider_ref: charges[0]!.id, description: body.description ?? null })
}

test('(a) every provider answer lost: 502; the same key with an edited description: 422; the original body: 201 with the charge already made', async () => {
  await restartProvider({ lostResponseRate: 1 })
  const service = await serve(provider.url, 30)
  const { key, x, y } = bodies('a')
  const steps: (Step & { answer: Answer })[] = []
  steps.push(await step('X, every answer lost', service.url, key, x))
  await restartProvider({})
  steps.push(await step('Y (edited), provider healthy', service.url, key, y))
  steps.push(await step('X again', service.url, key, x))
  console.log(`[edges] released then edited (a): ${JSON.stringify(story(steps))}`)
  expect(story(steps)).toEqual([
    { step: 'X, every answer lost', status: 502, charges: 1 },
    { step: 'Y (edited), provider healthy', status: 422, charges: 1 },
    { step: 'X again', status: 201, charges: 1 },
  ])
  await expectFinishedOnce(key, x, steps[2]!.answer)
}, 30_000)

test('(b) a deadline (504, the provider charges after it): the edited description: 422; the original body: 201 with that charge', async () => {
  // TTL 1 s: the request is stopped at 800 ms; the provider answers at 1.5 s and records the charge regardless.
  await restartProvider({ delayMs: 1_500 })
  const service = await serve(provider.url, 1)
  const { key, x, y } = bodies('b')
  const steps: (Step & { answer: Answer })[] = []
  const first = await send(service.url, key, x)
  await waitFor(async () => (await provider.charges(x.customer)).length === 1, 'the provider to record the charge it was still making')
  steps.push({ step: 'X, past its deadline', status: first.status, charges: 1, answer: first })
  await restartProvider({})
  steps.push(await step('Y (edited)', service.url, key, y))
  steps.push(await step('X again', service.url, key, x))
  console.log(`[edges] released then edited (b): ${JSON.stringify(story(steps))}`)
  expect(story(steps)).toEqual([
    { step: 'X, past its deadline', status: 504, charges: 1 },
    { step: 'Y (edited)', status: 422, charges: 1 },
    { step: 'X again', status: 201, charges: 1 },
  ])
  await expectFinishedOnce(key, x, steps[2]!.answer)
}, 30_000)

test('(c) X, then Y, then X, every answer lost: never more than one charge; X completes with it once the provider answers', async () => {
  await restartProvider({ lostResponseRate: 1 })
  const service = await serve(provider.url, 30)
  const { key, x, y } = bodies('c')
  const steps: (Step & { answer: Answer })[] = []
  steps.push(await step('X', service.url, key, x))
  steps.push(await step('Y (edited)', service.url, key, y))
  steps.push(await step('X again', service.url, key, x))
  await restartProvider({})
  steps.push(await step('X, provider healthy', service.url, key, x))
  console.log(`[edges] released then edited (c): ${JSON.stringify(story(steps))}`)
  expect(story(steps)).toEqual([
    { step: 'X', status: 502, charges: 1 },
    { step: 'Y (edited)', status: 422, charges: 1 },
    { step: 'X again', status: 502, charges: 1 },
    { step: 'X, provider healthy', status: 201, charges: 1 },
  ])
  await expectFinishedOnce(key, x, steps[3]!.answer)
}, 30_000)

test('(d) a SIGSTOPped worker\'s key force-expired by an operator: the edited description: 422; the original body: 201 with the charge the worker made', async () => {
  await restartProvider({})
  // A charges through a gate, so the test knows when its charge is on the way; B is the service that stays up.
  const gate = gateProvider(provider)
  try {
    const ttlSeconds = 2
    const a = await serve(gate.url, ttlSeconds)
    const b = await serve(provider.url, ttlSeconds)
    const { key, x, y } = bodies('d')
    gate.hold(1)
    const aAnswer = send(a.url, key, x)
    await waitFor(() => gate.held() === 1, 'A\'s charge to reach the provider')
    process.kill(a.pid, 'SIGSTOP') // alive, its key in processing, its heartbeat about to go quiet
    gate.release()
    await waitFor(async () => (await provider.charges(x.customer)).length === 1, 'the provider to record A\'s charge')
    const [row] = await db.sql<{ lease: string; status: string }[]>`select lease, status from idempotency_key_states where tenant = 'acme' and key = ${key}`
    expect(row?.status).toBe('processing')
    // Past the TTL a force-expire acts whatever the heartbeat says (A's deadline has passed, had it run).
    await waitFor(async () => (await db.sql`select 1 from idempotency_key_states where key = ${key} and locked_at < now() - make_interval(secs => ${ttlSeconds})`).length === 1,
      'the key to be past its TTL', 10_000)
    const expire = await fetch(`${b.url}/admin/api/keys/expire`, {
      method: 'POST',
      headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' },
      body: JSON.stringify({ tenant: 'acme', key, lease: row!.lease }),
    })
    expect({ status: expire.status, outcome: ((await expire.json()) as { outcome?: string }).outcome }).toEqual({ status: 200, outcome: 'expired' })

    const steps: (Step & { answer?: Answer })[] = [{ step: 'X on A, stopped, force-expired', status: 'closed', charges: 1 }]
    steps.push(await step('Y (edited) on B', b.url, key, y))
    steps.push(await step('X on B', b.url, key, x))
    process.kill(a.pid, 'SIGCONT')
    const late = await aAnswer
    steps.push({ step: 'A resumes', status: late.status, charges: (await provider.charges(x.customer)).length })
    console.log(`[edges] released then edited (d): ${JSON.stringify(story(steps))}; A answered ${late.status} ${late.code ?? ''}`)
    expect(story(steps).slice(1, 3)).toEqual([
      { step: 'Y (edited) on B', status: 422, charges: 1 },
      { step: 'X on B', status: 201, charges: 1 },
    ])
    // A was fenced: it lost its claim (409) or its deadline (5xx); its payment never committed.
    expect([409, 503, 504]).toContain(late.status as number)
    expect(steps[3]!.charges).toBe(1)
    await expectFinishedOnce(key, x, steps[2]!.answer!)
  } finally {
    gate.release()
    await gate.stop()
  }
}, 30_000)
