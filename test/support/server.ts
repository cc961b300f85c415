import type { Subprocess } from 'bun'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Charge } from '../../src/provider/client'
import { startSimulator, type Simulator } from '../../src/provider/simulator'
import { spawnService } from './process'

export interface ServerProcess {
  readonly url: string
  readonly proc: Subprocess
  /** The payment provider this server charges through: counts are taken at its ledger. */
  readonly provider: ProviderHandle
  /** Everything the server printed so far. */
  output(): string
  /** Sends a signal and waits for the exit code; stops the provider too unless it was passed in. */
  stop(signal?: NodeJS.Signals): Promise<number>
}

export interface ProviderHandle {
  readonly url: string
  /** Every charge the provider recorded for `customer` (all when omitted), read over its HTTP API. */
  charges(customer?: string): Promise<Charge[]>
  /** Valid charge requests the simulator has not answered yet (waiting out their delay). */
  pending(): number
  stop(): Promise<void>
}

export const API_KEYS = 'acme:acme-key,globex:globex-key'
export const ADMIN_TOKEN = 'test-admin-token-123'

/** The simulator's fault settings, taken out of a service env: the service itself only needs the provider's URL. */
const PROVIDER_SETTINGS = ['PAYMENT_PROVIDER_DELAY_MS', 'PAYMENT_PROVIDER_FAILURE_RATE', 'PAYMENT_PROVIDER_LOST_RESPONSE_RATE'] as const

export interface ProviderFaults {
  readonly delayMs?: number | undefined
  readonly failureRate?: number | undefined
  readonly lostResponseRate?: number | undefined
  /** Draws for the fault rolls (see SimulatorOptions.random): tests steer which answers are lost. */
  readonly random?: (() => number) | undefined
}

/** A bundled provider simulator on a free port with a ledger of its own, in this test process. */
export async function startProvider(faults: ProviderFaults = {}): Promise<ProviderHandle> {
  const dir = mkdtempSync(join(tmpdir(), 'idem-provider-'))
  const simulator: Simulator = await startSimulator({
    port: 0,
    ledgerPath: join(dir, 'ledger.sqlite'),
    delayMs: faults.delayMs ?? 0,
    failureRate: faults.failureRate ?? 0,
    lostResponseRate: faults.lostResponseRate ?? 0,
    ...(faults.random ? { random: faults.random } : {}),
  })
  return {
    url: simulator.url,
    charges: (customer) => chargesAt(simulator.url, customer),
    pending: () => simulator.pendingCharges(),
    async stop() {
      await simulator.stop()
      rmSync(dir, { recursive: true, force: true })
    },
  }
}

export interface GatedProvider extends ProviderHandle {
  /** The next `count` charge requests wait at the gate (counted by `pending()` and `held()`) until `release()`; later ones pass. */
  hold(count?: number): void
  /** Lets every held charge through to the provider, and stops holding. */
  release(): void
  /** Charge requests waiting at the gate. */
  held(): number
  /**
   * The next `count` charge requests are refused with 503 by the gate, as a
   * provider that is down refuses before charging anything (the simulator's
   * failure mode, on command); `fail(0)` stops refusing.
   */
  fail(count?: number): void
}

/**
 * A provider whose charges a test can hold, instead of a delay that must be
 * long enough on a busy machine: while held, a request stays claimed and
 * in its foreign call for exactly as long as the test needs, then goes on at
 * once. A proxy in front of the simulator (startProvider), in this process;
 * it passes everything else through. Lost answers cannot go through a proxy,
 * so there is no `lostResponseRate` here.
 */
export async function startGatedProvider(faults: Omit<ProviderFaults, 'lostResponseRate'> = {}): Promise<GatedProvider> {
  const provider = await startProvider(faults)
  return gateProvider(provider, { pending: provider.pending, stop: provider.stop })
}

/** What a gate forwards to: any provider with the simulator's API (e.g. a simulator process, test/support/provider-process.ts). */
export interface GateUpstream {
  readonly url: string
  /** Charges the upstream has not answered yet, when it can tell (an in-process simulator can). */
  readonly pending?: () => number
}

export interface GateOptions {
  /** Charges the upstream has not answered yet, added to `pending()`. */
  readonly pending?: () => number
  /** Stopped with the gate (the upstream is the gate's own). @default nothing: the upstream is the caller's */
  readonly stop?: () => Promise<void>
}

/** The gate of startGatedProvider, in front of any provider; `stop()` stops the gate only, unless `options.stop` says more. */
export function gateProvider(upstream: GateUpstream, options: GateOptions = { ...(upstream.pending ? { pending: upstream.pending } : {}) }): GatedProvider {
  let toHold = 0
  let toFail = 0
  const waiting = new Set<() => void>()
  const proxy = Bun.serve({
    hostname: '127.0.0.1',
    port: 0,
    async fetch(request) {
      const { pathname, search } = new URL(request.url)
      const body = request.method === 'GET' || request.method === 'HEAD' ? undefined : await request.arrayBuffer()
      const isCharge = request.method === 'POST' && pathname === '/v1/charges'
      if (isCharge && toFail > 0) {
        toFail--
        return Response.json({ error: 'provider unavailable (refused at the test gate)' }, { status: 503 })
      }
      if (isCharge && toHold > 0) {
        toHold--
        await new Promise<void>((resolve) => waiting.add(resolve))
      }
      const headers = new Headers(request.headers)
      for (const name of ['host', 'connection', 'content-length']) headers.delete(name)
      const answer = await forward(`${upstream.url}${pathname}${search}`, { method: request.method, headers, ...(body ? { body } : {}), redirect: 'manual' })
      if (!answer) return Response.json({ error: 'the gate could not reach the provider' }, { status: 502 })
      const out = new Headers(answer.headers)
      for (const name of ['content-length', 'content-encoding', 'transfer-encoding', 'connection']) out.delete(name)
      return new Response(await answer.arrayBuffer(), { status: answer.status, headers: out })
    },
  })
  const url = `http://127.0.0.1:${proxy.port}`
  const release = () => {
    toHold = 0
    for (const go of waiting) go()
    waiting.clear()
  }
  return {
    url,
    charges: (customer) => chargesAt(upstream.url, customer),
    pending: () => waiting.size + (options.pending?.() ?? 0),
    held: () => waiting.size,
    hold: (count = Number.POSITIVE_INFINITY) => { toHold = count },
    fail: (count = Number.POSITIVE_INFINITY) => { toFail = count },
    release,
    async stop() {
      release()
      await proxy.stop(true)
      await options.stop?.()
    },
  }
}

/**
 * The gate's request to its upstream. A kept-alive connection the upstream
 * has just closed (node:http ends idle ones after 5 s) fails before anything
 * reached it: sent again, up to 3 times (a charge carries its Idempotency-Key,
 * so a repeat is harmless anyway). Undefined when the upstream stays
 * unreachable: the gate answers 502 rather than throwing in its handler.
 */
async function forward(url: string, init: RequestInit): Promise<Response | undefined> {
  for (let attempt = 1; attempt <= 3; attempt++) {
    try {
      return await fetch(url, init)
    } catch { /* a stale or refused connection: again */ }
  }
  return undefined
}

/** Counts charges over the provider's own API, as an operator or a black-box test would. */
export async function chargesAt(providerUrl: string, customer?: string): Promise<Charge[]> {
  const query = customer === undefined ? '' : `?customer=${encodeURIComponent(customer)}`
  const response = await fetch(`${providerUrl}/v1/charges${query}`)
  if (!response.ok) throw new Error(`the provider answered ${response.status} to a charges listing`)
  return ((await response.json()) as { data: Charge[] }).data
}

export interface StartOptions {
  /** Charge through this provider (e.g. one that outlives a restarted server); else one is started from the env's PAYMENT_PROVIDER_* faults. */
  readonly provider?: ProviderHandle
}

/**
 * Starts `bun src/main.ts` as a real process on a free port: the product as a
 * user runs it, over real HTTP, charging through a provider simulator of its
 * own (PAYMENT_PROVIDER_DELAY_MS and friends in `env` configure that simulator).
 */
export async function startServer(databaseUrl: string, env: Record<string, string> = {}, options: StartOptions = {}): Promise<ServerProcess> {
  const serviceEnv: Record<string, string> = { ...env }
  const faults: Record<string, number> = {}
  for (const name of PROVIDER_SETTINGS) {
    if (serviceEnv[name] !== undefined) faults[name] = Number(serviceEnv[name])
    delete serviceEnv[name]
  }
  const provider = options.provider ?? await startProvider({
    delayMs: faults.PAYMENT_PROVIDER_DELAY_MS,
    failureRate: faults.PAYMENT_PROVIDER_FAILURE_RATE,
    lostResponseRate: faults.PAYMENT_PROVIDER_LOST_RESPONSE_RATE,
  })
  const { proc, url, output } = await spawnService({
    env: { DATABASE_URL: databaseUrl, API_KEYS, ADMIN_TOKEN, NODE_ENV: 'test', PAYMENT_PROVIDER_URL: provider.url, ...serviceEnv },
  }).catch(async (error: unknown) => {
    if (!options.provider) await provider.stop()
    throw error
  })
  return {
    url,
    proc,
    provider,
    output,
    async stop(signal = 'SIGTERM') {
      if (proc.exitCode === null) proc.kill(signal)
      const code = await proc.exited
      if (!options.provider) await provider.stop()
      return code
    },
  }
}
