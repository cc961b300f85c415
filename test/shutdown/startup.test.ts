/**
 * A stop during start-up is a clean stop: SIGTERM or SIGINT at any point of
 * the start (a rolling deploy stops a pod that has just started) stops what
 * has started and exits 0, leaving no process behind: no worker, no provider
 * simulator, no embedded PostgreSQL. Each case signals at one line of the
 * start (or at the first moment the process can catch a signal), with
 * DATABASE_URL set and with the embedded default, to the main process alone
 * (a container runtime) or to its whole group (Ctrl-C).
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { freePort } from '../chaos/clients'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { waitFor } from '../support/wait'
import { alive, catches, groupMembers, spawnDetached, waitWhileStarting, type StartingProcess } from './spawn'

const started: StartingProcess[] = []
// The provider simulator's ledger: this file's own.
const ledgerDir = mkdtempSync(join(tmpdir(), 'idem-startup-ledger-'))
const LEDGER = { PAYMENT_PROVIDER_LEDGER: join(ledgerDir, 'ledger.sqlite') }
afterAll(() => {
  for (const s of started) if (s.proc.exitCode === null) try { process.kill(-s.proc.pid, 'SIGKILL') } catch { /* gone */ }
  rmSync(ledgerDir, { recursive: true, force: true })
})

type Target = 'process' | 'group'
interface Case {
  readonly name: string
  readonly env?: Record<string, string>
  /** The point of the start to signal at: an output line, 'catchable' (its handler is installed), or any condition. */
  readonly at: RegExp | 'catchable' | ((output: string) => boolean)
  readonly signal: 'SIGTERM' | 'SIGINT'
  readonly to: Target
}

async function stopDuringStart(env: Record<string, string | undefined>, c: Case): Promise<{ out: string; simulator?: string }> {
  const service = spawnDetached([process.execPath, 'src/main.ts'], { ...LEDGER, ...env, ...c.env })
  started.push(service)
  const { proc, output } = service
  const { at } = c
  const reached = at === 'catchable' ? () => catches(proc.pid, c.signal) : at instanceof RegExp ? () => at.test(output()) : () => at(output())
  await waitWhileStarting(service, () => reached() || proc.exitCode !== null, `the point to signal at (${c.name})`)
  expect(proc.exitCode).toBeNull() // still starting: the line is not the last thing it printed
  const servingBefore = output().match(/listening on \S+ \(pid/g)?.length ?? 0
  process.kill(c.to === 'group' ? -proc.pid : proc.pid, c.signal)
  const code = await service.exited()
  const out = output()
  if (code !== 0) throw new Error(`exit ${code}:\n${out}`)
  expect(out).not.toMatch(/failed|exited on its own|restarting/)
  expect(groupMembers(proc.pid)).toEqual([]) // no worker left
  // The simulator runs in a group of its own: it must have been stopped, not left listening.
  const simulator = /provider simulator listening on (\S+)/.exec(out)?.[1]
  if (simulator) {
    expect(out).toContain('provider simulator stopped')
    expect(await fetch(`${simulator}/v1/charges?customer=x`).then(() => 'answered', () => 'refused')).toBe('refused')
  }
  const how = [
    [/during start-up: stopping/g, 'stopped between start-up steps'],
    [/stopped by SIG\w+ while booting/g, 'killed while booting (no handler yet)'],
    [/: draining \d+ in-flight/g, 'drained'],
  ] as const
  const paths = how.map(([pattern, label]) => `${out.match(pattern)?.length ?? 0} ${label}`).join(', ')
  console.log(`${c.name}: exit 0; ${servingBefore} server(s) listening when signalled; processes: ${paths}`)
  return { out, ...(simulator ? { simulator } : {}) }
}

const WORKERS_STARTED = /started 2 workers/

/** A worker has its signal handlers, and no server listens yet: a worker told to stop in the middle of its start. */
function workerStarting(output: string): boolean {
  const workers = /started 2 workers: (\d+), (\d+)/.exec(output)?.slice(1).map(Number) ?? []
  return !/listening on \S+ \(pid/.test(output) && workers.some((worker) => catches(worker, 'SIGTERM'))
}

describe('with DATABASE_URL', () => {
  let db: TestDatabase
  beforeAll(async () => { db = await createTestDatabase('startup_stop') })
  afterAll(async () => { await db?.drop() })

  const cases: Case[] = [
    { name: 'SIGTERM to a single process as soon as it can catch it', at: 'catchable', signal: 'SIGTERM', to: 'process' },
    { name: 'SIGINT to the group of a single process after migrations', at: /schema at migration/, signal: 'SIGINT', to: 'group' },
    { name: 'SIGTERM to a supervisor as soon as it can catch it', env: { WORKERS: '2' }, at: 'catchable', signal: 'SIGTERM', to: 'process' },
    { name: 'SIGTERM to the group when the simulator listens', env: { WORKERS: '2' }, at: /provider simulator listening/, signal: 'SIGTERM', to: 'group' },
    { name: 'SIGTERM to the group right after "started 2 workers"', env: { WORKERS: '2' }, at: WORKERS_STARTED, signal: 'SIGTERM', to: 'group' },
    { name: 'SIGTERM to the supervisor alone right after "started 2 workers"', env: { WORKERS: '2' }, at: WORKERS_STARTED, signal: 'SIGTERM', to: 'process' },
    { name: 'SIGINT to the group when the first worker listens', env: { WORKERS: '2' }, at: /listening on \S+ \(pid/, signal: 'SIGINT', to: 'group' },
    { name: 'SIGTERM to the group while a worker is starting (handlers in, not listening)', env: { WORKERS: '2' }, at: workerStarting, signal: 'SIGTERM', to: 'group' },
  ]
  for (const c of cases) test(c.name, async () => { await stopDuringStart({ DATABASE_URL: db.url }, c) }, 60_000)

  // The group's signal can kill the simulator (not yet in a group of its own,
  // no handler yet) and be seen as its exit before our own handler runs: a
  // race seen once in six loaded CI runs, exit 1. Here made certain: the child
  // is stopped (SIGSTOP) before its handler is in, killed by SIGINT, and only
  // once the service has seen it gone is the service signalled.
  test('the simulator killed by the stop before our own handler has seen it: still a clean stop, exit 0', async () => {
    const { service, child } = await simulatorKilledBeforeItsHandler({ DATABASE_URL: db.url })
    // The service has seen the child's end (and, before the fix, exited 1 at once).
    await waitWhileStarting(service, () => /ended by SIGINT/.test(service.output()) || service.proc.exitCode !== null, 'the child\'s end to be seen')
    process.kill(service.proc.pid, 'SIGINT')
    const code = await service.exited()
    if (code !== 0) throw new Error(`exit ${code} (the simulator ${child} died by SIGINT first):\n${service.output()}`)
    expect(service.output()).toContain('SIGINT during start-up: stopping')
  }, 60_000)

  test('the simulator killed by a SIGINT that is not ours: the start fails, exit 1, saying so', async () => {
    const { service } = await simulatorKilledBeforeItsHandler({ DATABASE_URL: db.url })
    expect(await service.exited()).toBe(1)
    expect(service.output()).toMatch(/failed to start: the provider simulator did not start/)
  }, 60_000)
})

/** The service, with its simulator child killed by SIGINT before that child could catch it (retried when it already could). */
async function simulatorKilledBeforeItsHandler(env: Record<string, string | undefined>): Promise<{ service: StartingProcess; child: number }> {
  for (let attempt = 1; ; attempt++) {
    const service = spawnDetached([process.execPath, 'src/main.ts'], { ...LEDGER, ...env })
    started.push(service)
    let child: number | undefined
    await waitWhileStarting(service, () => (child = childrenOf(service.proc.pid)[0]) !== undefined || service.proc.exitCode !== null, 'the simulator child', 30_000)
    expect(service.proc.exitCode).toBeNull()
    process.kill(child!, 'SIGSTOP')
    if (!catches(child!, 'SIGINT')) {
      process.kill(child!, 'SIGINT') // pending while it is stopped; its default action once continued
      process.kill(child!, 'SIGCONT')
      await waitFor(() => !alive(child!) || zombie(child!), `the simulator ${child} to die by SIGINT`)
      return { service, child: child! }
    }
    // It had its handler already: try again with a new start.
    process.kill(-service.proc.pid, 'SIGKILL')
    process.kill(child!, 'SIGKILL')
    await service.exited()
    if (attempt === 5) throw new Error('the simulator had its SIGINT handler before it could be stopped, 5 times')
  }
}

function childrenOf(pid: number): number[] {
  const found = Bun.spawnSync(['ps', '-o', 'pid=', '--ppid', String(pid)]).stdout.toString()
  return found.split('\n').map((line) => Number(line.trim())).filter((n) => n > 0)
}

function zombie(pid: number): boolean {
  try {
    return /^State:\s+Z/m.test(readFileSync(`/proc/${pid}/status`, 'utf8'))
  } catch {
    return false
  }
}

describe('with the embedded PostgreSQL', () => {
  let temp: string
  let env: Record<string, string | undefined>
  beforeAll(() => {
    temp = mkdtempSync(join(tmpdir(), 'idem-startup-'))
    chmodSync(temp, 0o755) // as root, PostgreSQL runs as `postgres` and must reach its data dir
    env = { DATABASE_URL: undefined, EMBEDDED_PG_DIR: join(temp, 'pg'), EMBEDDED_PG_PORT: String(freePort()) }
  })
  afterAll(async () => {
    const pid = postmasterPid()
    if (pid && alive(pid)) process.kill(pid, 'SIGQUIT')
    if (pid) await waitFor(() => !alive(pid), `PostgreSQL (pid ${pid}) to exit`, 30_000)
    if (temp) rmSync(temp, { recursive: true, force: true })
  })
  function postmasterPid(): number | undefined {
    const file = join(temp, 'pg', 'postmaster.pid')
    return existsSync(file) ? Number(readFileSync(file, 'utf8').split('\n')[0]) : undefined
  }
  /** Also: the database that this start ran (or adopted) is stopped, cleanly (its lock file gone). */
  async function stopped(c: Case): Promise<string> {
    const { out } = await stopDuringStart(env, c)
    if (out.includes('embedded PostgreSQL ready')) expect(out).toContain('embedded PostgreSQL stopped')
    expect(postmasterPid()).toBeUndefined()
    return out
  }

  test('SIGTERM to the group during initdb (the first start): exit 0, and the next start finds a whole cluster', async () => {
    const out = await stopped({ name: 'SIGTERM to the group during initdb', at: /initialising the embedded PostgreSQL/, signal: 'SIGTERM', to: 'group' })
    expect(out).toContain('embedded PostgreSQL stopped') // initdb finished, the server started and stopped
    expect(existsSync(join(temp, 'pg', 'PG_VERSION'))).toBe(true)
  }, 60_000)

  const cases: Case[] = [
    { name: 'SIGTERM to a supervisor as soon as it can catch it', env: { WORKERS: '2' }, at: 'catchable', signal: 'SIGTERM', to: 'process' },
    { name: 'SIGTERM to the supervisor alone after "embedded PostgreSQL ready"', env: { WORKERS: '2' }, at: /embedded PostgreSQL ready/, signal: 'SIGTERM', to: 'process' },
    { name: 'SIGINT to the group of a single process after "embedded PostgreSQL ready"', at: /embedded PostgreSQL ready/, signal: 'SIGINT', to: 'group' },
    { name: 'SIGTERM to the group right after "started 2 workers"', env: { WORKERS: '2' }, at: WORKERS_STARTED, signal: 'SIGTERM', to: 'group' },
    { name: 'SIGTERM to the supervisor alone right after "started 2 workers"', env: { WORKERS: '2' }, at: WORKERS_STARTED, signal: 'SIGTERM', to: 'process' },
    { name: 'SIGINT to the group while a worker is starting (handlers in, not listening)', env: { WORKERS: '2' }, at: workerStarting, signal: 'SIGINT', to: 'group' },
  ]
  for (const c of cases) test(c.name, async () => { await stopped(c) }, 60_000)
})
