/**
 * The day-of-traffic bench (bench/day-of-traffic.ts, `npm run bench:day`) in
 * its quick mode: 20,000 keys, one round of each cell, autocannon as the load
 * (wrk is for the bench machine only). What the 10 M-key run writes down
 * must be there: the seed as asked (its share past retention), bytes per key,
 * each round's figures, the purge deleting the backlog, the VACUUM (FREEZE)
 * windows (an aggressive, throttled VACUUM as autovacuum runs it, then a
 * manual one), and exactly once in every round: the round's payments are its
 * charges at the provider.
 */
import { expect, test } from 'bun:test'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { DayResults } from '../../bench/day-report'

const KEYS = 20_000
const EXPIRED = 0.1

/** One quick run of the bench with `args` added; its printed report and its JSON. */
async function runDay(dir: string, args: readonly string[]): Promise<{ out: string; r: DayResults }> {
  const json = join(dir, 'day.json')
  const proc = Bun.spawn([process.execPath, 'bench/day-of-traffic.ts', '--keys', String(KEYS), '--expired', String(EXPIRED), '--rounds', '1',
    '--seconds', '1', '--warmup', '0', '--calibrate', '200', '--load', 'autocannon', '--json', json, ...args], {
    cwd: join(import.meta.dir, '..', '..'), stdout: 'pipe', stderr: 'pipe', env: process.env,
  })
  const [out, err, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited])
  if (code !== 0) throw new Error(`bench:day exited with ${code}:\n${err.slice(-3000)}`)
  return { out, r: JSON.parse(readFileSync(json, 'utf8')) as DayResults }
}

test('the quick mode seeds, measures every cell and counts exactly once in every round', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'idem-day-'))
  try {
    const { out, r } = await runDay(dir, ['--freeze-as', 'autovacuum,manual'])

    expect(out).toContain('## A day of traffic on one node')
    expect(out).toContain('| fresh payments/s, seeded table / empty table |')
    expect(r.seeded.keys).toBe(KEYS)
    expect(r.seed.pastRetention).toBe(KEYS * EXPIRED)
    expect(r.seeded.perKey).toBeGreaterThan(0)
    expect(r.inUse.done).toBe(200)
    for (const cell of ['large', 'empty', 'purge'] as const) {
      expect(r.rounds[cell]).toHaveLength(1)
      const [round] = r.rounds[cell]
      expect(round!.load.requests).toBeGreaterThan(0)
      expect(round!.seqScans).toBeGreaterThanOrEqual(0)
      expect(round!.exactlyOnce.payments).toBeGreaterThan(0)
      expect(round!.exactlyOnce.payments).toBe(round!.exactlyOnce.charges)
      expect(round!.exactlyOnce.ok).toBe(true)
    }
    // The service's own purge ran in the purge round and cleared the backlog; without it, nothing was deleted.
    expect(r.rounds.large[0]!.purged).toBe(0)
    expect(r.rounds.purge[0]!.expiredLeft).toBeLessThan(r.seed.pastRetention)
    // Both ways of freezing, in the order asked, on the one seeded table; only the manual one freezes young rows.
    expect(r.freezes.map((f) => f.as)).toEqual(['autovacuum', 'manual'])
    for (const freeze of r.freezes) {
      expect(freeze.during.length).toBeGreaterThanOrEqual(1)
      expect(freeze.vacuumSeconds).toBeGreaterThan(0)
      expect(freeze.exactlyOnce.ok).toBe(true)
      expect(freeze.exactlyOnce.payments).toBe(freeze.exactlyOnce.charges)
      expect(freeze.windows).toHaveLength(freeze.during.length)
    }
    // The throttled one left the young rows unfrozen (the table's oldest transaction only got older); the manual one froze them.
    const [throttled, manual] = r.freezes
    expect(throttled!.frozenXidAge.after).toBeGreaterThanOrEqual(throttled!.frozenXidAge.before)
    expect(manual!.frozenXidAge.after).toBeLessThan(manual!.frozenXidAge.before)
    expect(out).toContain('| one aggressive VACUUM of idempotency_keys under load, as anti-wraparound autovacuum runs it')
    expect(out).toContain('| one VACUUM (FREEZE) of idempotency_keys under load (manual')
    expect(r.purge.batchP50Ms).toBeGreaterThan(0)
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}, 60_000)

test('--skip-freeze without an earlier run skips the VACUUM (FREEZE) and says so', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'idem-day-'))
  try {
    const { out, r } = await runDay(dir, ['--cells', 'large', '--skip-freeze'])
    expect(r.freezes).toEqual([])
    expect(out).toContain('| one VACUUM (FREEZE) of idempotency_keys under load | not run (`--skip-freeze`) |')
    expect(r.rounds.large[0]!.exactlyOnce.ok).toBe(true)
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}, 60_000)

test('--key-form new seeds keys of the new form with their answers, and the purge clears their backlog', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'idem-day-'))
  try {
    const { r } = await runDay(dir, ['--cells', 'purge', '--skip-freeze', '--key-form', 'new'])
    expect(r.seeded.keys).toBe(KEYS)
    // Every completed key's answer is a row of idempotency_answers (the key table's rows carry none).
    expect(r.seeded.done).toBe(KEYS - r.seed.processing)
    expect(r.seeded.answers).toBeGreaterThan(0)
    expect(r.seeded.upd).toBe(0)
    expect(r.seed.pastRetention).toBe(KEYS * EXPIRED)
    expect(r.rounds.purge[0]!.expiredLeft).toBeLessThan(r.seed.pastRetention)
    expect(r.rounds.purge[0]!.exactlyOnce.ok).toBe(true)
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}, 60_000)
