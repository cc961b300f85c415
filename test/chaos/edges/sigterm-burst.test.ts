/**
 * SIGTERM a few milliseconds after a burst (issue 16, item 2): 30 clients
 * send at once, and the signal follows 0 to 10 ms later, while the requests
 * are being accepted, read and claimed; the provider takes PROVIDER_DELAY_MS,
 * so the claimed ones are at the provider when the drain runs. Sent to the
 * service's process group (a terminal's Ctrl-C, a process manager) and, in
 * another case, to the service process alone (a container runtime), which is
 * `bun src/main.ts` as `npm start` runs it.
 *
 * Then, at the database and the provider's ledger (a simulator process of its
 * own, outside the service's group, as a real provider is):
 * - every request got a 2xx, a 5xx problem+json, or a closed connection
 *   (refused by the closed listener): never a 4xx, never a hang;
 * - the exit code is 0;
 * - no key is left in `processing`: what was accepted was finished or
 *   released before the exit;
 * - after a restart, every retry of every key gets a 2xx within RETRY_MS,
 *   far below the TTL (30 s), with one payment and one charge per key.
 *
 * When the signal lands, two ways:
 * - `claims held`: deterministic. The burst's claims are held in the
 *   database (statement-holds.ts) until the test has seen the service take
 *   the signal, then let go: every request was accepted, read and validated,
 *   none had claimed, at the signal: the window the drain must count.
 * - `timed`: the signal follows the burst by a few milliseconds, as in the
 *   issue's reproduction. The delay is the fault's parameter, not a
 *   synchronisation: the checks hold at any delay, and the case prints what
 *   the burst saw (on a busy machine it may land before or after the window).
 */
import { afterAll, afterEach, beforeAll, expect, test } from 'bun:test'
import { badAnswers, send, tallyAnswers } from '../../support/answers'
import { createTestDatabase, type TestDatabase } from '../../support/db'
import { payment, type PaymentBody } from '../../support/http'
import { spawnProvider, type ProviderProcess } from '../../support/provider-process'
import { startService, type ServiceProcess } from '../../support/service-process'
import { hold, installHolds } from '../../support/statement-holds'
import { keysIn, waitFor, within } from '../../support/wait'
import { chargedOnce, exactlyOnce, payUntilAnswered, paymentsByKey, type Attempt } from '../clients'

const BURST = 30
const TTL_SECONDS = 30
/** Longer than the 1 s today's drain gives the listener: the requests are still at the provider when the pools close. Well within a drain's 10 s. */
const PROVIDER_DELAY_MS = 1_500
/** After the restart every key reaches a 2xx by then: seconds, not the TTL. */
const RETRY_MS = 5_000
/** A drain finishes its in-flight requests (PROVIDER_DELAY_MS each) well within this; past it the shutdown hangs. */
const EXIT_TIMEOUT_MS = 15_000

let db: TestDatabase
let provider: ProviderProcess
const services: ServiceProcess[] = []
/** A hold still taken when a case fails: released after it, or it would hold every claim of the next case. */
let heldClaims: Awaited<ReturnType<typeof hold>> | undefined

beforeAll(async () => {
  db = await createTestDatabase('edges_sigterm')
  await installHolds(db.sql)
  provider = await spawnProvider({ delayMs: PROVIDER_DELAY_MS })
})
afterEach(async () => {
  await heldClaims?.release()
  heldClaims = undefined
  for (const service of services.splice(0)) await service.stop('SIGKILL', { group: true })
})
afterAll(async () => {
  await provider?.stop()
  await db?.drop()
})

type When = { readonly kind: 'claims held' } | { readonly kind: 'timed'; readonly delayMs: number }
/**
 * Two cases keep the folder fast: the main process alone (a container
 * runtime, the common production stop) gets the deterministic window, the
 * group the timed one. On the code before the fix (drain counted from the
 * claim) the first failed 3 runs of 3, the timed one 1 of 3: the other two
 * times the signal came before the listener had accepted anything.
 */
const CASES: { target: string; group: boolean; when: When }[] = [
  { target: 'the main process alone', group: false, when: { kind: 'claims held' } },
  { target: 'the process group', group: true, when: { kind: 'timed', delayMs: 3 } },
]

/** Whether the service has taken the signal: it said so, or its listener is closed. */
async function tookSignal(service: ServiceProcess): Promise<boolean> {
  if (/SIGTERM/.test(service.output()) || !service.alive()) return true
  return fetch(`${service.url}/healthz`).then(() => false, () => true)
}

for (const { target, group, when } of CASES) {
  const whenText = when.kind === 'timed' ? `${when.delayMs} ms after a burst of ${BURST}` : `with a burst of ${BURST} accepted and waiting for their claims`
  test(`SIGTERM to ${target} ${whenText}: every request answered or refused, exit 0, no key in processing, every retry 2xx after a restart`, async () => {
    const env = { IDEMPOTENCY_TTL_SECONDS: String(TTL_SECONDS) }
    const service = await startService(db.url, provider.url, env, { detached: true })
    services.push(service)
    const run = crypto.randomUUID().slice(0, 8)
    const bodies = new Map<string, PaymentBody>(Array.from({ length: BURST }, (_, i) => [`term-${run}-${i}`, payment({ customer: `cus_term_${run}_${i}` })]))
    const keys = [...bodies.keys()]

    const claims = heldClaims = when.kind === 'claims held' ? await hold(db.sql, 'claim') : undefined
    const burstAt = performance.now()
    const sends = keys.map((key) => send(service.url, key, bodies.get(key)!, EXIT_TIMEOUT_MS))
    if (when.kind === 'timed') {
      await Bun.sleep(when.delayMs) // the fault's timing: the signal lands while the burst is being accepted and claimed
    } else {
      // Every request is in (or queued for) its claim, none past it: the claim statements in flight wait in the
      // hold (claims are batched: two statements carry the whole burst, core/batcher.ts).
      await waitFor(async () => (await claims!.waiting()).length >= 1, 'the burst\'s claims to wait in the hold')
      expect(await keysIn(db.sql, 'processing', keys)).toBe(0)
    }
    const signalMs = Math.round(performance.now() - burstAt)
    process.kill(group ? -service.pid : service.pid, 'SIGTERM')
    if (claims) {
      await waitFor(() => tookSignal(service), 'the service to take the signal')
      await claims.release()
    }
    const answers = await Promise.all(sends)
    const code = await within(service.proc.exited, EXIT_TIMEOUT_MS, 'still running' as const)
    const processing = await keysIn(db.sql, 'processing', keys)
    const drainLine = /"?[^\n]*draining[^\n]*/.exec(service.output())?.[0] ?? '(no drain line)'
    console.log(`[edges] SIGTERM to ${target} ${signalMs} ms after the burst (${when.kind}): answers ${JSON.stringify(tallyAnswers(answers))}; exit ${code}; ` +
      `${processing} key(s) left in processing; the service said: ${drainLine.trim().slice(0, 160)}`)

    expect(badAnswers(answers, { closedAllowed: true, alsoAllowed: [] })).toEqual([])
    expect(code).toBe(0)
    expect(processing).toBe(0)

    // A restart serves every key at once: nothing waits out the TTL.
    const restarted = await startService(db.url, provider.url, env)
    services.push(restarted)
    const retried = new Map<string, Attempt[]>()
    const failures: string[] = []
    const since = Date.now()
    await Promise.all(keys.map(async (key) => {
      try {
        retried.set(key, await payUntilAnswered(key, bodies.get(key)!, { url: () => restarted.url, pauseMs: 100, deadlineMs: RETRY_MS }))
      } catch (error) {
        failures.push(error instanceof Error ? error.message : String(error))
      }
    }))
    expect(failures).toEqual([])
    const retriedMs = Date.now() - since

    const results = new Map(keys.map((key) => [key, [...retried.get(key)!, ...answers.filter((a) => a.key === key && a.paymentId).map((a) => ({ status: a.status as number, replayed: false, ms: a.ms, paymentId: a.paymentId! }))]]))
    const payments = new Map([...(await paymentsByKey(db.sql))].filter(([key]) => bodies.has(key)))
    expect(exactlyOnce(results, payments)).toEqual([])
    expect(await chargedOnce(db.sql, provider, new Map(keys.map((key) => [key, bodies.get(key)!.customer])))).toEqual([])
    console.log(`[edges] SIGTERM to ${target}: after the restart every key 2xx within ${retriedMs} ms (${[...retried.values()].reduce((n, a) => n + a.length, 0)} attempts)`)
  }, 45_000)
}
