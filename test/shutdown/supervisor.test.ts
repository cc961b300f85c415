/**
 * Running one process under a supervisor (docs/how-to/production.md: "Running under a
 * supervisor"): the systemd unit we ship (examples/deploy) is valid, its
 * timings leave the drain room, and the service's exits are the ones its
 * restart rules rely on. The last part runs the service under a small
 * supervisor that applies the unit's own Restart= rules, so a change to the
 * unit (Restart=always) or to the service (a config error exiting 1, a clean
 * stop exiting non-zero) turns a test red.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { ABORTED_DRAIN_MS, DRAIN_TIMEOUT_MS } from '../../src/lifecycle'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { spawnService } from '../support/process'
import { ADMIN_TOKEN, API_KEYS, startProvider, type ProviderHandle } from '../support/server'
import { waitFor } from '../support/wait'

const ROOT = join(import.meta.dir, '..', '..')
const UNIT = readFileSync(join(ROOT, 'examples', 'deploy', 'idempotent-post.service'), 'utf8')

/** The unit's [Service] directives (the last value of a repeated one). */
function directives(unit: string): Map<string, string> {
  const found = new Map<string, string>()
  for (const line of unit.split('\n')) {
    const match = /^([A-Za-z]+)=(.*)$/.exec(line.trim())
    if (match) found.set(match[1]!, match[2]!.trim())
  }
  return found
}
const unit = directives(UNIT)

/** Whether systemd would start the process again after this exit, by the unit's Restart= and RestartPreventExitStatus=. */
function restarts(exit: { code: number | null; signal: string | null }): boolean {
  const prevented = (unit.get('RestartPreventExitStatus') ?? '').split(/\s+/).filter(Boolean)
  if (exit.code !== null && prevented.includes(String(exit.code))) return false
  // systemd's "clean" exits: code 0, or death by one of these signals (systemd.service(5), Restart=).
  const clean = exit.code === 0 || (exit.signal !== null && ['SIGHUP', 'SIGINT', 'SIGTERM', 'SIGPIPE'].includes(exit.signal))
  switch (unit.get('Restart')) {
    case 'always': return true
    case 'on-failure': return !clean
    case 'on-abnormal': return exit.signal !== null
    default: return false
  }
}

describe('the systemd unit', () => {
  test('systemd-analyze verifies it (with this checkout\'s paths)', async () => {
    const analyze = Bun.which('systemd-analyze')
    if (!analyze) {
      console.log('[supervisor] systemd-analyze not installed: the unit\'s syntax is not checked here')
      return
    }
    const dir = mkdtempSync(join(tmpdir(), 'idem-unit-'))
    const local = UNIT
      .replaceAll('/opt/idempotent-post/node_modules/.bin/bun', process.execPath)
      .replaceAll('/opt/idempotent-post', ROOT)
      .replace(/^User=.*$/m, 'User=root')
      .replace(/^EnvironmentFile=(.*)$/m, 'EnvironmentFile=-$1')
    writeFileSync(join(dir, 'idempotent-post.service'), local)
    const run = Bun.spawnSync([analyze, 'verify', join(dir, 'idempotent-post.service')], { stderr: 'pipe', stdout: 'pipe' })
    expect({ code: run.exitCode, said: run.stderr.toString().trim() }).toEqual({ code: 0, said: '' })
  })

  // Catches: a stop timeout shorter than the drain (systemd would SIGKILL requests the service is finishing).
  test('it runs Bun with its allocator keeping the memory it freed, as `npm start` does', () => {
    expect(UNIT).toMatch(/^Environment=MIMALLOC_PURGE_DELAY=-1$/m)
  })

  test('its stop timeout outlasts the drain, and the stop signal is the one that drains', () => {
    const stopSeconds = Number(unit.get('TimeoutStopSec'))
    expect(stopSeconds * 1000).toBeGreaterThanOrEqual(DRAIN_TIMEOUT_MS + ABORTED_DRAIN_MS + 2_000)
    expect(unit.get('KillSignal')).toBe('SIGTERM')
    // To the main process only, as a container runtime does: it tells its workers (WORKERS>1).
    expect(unit.get('KillMode')).toBe('mixed')
  })
})

describe('the service under the unit\'s restart rules', () => {
  let db: TestDatabase
  let provider: ProviderHandle
  beforeAll(async () => {
    db = await createTestDatabase('supervisor')
    provider = await startProvider()
  })
  afterAll(async () => {
    await provider?.stop()
    await db?.drop()
  })

  const env = () => ({ DATABASE_URL: db.url, PAYMENT_PROVIDER_URL: provider.url, API_KEYS, ADMIN_TOKEN })
  const exitOf = async (proc: { exited: Promise<number>; signalCode: NodeJS.Signals | number | null }) => {
    const code = await proc.exited
    return { code: proc.signalCode === null ? code : null, signal: proc.signalCode === null ? null : String(proc.signalCode) }
  }

  // Catches: Restart=always (a deploy's stop would be undone), or a drain that does not exit 0.
  test('a SIGTERM drains and exits 0: not restarted', async () => {
    const service = await spawnService({ env: env() })
    expect((await fetch(`${service.url}/healthz`)).status).toBe(200)
    service.proc.kill('SIGTERM')
    const exit = await exitOf(service.proc)
    expect(exit).toEqual({ code: 0, signal: null })
    expect(restarts(exit)).toBe(false)
  })

  // Catches: a restart policy that gives up on crashes, or a restart that cannot come up on what the crash left.
  test('a SIGKILL (a crash, the OOM killer) is restarted, and the restarted process serves', async () => {
    const first = await spawnService({ env: env() })
    first.proc.kill('SIGKILL')
    const exit = await exitOf(first.proc)
    expect(exit.signal).toBe('SIGKILL')
    expect(restarts(exit)).toBe(true)
    const second = await spawnService({ env: env() })
    try {
      await waitFor(async () => (await fetch(`${second.url}/readyz`)).status === 200, 'the restarted service to be ready')
    } finally {
      second.proc.kill('SIGTERM')
      await second.proc.exited
    }
  })

  // Catches: a configuration error that exits 1 (systemd would restart it five times a minute, to no end).
  test('a configuration error exits 2, which the unit does not restart', async () => {
    const proc = Bun.spawn([process.execPath, 'src/main.ts'], {
      cwd: ROOT, env: { ...process.env, ...env(), PORT: 'not-a-port' }, stdout: 'pipe', stderr: 'pipe',
    })
    const exit = await exitOf(proc)
    expect(exit).toEqual({ code: 2, signal: null })
    expect(await new Response(proc.stderr).text()).toContain('PORT')
    expect(restarts(exit)).toBe(false)
  })
})
