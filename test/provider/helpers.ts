import { afterEach } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { startSimulator, type Simulator, type SimulatorOptions } from '../../src/provider/simulator'

/** A fresh folder per test: the ledger path inside it does not exist yet, so the simulator must create its parent. */
export function tempLedger(): { path: string; remove(): void } {
  const dir = mkdtempSync(join(tmpdir(), 'provider-test-'))
  return { path: join(dir, 'nested', 'ledger.sqlite'), remove: () => rmSync(dir, { recursive: true, force: true }) }
}

/** A `random` that returns these draws in order and fails loudly when the simulator draws more than the test planned. */
export function draws(...values: number[]): () => number {
  let next = 0
  return () => {
    if (next >= values.length) throw new Error(`the simulator drew more than the ${values.length} planned random numbers`)
    return values[next++] as number
  }
}

/** Starts a simulator on a free port with no faults unless asked; `close` stops it and removes its ledger. */
export async function simulator(options: Partial<SimulatorOptions> = {}): Promise<Simulator & { close(): Promise<void> }> {
  const ledger = tempLedger()
  const sim = await startSimulator({ port: 0, ledgerPath: ledger.path, delayMs: 0, failureRate: 0, lostResponseRate: 0, ...options })
  return Object.assign(sim, { close: async () => { await sim.stop(); ledger.remove() } })
}

export function postCharge(url: string, key: string | undefined, body: unknown, init: RequestInit = {}): Promise<Response> {
  const headers: Record<string, string> = { 'content-type': 'application/json' }
  if (key !== undefined) headers['idempotency-key'] = key
  return fetch(`${url}/v1/charges`, { method: 'POST', headers, body: typeof body === 'string' ? body : JSON.stringify(body), ...init })
}

export const ORDER = Object.freeze({ amount: 1250, currency: 'EUR', customer: 'cus_alice' })

/** The status of an answer, or 'lost' when the request got none (the connection was dropped). */
export function statusOrLost(response: Promise<Response>): Promise<number | 'lost'> {
  return response.then(
    async (answer) => {
      await answer.arrayBuffer()
      return answer.status
    },
    () => 'lost' as const,
  )
}

/** The suite's one waitFor (test/support/wait.ts). */
export { waitFor } from '../support/wait'

const cleanups: Array<() => unknown> = []
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup()
})

/** Runs `fn` after the current test (last registered, first run). */
export function cleanup(fn: () => unknown): void {
  cleanups.push(fn)
}

/** A simulator for one test: stopped, and its ledger removed, after that test. */
export async function started(options: Parameters<typeof simulator>[0] = {}) {
  const sim = await simulator(options)
  cleanups.push(() => sim.close())
  return sim
}
