import { Database } from 'bun:sqlite'
import { existsSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { spawnSimulator } from '../src/provider/spawn'

/** A charge as the simulator's ledger holds it: its id, and the Idempotency-Key it was made under. */
export interface LedgerCharge {
  readonly id: string
  readonly key: string
}

export interface BenchProvider {
  readonly url: string
  readonly delayMs: number
  readonly pid: number
  /** Stops the simulator, reads its ledger, deletes it: every charge it recorded. */
  stop(): Promise<LedgerCharge[]>
}

/**
 * Where the bench's ledgers live: tmpfs when the machine has one. The ledger
 * fsyncs every charge (synchronous=FULL); on this machine's disk that is
 * ~790 µs per charge against ~47 µs on tmpfs, all of it on the simulator's one
 * event loop, so on disk the simulator caps both routes at ~1,260 charges/s,
 * below what the 200 ms scenario asks of it (256 / 0.2 s = 1,280/s). A real
 * provider's disk is not our service's cost. BENCH_PROVIDER_LEDGER_DIR overrides.
 */
function ledgerParent(): string {
  const chosen = process.env.BENCH_PROVIDER_LEDGER_DIR
  if (chosen) return chosen
  return existsSync('/dev/shm') ? '/dev/shm' : tmpdir()
}

/**
 * The payment provider simulator as the service meets it in production: its
 * own process, over HTTP, with a durable ledger (a temporary file) and
 * `delayMs` of latency on every charge (src/provider/spawn.ts).
 */
export async function startProvider(delayMs: number): Promise<BenchProvider> {
  const dir = mkdtempSync(join(ledgerParent(), 'idem-bench-ledger-'))
  const ledger = join(dir, 'ledger.sqlite')
  try {
    const simulator = await spawnSimulator({
      env: { PAYMENT_PROVIDER_PORT: '0', TEST_ALLOW_PORT_0: '1', PAYMENT_PROVIDER_DELAY_MS: String(delayMs), PAYMENT_PROVIDER_LEDGER: ledger },
      quiet: true,
    })
    return {
      url: simulator.url,
      delayMs,
      pid: simulator.proc.pid,
      async stop() {
        try {
          await simulator.stop()
          const db = new Database(ledger, { readonly: true })
          try {
            return db.query<LedgerCharge, []>('select id, idempotency_key as key from charges').all()
          } finally {
            db.close()
          }
        } finally {
          rmSync(dir, { recursive: true, force: true })
        }
      },
    }
  } catch (error) {
    rmSync(dir, { recursive: true, force: true })
    throw error
  }
}

/**
 * A provider that holds every charge until `release()`, then refuses it (503,
 * nothing charged): it keeps one request of the service in flight for as long
 * as the 409 storm on its key lasts. In the bench process; no ledger.
 */
export function startHoldingProvider(): { readonly url: string; release(): void; stop(): void } {
  const waiting = new Set<() => void>()
  let released = false
  const server = Bun.serve({
    hostname: '127.0.0.1',
    port: 0,
    async fetch(request) {
      if (!released) await new Promise<void>((resolve) => waiting.add(resolve))
      await request.arrayBuffer()
      return Response.json({ error: 'refused: the bench held this charge and never made it' }, { status: 503 })
    },
  })
  const release = () => {
    released = true
    for (const go of waiting) go()
    waiting.clear()
  }
  return { url: `http://127.0.0.1:${server.port}`, release, stop: () => { release(); void server.stop(true) } }
}
