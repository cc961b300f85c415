/**
 * The provider simulator as its own process (src/provider/spawn.ts, as
 * `npm start` runs it), with a ledger of its own in a temporary folder:
 * charges are counted over its HTTP API (GET /v1/charges?customer=C), where
 * they land, and its faults (PAYMENT_PROVIDER_*) are its own, over real HTTP.
 *
 * `restart(faults)` stops it and starts another on the same port and ledger:
 * a provider that loses every answer, then recovers. The service keeps its
 * PAYMENT_PROVIDER_URL, and its client retries a connection the old process
 * dropped (a lost answer), so nothing else changes for it.
 */
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Charge } from '../../src/provider/client'
import { spawnSimulator, type SpawnedSimulator } from '../../src/provider/spawn'
import { chargesAt } from './server'

export interface ProcessFaults {
  readonly delayMs?: number
  readonly failureRate?: number
  readonly lostResponseRate?: number
}

export interface ProviderProcess {
  readonly url: string
  /** The running simulator's pid (another after a restart). */
  pid(): number
  /** Every charge its ledger holds for `customer` (all when omitted), over its HTTP API. */
  charges(customer?: string): Promise<Charge[]>
  /** Stops it and starts it again on the same port and ledger with these faults. Charges still waiting out a delay are abandoned (uncharged): wait for them first. */
  restart(faults: ProcessFaults): Promise<void>
  /** Stops it and removes its ledger. */
  stop(): Promise<void>
}

export async function spawnProvider(faults: ProcessFaults = {}): Promise<ProviderProcess> {
  const dir = mkdtempSync(join(tmpdir(), 'idem-provider-process-'))
  const ledger = join(dir, 'ledger.sqlite')
  const start = (next: ProcessFaults, port: number) => spawnSimulator({
    quiet: true,
    env: {
      PAYMENT_PROVIDER_PORT: String(port),
      TEST_ALLOW_PORT_0: '1',
      PAYMENT_PROVIDER_LEDGER: ledger,
      PAYMENT_PROVIDER_DELAY_MS: String(next.delayMs ?? 0),
      PAYMENT_PROVIDER_FAILURE_RATE: String(next.failureRate ?? 0),
      PAYMENT_PROVIDER_LOST_RESPONSE_RATE: String(next.lostResponseRate ?? 0),
    },
  })
  let simulator: SpawnedSimulator
  try {
    simulator = await start(faults, 0)
  } catch (error) {
    rmSync(dir, { recursive: true, force: true })
    throw error
  }
  const url = simulator.url
  const port = Number(new URL(url).port)
  return {
    url,
    pid: () => simulator.proc.pid,
    charges: (customer) => chargesAt(url, customer),
    async restart(next) {
      await simulator.stop()
      simulator = await start(next, port)
      if (simulator.url !== url) throw new Error(`the restarted simulator listens on ${simulator.url}, not ${url}`)
    },
    async stop() {
      await simulator.stop()
      rmSync(dir, { recursive: true, force: true })
    },
  }
}
