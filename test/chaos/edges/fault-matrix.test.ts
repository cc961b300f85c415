/**
 * Invariant 9 at every edge of a request's life (issue 16, item 1): one
 * database connection of the service is reset (RST) or its backend is
 * terminated (pg_terminate_backend), at one phase of the requests of a burst
 * of 32 clients (32 keys, and 4 more concurrent sends of the first 4 keys):
 *
 * | phase         | how the fault is aimed (no sleeps, no timing)                                                   |
 * | ------------- | ----------------------------------------------------------------------------------------------- |
 * | setup         | the first statement of a new pool connection (postgres.js's type query, `fetch_types`), trapped at the proxy: reset before the server sees it, or run by the server, its answer held, and the backend terminated |
 * | claim         | the claim's INSERT, held in the database (statement-holds.ts) while the test faults its backends |
 * | provider-call | every charge held at a gate in front of the provider; the service's idle connections faulted  |
 * | completion    | the payment INSERT, held in the database                                                        |
 * | fence-commit  | the COMMIT after the fence, held by a deferred constraint trigger                                |
 * | release       | the release after a provider failure (the gate refuses every charge), held in the database       |
 *
 * Each case checks that its fault landed where it says (the statement the
 * faulted backend was running), then that:
 * - the service process is the same one and answers /healthz 200;
 * - every request got an HTTP answer: a 2xx, or a 5xx problem+json (503 with
 *   Retry-After), or for a key sent twice at once a 409 while the other send
 *   is in flight; none hung, none was cut off;
 * - no metric counts an unhandled rejection or exception (a last-resort
 *   handler may exist, but these paths must not need it);
 * - every key then reaches a 2xx through retries within RECOVERY_MS, well
 *   under the 30 s TTL (a key left in processing by a request that has ended
 *   must be clearable by a retry, issue 16 "recoverable claims"), with exactly
 *   one payment and one charge at the provider's ledger.
 *
 * The service reaches PostgreSQL through a TCP proxy (tcp-proxy.ts) in every
 * case, so a backend's client_port names its connection at the proxy; the
 * provider is a simulator process behind a gate of this process.
 */
import { afterAll, afterEach, beforeAll, expect, test } from 'bun:test'
import { badAnswers, send, tallyAnswers, type Answer } from '../../support/answers'
import { createTestDatabase, type TestDatabase } from '../../support/db'
import { payment, type PaymentBody } from '../../support/http'
import { spawnProvider, type ProviderProcess } from '../../support/provider-process'
import { gateProvider, type GatedProvider } from '../../support/server'
import { startService, type ServiceProcess } from '../../support/service-process'
import { HOLDS, hold, installHolds, serviceBackends, terminate, type Backend, type Hold, type HoldName } from '../../support/statement-holds'
import { startTcpProxy, type ProxyConnection, type TcpProxy, type TrapHit } from '../../support/tcp-proxy'
import { waitFor } from '../../support/wait'
import { chargedOnce, exactlyOnce, payUntilAnswered, paymentsByKey, type Attempt } from '../clients'

const TTL_SECONDS = 30
/** Every key must reach a 2xx by then after the fault: seconds, not the TTL (30 s). */
const RECOVERY_MS = 8_000
const KEYS = 32
/** The first DUPLICATES keys are sent twice at once: a client retrying while the first send is in flight. */
const DUPLICATES = 4
/**
 * Backends faulted per held phase: at least this many are waiting before the
 * test strikes (the pools hold 8). Claims and completions are batched
 * (core/batcher.ts: two statements in flight per pool, each carrying every
 * request queued meanwhile), so there one held statement already stands for
 * many requests, and faulting it fails them all at once.
 */
const FAULTED = 4
const FAULTED_BATCHED = 1
const faultedIn = (hold: HoldName) => (hold === 'release' ? FAULTED : FAULTED_BATCHED)
/** A request not answered by then hangs: every fault here ends what it touched in milliseconds. */
const ANSWER_TIMEOUT_MS = 15_000
/** The burst makes each pool open connections within milliseconds; past this, none will come. */
const NEW_CONNECTION_MS = 10_000

type Fault = 'rst' | 'terminate'
type Phase = 'setup' | 'claim' | 'provider-call' | 'completion' | 'fence-commit' | 'release'

let db: TestDatabase
let provider: ProviderProcess
let gate: GatedProvider
let proxy: TcpProxy | undefined
let service: ServiceProcess | undefined
let held: Hold | undefined

interface Target { readonly proxy: TcpProxy; readonly service: ServiceProcess }
/**
 * The next case's service, started while this case runs: a start takes most
 * of a case's time (0.4 to 1 s), and an idle service disturbs nothing here
 * (every fault and hold is scoped to the case's own service by its pid).
 */
let next: Promise<Target> | undefined

async function startTarget(): Promise<Target> {
  const proxy = await startTcpProxy(db.url)
  try {
    return { proxy, service: await startService(proxy.url, gate.url, { IDEMPOTENCY_TTL_SECONDS: String(TTL_SECONDS) }) }
  } catch (error) {
    proxy.stop()
    throw error
  }
}

/** This case's service (started ahead, or now), and the next case's on its way. */
async function takeTarget(last: boolean): Promise<Target> {
  const target = await (next ?? startTarget())
  next = last ? undefined : startTarget()
  next?.catch(() => undefined) // awaited by the next case, which then reports it
  return target
}

beforeAll(async () => {
  db = await createTestDatabase('edges_matrix')
  await installHolds(db.sql)
  provider = await spawnProvider()
  gate = gateProvider(provider)
})
afterEach(async () => {
  gate.release()
  gate.fail(0)
  await held?.release()
  await service?.stop('SIGKILL')
  proxy?.stop()
  held = service = proxy = undefined
})
afterAll(async () => {
  const left = await next?.catch(() => undefined)
  await left?.service.stop('SIGKILL')
  left?.proxy.stop()
  await gate?.stop()
  await provider?.stop()
  await db?.drop()
})

const poolOf = (startup: Readonly<Record<string, string>>) => /^idempotent-post:\d+:(short|work)$/.exec(startup.application_name ?? '')?.[1]

/** Rejects as soon as the service exits, with its last lines: a crash ends the case at once, and shows why. */
function whileAlive<T>(service: ServiceProcess, work: Promise<T>, what: string): Promise<T> {
  return Promise.race([
    work,
    service.proc.exited.then((code) => { throw new Error(`the service exited (code ${code}) while waiting for ${what}; its last lines:\n${service.tail()}`) }),
  ])
}

/** The proxy connection of a backend seen in pg_stat_activity. */
function connectionOf(backend: Backend): ProxyConnection {
  const connection = proxy!.connections().find((c) => c.serverSidePort === backend.client_port)
  if (!connection) throw new Error(`no proxy connection for backend ${backend.pid} (client_port ${backend.client_port})`)
  return connection
}

/** RST of each backend's connection, or pg_terminate_backend of each; returns what was done, for the log. */
async function fault(fault: Fault, backends: readonly Backend[]): Promise<string> {
  if (fault === 'rst') {
    const connections = backends.map(connectionOf)
    for (const connection of connections) connection.reset()
    return `reset ${connections.length} connection(s)`
  }
  const pids = await terminate(db.sql, backends)
  expect(pids.sort()).toEqual(backends.map((b) => b.pid).sort())
  return `terminated ${pids.length} backend(s)`
}

const HELD: Partial<Record<Phase, HoldName>> = { 'claim': 'claim', 'completion': 'payment-insert', 'fence-commit': 'commit', 'release': 'release' }

interface Strike {
  /** Arms the fault, before the burst. */
  arm(): Promise<void>
  /** Lands it, while the burst runs; returns what landed where, for the log. */
  land(): Promise<string>
}

function strike(phase: Phase, kind: Fault, service: ServiceProcess): Strike {
  const holdName = HELD[phase]
  if (holdName) {
    return {
      async arm() {
        if (phase === 'release') gate.fail() // every charge refused: every request fails and releases its key
        held = await hold(db.sql, holdName)
      },
      async land() {
        let waiting: Backend[] = []
        await whileAlive(service, waitFor(async () => (waiting = await held!.waiting(service.pid)).length >= faultedIn(holdName),
          () => `${faultedIn(holdName)} service backends held in ${holdName} (${waiting.length} so far)`), `the ${holdName} hold`)
        // The fault lands on statements of this phase, caught while they run.
        for (const backend of waiting) expect({ pid: backend.pid, query: backend.query }).toEqual({ pid: backend.pid, query: expect.stringMatching(HOLDS[holdName].query) })
        const done = await fault(kind, waiting)
        await held!.release()
        if (phase === 'release') gate.fail(0)
        return `${done} held in ${holdName} (${waiting.map((b) => b.application_name.split(':').at(-1)).join(', ')})`
      },
    }
  }

  if (phase === 'provider-call') {
    return {
      async arm() {
        // One payment first, so both pools have connections to lose while the burst is at the provider.
        expect((await send(service.url, `warm-${crypto.randomUUID()}`, payment({ customer: `cus_warm_${crypto.randomUUID()}` }))).status).toBe(201)
        gate.hold()
      },
      async land() {
        await whileAlive(service, waitFor(() => gate.held() === KEYS, () => `the ${KEYS} charges at the provider (${gate.held()} so far)`), 'the charges')
        // Atomic phases: no transaction is open across the provider call, so what is faulted now is only idle connections.
        expect(await serviceBackends(db.sql, { state: 'idle in transaction', pid: service.pid })).toEqual([])
        // The fresh path's claims and completions share the short pool (src/core/lane.ts); the work pool
        // serves transactional completions only, which this route does not use.
        const idle = await serviceBackends(db.sql, { state: 'idle', pid: service.pid })
        expect(idle.some((b) => b.application_name.endsWith(':short'))).toBe(true)
        const done = await fault(kind, idle)
        expect(gate.held()).toBe(KEYS)
        gate.release()
        return `${done}, all idle, with ${KEYS} charges held at the provider`
      },
    }
  }

  // setup: the first statement of a new connection of the short pool, which
  // carries the fresh path's claims and completions (src/core/lane.ts):
  // postgres.js's type query, or whatever it sends first. It lands in the
  // burst, on its claims.
  let trap: Promise<TrapHit> | undefined
  const landTrap = async (trap: Promise<TrapHit>): Promise<string> => {
    const hit = await whileAlive(service, withTimeout(trap, NEW_CONNECTION_MS, 'a new pool connection to send its first statement'), 'a new pool connection\'s first statement')
    const head = hit.statement.trim().replace(/\s+/g, ' ').slice(0, 60)
    if (kind === 'rst') return `reset ${poolOf(hit.startup)} connection #${hit.connection.id} on its first statement (${head})`
    await whileAlive(service, hit.reply!.complete, 'the first statement\'s answer')
    // The server ran it: the backend's last statement is the trapped one, its answer held at the proxy.
    const [backend] = await db.sql<Backend[]>`
      select pid, application_name, client_port, state, query, wait_event from pg_stat_activity
       where datname = current_database() and client_port = ${hit.connection.serverSidePort!}`
    // pg_stat_activity keeps the first track_activity_query_size bytes (1024) of the text.
    expect(backend?.query).toBeTruthy()
    expect(hit.statement.startsWith(backend!.query)).toBe(true)
    await fault('terminate', [backend!])
    hit.reply!.drop()
    return `terminated ${poolOf(hit.startup)} backend ${backend!.pid} after it ran its connection's first statement (${head}), its answer lost`
  }
  return {
    async arm() {
      // The short pool already has what start-up opened (heartbeat, settings, the durability check), and
      // batched statements need only a few in flight: the burst may open no new short connection. So
      // its idle ones go first (an RST, which a pool must survive too), and the burst reconnects.
      const idle = proxy!.connections().filter((c) => poolOf(c.startup) === 'short' && c.open)
      for (const connection of idle) connection.reset()
      await waitFor(() => idle.every((c) => !c.open), 'the short pool\'s idle connections to close')
      const firstNew = proxy!.counts.accepted
      trap = proxy!.trap({
        connection: (startup, connection) => poolOf(startup) === 'short' && connection.id >= firstNew,
        before: /[\s\S]/,
        action: kind === 'rst' ? 'reset' : 'hold-reply',
      })
    },
    land: () => landTrap(trap!),
  }
}

/** Rejects after `ms`, naming what it waited for. */
function withTimeout<T>(work: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined
  const timeout = new Promise<never>((_, reject) => { timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms) })
  return Promise.race([work, timeout]).finally(() => clearTimeout(timer))
}

/** The service's metrics that count unhandled rejections or exceptions, with a value above 0. */
async function unhandledCounts(url: string): Promise<string[]> {
  const text = await (await fetch(`${url}/metrics`)).text()
  return text.split('\n').filter((line) => /^[a-z_]*(unhandled|uncaught)[a-z_]*(\{[^}]*\})? /i.test(line) && Number(line.split(' ').at(-1)) > 0)
}

const PHASES: Phase[] = ['setup', 'claim', 'provider-call', 'completion', 'fence-commit', 'release']
const FAULTS: Fault[] = ['rst', 'terminate']

const LAST = `${PHASES.at(-1)}-${FAULTS.at(-1)}`
for (const phase of PHASES) {
  for (const kind of FAULTS) {
    test(`${kind === 'rst' ? 'RST of a connection' : 'pg_terminate_backend'} during ${phase}: the process keeps serving, every request is answered, every key then completes once`, async () => {
      const t0 = performance.now()
      ;({ proxy, service } = await takeTarget(`${phase}-${kind}` === LAST))
      const svc = service
      const run = `${phase}-${kind}-${crypto.randomUUID().slice(0, 6)}`
      const bodies = new Map<string, PaymentBody>(Array.from({ length: KEYS }, (_, i) => [`m-${run}-${i}`, payment({ customer: `cus_${run}_${i}` })]))
      const keys = [...bodies.keys()]

      const t1 = performance.now()
      const strikeOf = strike(phase, kind, svc)
      const { arm, land } = strikeOf
      await arm()
      const sends = [...keys, ...keys.slice(0, DUPLICATES)].map((key) => send(svc.url, key, bodies.get(key)!, ANSWER_TIMEOUT_MS))
      const landed = await land()
      const t2 = performance.now()
      const answers: Answer[] = await Promise.all(sends)
      const t3 = performance.now()
      console.log(`[edges] ${kind} during ${phase}: ${landed}; first answers ${JSON.stringify(tallyAnswers(answers))} [start ${Math.round(t1 - t0)} land ${Math.round(t2 - t1)} answers ${Math.round(t3 - t2)} ms]`)

      // The process: the same one, serving.
      if (!svc.alive()) throw new Error(`the service (pid ${svc.pid}) exited with ${await svc.proc.exited} after: ${landed}; answers ${JSON.stringify(tallyAnswers(answers))}; its last lines:\n${svc.tail()}`)
      expect((await fetch(`${svc.url}/healthz`)).status).toBe(200)
      const unhandled = await unhandledCounts(svc.url)
      if (unhandled.length > 0) throw new Error(`the service counted errors no path handled: ${unhandled.join(', ')}; it logged:\n` +
        svc.output().split('\n').filter((line) => /unhandled|uncaught/i.test(line)).slice(0, 5).join('\n'))
      // 409 "in progress" is true only for a key sent twice at once; to the one request of a key, a fault is a 5xx, never a 409.
      const duplicated = new Set(keys.slice(0, DUPLICATES))
      expect([
        ...badAnswers(answers.filter((a) => duplicated.has(a.key)), { alsoAllowed: [409] }),
        ...badAnswers(answers.filter((a) => !duplicated.has(a.key)), { alsoAllowed: [] }),
      ]).toEqual([])

      // Every key completes through retries, in seconds.
      const retried = new Map<string, Attempt[]>()
      const failures: string[] = []
      const since = Date.now()
      await Promise.all(keys.map(async (key) => {
        try {
          retried.set(key, await payUntilAnswered(key, bodies.get(key)!, { url: () => svc.url, pauseMs: 100, deadlineMs: RECOVERY_MS, attemptTimeoutMs: ANSWER_TIMEOUT_MS }))
        } catch (error) {
          failures.push(error instanceof Error ? error.message : String(error))
        }
      }))
      expect(failures).toEqual([])
      const recoveredMs = Date.now() - since
      expect(svc.alive()).toBe(true)

      const results = new Map(keys.map((key) => [key, [...retried.get(key)!, ...answers.filter((a) => a.key === key).map((a) => ({ status: a.status as number, replayed: false, ms: a.ms, ...(a.paymentId ? { paymentId: a.paymentId } : {}) }))]]))
      const payments = new Map([...(await paymentsByKey(db.sql))].filter(([key]) => bodies.has(key)))
      expect(exactlyOnce(results, payments)).toEqual([])
      expect(await chargedOnce(db.sql, provider, new Map(keys.map((key) => [key, bodies.get(key)!.customer])))).toEqual([])

      console.log(`[edges] ${kind} during ${phase}: every key 201 within ${recoveredMs} ms of retries ` +
        `(${[...retried.values()].reduce((n, a) => n + a.length, 0)} attempts); pid ${svc.pid} still serving`)
    }, 40_000)
  }
}
