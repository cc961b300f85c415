/**
 * The bundled provider simulator across a SIGKILL of its service: it runs on
 * in its own process group (by design), so the next start must stop it, and
 * only it (src/provider/orphans.ts).
 *
 * - Restarted 0.6 s after a SIGKILL, while the killed service is not yet
 *   reaped (a zombie: here its parent never waits, as a careless supervisor),
 *   the service starts, and its simulator takes the port.
 * - A start on another ledger (another checkout) leaves the first ledger's
 *   orphaned simulator alone.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { freePort } from '../chaos/clients'
import { orphanedSimulators } from '../../src/provider/orphans'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { waitFor } from '../support/wait'
import { spawnDetached, startDetached, waitWhileStarting, type StartingProcess } from './spawn'

let db: TestDatabase
let temp: string
const groups: number[] = []
const ledgers: string[] = []

beforeAll(async () => {
  db = await createTestDatabase('sim_restart')
  temp = mkdtempSync(join(tmpdir(), 'idem-sim-restart-'))
})
afterAll(async () => {
  for (const pgid of groups) try { process.kill(-pgid, 'SIGKILL') } catch { /* gone */ }
  // Simulators left running by the tests (their own groups): found through their records.
  for (const ledger of ledgers) for (const orphan of orphanedSimulators(ledger)) try { process.kill(orphan.pid, 'SIGKILL') } catch { /* gone */ }
  rmSync(temp, { recursive: true, force: true })
  await db?.drop()
})

function env(ledger: string, providerPort: number): Record<string, string | undefined> {
  ledgers.push(ledger)
  return { DATABASE_URL: db.url, PAYMENT_PROVIDER_URL: undefined, PAYMENT_PROVIDER_PORT: String(providerPort), PAYMENT_PROVIDER_LEDGER: ledger }
}

const LISTENING = /listening on \S+:(\d+) \(pid (\d+)\)/

function state(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    return stat.slice(stat.lastIndexOf(')') + 2)[0]
  } catch {
    return undefined
  }
}

async function simulatorAnswers(port: number): Promise<boolean> {
  return (await fetch(`http://127.0.0.1:${port}/healthz`).catch(() => undefined))?.status === 200
}

test('restarted 0.6 s after a SIGKILL, with the killed service still a zombie: the orphaned simulator is stopped and the service starts', async () => {
  const port = freePort()
  const settings = env(join(temp, 'a', 'ledger.sqlite'), port)
  // The service's parent is `sleep`, which never reaps it: once killed, it stays a zombie.
  const first: StartingProcess = spawnDetached(['sh', '-c', `${process.execPath} src/main.ts & exec sleep 600`], settings)
  groups.push(first.proc.pid)
  await waitWhileStarting(first, () => LISTENING.test(first.output()), 'the first service to listen', 60_000)
  const servicePid = Number(LISTENING.exec(first.output())![2])
  expect(await simulatorAnswers(port)).toBe(true)

  process.kill(servicePid, 'SIGKILL') // the service alone: its simulator lives on in its own group
  await waitFor(() => state(servicePid) === 'Z', 'the killed service to be a zombie')
  await Bun.sleep(600) // the operator's 0.6 s: time as the scenario, not as synchronisation
  expect(state(servicePid)).toBe('Z')
  expect(await simulatorAnswers(port)).toBe(true) // the orphan still holds the port

  const second = await startDetached([process.execPath, 'src/main.ts'], settings)
  groups.push(second.proc.pid)
  expect(second.output()).toContain('stopping 1 provider simulator(s) left running on this ledger by a killed service')
  expect(second.output()).not.toContain('in use')
  expect(await simulatorAnswers(port)).toBe(true) // the new one
  process.kill(second.proc.pid, 'SIGTERM')
  expect(await second.exited()).toBe(0)
  expect(await simulatorAnswers(port)).toBe(false)
}, 120_000)

test('a start on another ledger (another checkout) never stops the first ledger\'s orphaned simulator', async () => {
  const mine = freePort()
  const first = await startDetached([process.execPath, 'src/main.ts'], env(join(temp, 'checkout-1', 'ledger.sqlite'), mine))
  groups.push(first.proc.pid)
  process.kill(first.proc.pid, 'SIGKILL')
  await first.exited()
  expect(await simulatorAnswers(mine)).toBe(true) // orphaned

  const other = await startDetached([process.execPath, 'src/main.ts'], env(join(temp, 'checkout-2', 'ledger.sqlite'), freePort()))
  groups.push(other.proc.pid)
  expect(other.output()).not.toContain('stopping')
  expect(await simulatorAnswers(mine)).toBe(true)
  process.kill(other.proc.pid, 'SIGTERM')
  expect(await other.exited()).toBe(0)
  expect(await simulatorAnswers(mine)).toBe(true)
}, 120_000)
