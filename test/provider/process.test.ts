/**
 * The simulator as its own process (main.ts via spawn.ts): a durable ledger
 * across SIGKILL, a clean SIGTERM, and settings checked like the service's.
 */
import { afterEach, describe, expect, test } from 'bun:test'
import { providerClient } from '../../src/provider/client'
import { spawnSimulator, type SpawnedSimulator } from '../../src/provider/spawn'
import { ORDER, tempLedger } from './helpers'

const cleanups: Array<() => unknown> = []
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup()
})

/** A simulator process on a free port and its own ledger; killed after the test if still running. */
async function spawned(ledgerPath: string, env: Record<string, string | undefined> = {}): Promise<SpawnedSimulator> {
  const sim = await spawnSimulator({
    quiet: true,
    env: { PAYMENT_PROVIDER_PORT: '0', TEST_ALLOW_PORT_0: '1', PAYMENT_PROVIDER_LEDGER: ledgerPath, ...env },
  })
  cleanups.push(() => (sim.proc.exitCode === null && sim.proc.signalCode === null ? sim.stop() : undefined))
  return sim
}

const noDeadline = () => new AbortController().signal

describe('simulator process', () => {
  test('a recorded charge survives SIGKILL: listed after a restart on the same ledger, and replayed', async () => {
    const ledger = tempLedger()
    cleanups.push(() => ledger.remove())
    const first = await spawned(ledger.path)
    expect(first.output()).toBe(`provider simulator listening on ${first.url}\n`)
    const charge = await providerClient(first.url).charge(ORDER, { idempotencyKey: 'durable-key', signal: noDeadline() })
    first.proc.kill('SIGKILL')
    expect(await first.proc.exited).toBe(137)

    const second = await spawned(ledger.path)
    expect(await (await fetch(`${second.url}/v1/charges?customer=${ORDER.customer}`)).json()).toEqual({ data: [charge] })
    const replay = await providerClient(second.url).charge(ORDER, { idempotencyKey: 'durable-key', signal: noDeadline() })
    expect(replay).toEqual(charge)
  })

  test('SIGTERM stops it with exit code 0', async () => {
    const ledger = tempLedger()
    cleanups.push(() => ledger.remove())
    const sim = await spawned(ledger.path, { PAYMENT_PROVIDER_DELAY_MS: '600000' })
    // A charge hung in its delay must not hold the stop up.
    const hung = fetch(`${sim.url}/v1/charges`, { method: 'POST', headers: { 'idempotency-key': 'k' }, body: JSON.stringify(ORDER) }).catch(() => 'lost')
    expect((await fetch(`${sim.url}/healthz`)).status).toBe(200)
    expect(await sim.stop()).toBe(0)
    expect(await hung).toBe('lost')
  })

  test('a bad setting stops the start with exit code 2 and the variable\'s name', async () => {
    const ledger = tempLedger()
    cleanups.push(() => ledger.remove())
    const bad: Array<[string, Record<string, string | undefined>]> = [
      ['PAYMENT_PROVIDER_FAILURE_RATE', { PAYMENT_PROVIDER_FAILURE_RATE: '1.5' }],
      ['PAYMENT_PROVIDER_LOST_RESPONSE_RATE', { PAYMENT_PROVIDER_LOST_RESPONSE_RATE: 'often' }],
      ['PAYMENT_PROVIDER_DELAY_MS', { PAYMENT_PROVIDER_DELAY_MS: '-1' }],
      ['PAYMENT_PROVIDER_PORT', { PAYMENT_PROVIDER_PORT: '70000' }],
      ['PAYMENT_PROVIDER_PORT', { PAYMENT_PROVIDER_PORT: '0', TEST_ALLOW_PORT_0: undefined }],
    ]
    for (const [variable, env] of bad) {
      const error = await spawned(ledger.path, env).then(() => undefined, (failure: Error) => failure.message)
      expect(error).toContain('exited with code 2')
      expect(error).toContain(variable)
    }
  })

  test('settings of the service alone do not stop the simulator', async () => {
    const ledger = tempLedger()
    cleanups.push(() => ledger.remove())
    const sim = await spawned(ledger.path, { NODE_ENV: 'production', API_KEYS: undefined, PORT: 'not-a-port' })
    expect((await fetch(`${sim.url}/healthz`)).status).toBe(200)
  })
})
