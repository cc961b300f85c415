/** The day-of-traffic bench's figures (bench/day-of-traffic.ts) as Markdown, against issue 40's targets. */
import type { FreezeResult, FreezeWindow, RoundResult } from './day-rounds'
import type { PurgePlan } from './day-purge-plan'
import type { DaySeed } from './day-seed'
import type { KeyBytes } from './key-bytes'
import { round2 } from './load'
import { PURGE_SHARE } from '../src/maintenance/retention-purge'
import { median } from './versus-naive'

export interface DayResults {
  at: string
  machine: { nproc: number; cpu: string; postgres: string; bun: string; loadBefore: number; loadAfter: number; roundLoads: number[]; freezeLoad: number }
  settings: { keys: number; expiredShare: number; rounds: number; seconds: number; warmupSeconds: number; connections: number; calibrate: number; tool: string; retentionSeconds: number; processing: number }
  /** Bytes per key after the calibration payments alone (bench/key-bytes.ts's measure). */
  inUse: KeyBytes
  seed: DaySeed
  /** Bytes per key on the seeded table. */
  seeded: KeyBytes
  rounds: Record<'large' | 'empty' | 'purge', RoundResult[]>
  /** The purge's statement on the seeded table, idle. */
  purge: PurgePlan
  /** Each VACUUM that froze the key table, in the order run (--freeze-as); none with --skip-freeze without --previous. */
  freezes: FreezeResult[]
  /** Runs before --freeze-as: their one manual VACUUM (FREEZE), or null. */
  freeze?: FreezeResult | null
  totalSeconds: number
}

/** Issue 40's targets for a day of traffic on one node. */
export const DAY_TARGETS = Object.freeze({
  /** Fresh payments/s on the seeded table against an empty one. */
  largeVsEmpty: 0.9,
  /** Keys the purge clears per key that arrives, serving at full speed. */
  purgeVsIngest: 5,
  /** p99 with the purge running against without, at most. */
  purgeP99: 1.2,
})

export interface DaySummary {
  readonly largeVsEmpty: number
  readonly perRoundRatio: readonly number[]
  readonly seqScans: number
  readonly purgeVsIngest: number
  readonly perRoundPurge: readonly number[]
  readonly purgeP99: number
  /** Per VACUUM run (DayResults.freezes): the median p99 of its windows over the window before. */
  readonly freezeP99: readonly number[]
  readonly exactlyOnce: { readonly rounds: number; readonly held: number; readonly payments: number; readonly charges: number }
}

/** A run's freezes, also from a run written before --freeze-as (its one `freeze`). */
export const freezesOf = (r: DayResults): FreezeResult[] => r.freezes ?? (r.freeze ? [r.freeze] : [])

export function summarize(r: DayResults): DaySummary {
  const { large, empty, purge } = r.rounds
  const freezes = freezesOf(r)
  const rps = (rounds: RoundResult[]) => median(rounds.map((x) => x.load.rps))
  const p99 = (rounds: RoundResult[]) => median(rounds.map((x) => x.load.p99))
  const all: { exactlyOnce: RoundResult['exactlyOnce'] }[] = [...large, ...empty, ...purge, ...freezes]
  return {
    largeVsEmpty: round2(rps(large) / rps(empty)),
    perRoundRatio: large.map((x, i) => round2(x.load.rps / (empty[i]?.load.rps ?? Number.NaN))),
    seqScans: [...large, ...purge].reduce((sum, x) => sum + x.seqScans, 0),
    purgeVsIngest: round2(median(purge.map((x) => x.purgedPerSecond / x.load.rps))),
    perRoundPurge: purge.map((x) => round2(x.purgedPerSecond / x.load.rps)),
    purgeP99: round2(p99(purge) / p99(large)),
    freezeP99: freezes.map((f) => round2(median(f.during.map((w) => w.p99)) / f.before.p99)),
    exactlyOnce: {
      rounds: all.length,
      held: all.filter((x) => x.exactlyOnce.ok).length,
      payments: all.reduce((sum, x) => sum + x.exactlyOnce.payments, 0),
      charges: all.reduce((sum, x) => sum + x.exactlyOnce.charges, 0),
    },
  }
}

const n = (x: number) => (Number.isFinite(x) ? Math.round(x).toLocaleString('en') : '–')
const verdict = (ok: boolean) => (ok ? 'met' : '**not met**')

/** A window's vacuum phases and checkpoint, as a note after its p99: ` (scanning heap; checkpoint)`. */
const windowNote = (w: FreezeWindow | undefined) => {
  const parts = [...(w?.phases ?? []), ...(w?.checkpoint ? ['checkpoint'] : [])]
  return parts.length > 0 ? ` (${parts.join('; ')})` : ''
}

export function dayReport(r: DayResults): string {
  const s = summarize(r)
  const { large, empty, purge } = r.rounds
  const med = (rounds: RoundResult[], pick: (x: RoundResult) => number) => round2(median(rounds.map(pick)))
  const freezes = freezesOf(r)
  const vacuumOf = (f: FreezeResult) => (f.as ?? 'manual') === 'manual'
    ? 'one VACUUM (FREEZE) of idempotency_keys under load (manual: unthrottled, every row frozen)'
    : 'one aggressive VACUUM of idempotency_keys under load, as anti-wraparound autovacuum runs it (2 ms cost delay, rows younger than 50 M transactions left unfrozen)'
  const bytes = (k: KeyBytes) => `${n(k.perKey)} B (heap ${n(k.heap / k.done)}, TOAST ${n(k.toast / k.done)}, indexes ${n(k.indexes / k.done)}, maps ${n(k.maps / k.done)}, processing list ${n(k.processing / k.done)}, answers ${n((k.answers ?? 0) / k.done)}; ${k.rowsPerPage.toFixed(1)} rows per page of ${n(k.avgRow)} B)`
  const row = (cell: string, rounds: RoundResult[]) => rounds.map((x, i) =>
    `| ${i + 1} | ${cell} | ${n(x.load.rps)} | ${x.load.p50} | ${x.load.p99} | ${x.seqScans} | ${cell === 'purge' ? `${n(x.purgedPerSecond)} (${x.expiredLeft === 0 ? "none left: the backlog ran out, a floor" : `${n(x.expiredLeft)} left`})` : ''} | ${x.exactlyOnce.ok ? 'holds' : '**BROKEN**'} (${n(x.exactlyOnce.payments)} / ${n(x.exactlyOnce.charges)}) |`)
  return [
    `## A day of traffic on one node (${r.at.slice(0, 16)}Z, run took ${r.totalSeconds} s)`,
    '',
    `Machine: ${r.machine.nproc} CPU (${r.machine.cpu}), PostgreSQL ${r.machine.postgres} (DATABASE_URL's server), Bun ${r.machine.bun}; the load (${r.settings.tool}), the service, the provider simulator and the database on the same machine. 1-minute load average ${r.machine.loadBefore} before the run, ${r.machine.roundLoads.join(', ')} at the start of each round, ${r.machine.freezeLoad} before the VACUUM, ${r.machine.loadAfter} after.`,
    '',
    `Table: ${n(r.seeded.keys)} keys (${n(r.seed.pastRetention)} past the ${r.settings.retentionSeconds / 3600} h retention, ${n(r.seed.processing)} processing), seeded in **${round2(r.seed.seconds)} s** (${n((r.seed.done + r.seed.processing) / r.seed.seconds)} keys/s; heap packed at fillfactor ${r.seed.fillfactor}, as densely as the service's own ${n(r.settings.calibrate)} payments left their pages), then VACUUM (ANALYZE) ${round2(r.seed.vacuumSeconds)} s.`,
    '',
    `Rounds: ${r.settings.rounds}, interleaved (odd rounds large, empty, purge; even rounds reversed), each a freshly started service, ${r.settings.warmupSeconds} s of warm-up then ${r.settings.seconds} s measured at ${r.settings.connections} connections, fresh keys, instant provider.`,
    '',
    '| figure | measured | target | |',
    '| --- | --- | --- | --- |',
    `| bytes per completed key after ${n(r.settings.calibrate)} payments, 32 at a time | ${bytes(r.inUse)} | (read) | |`,
    `| bytes per completed key at ${n(r.seeded.keys)} keys | ${bytes(r.seeded)} | (read) | |`,
    empty.length === 0
      ? `| fresh payments/s, seeded table / empty table | (no empty rounds: \`--cells\`) | ≥ ${DAY_TARGETS.largeVsEmpty}× | |`
      : `| fresh payments/s, seeded table / empty table | **${s.largeVsEmpty}×** (${n(med(large, (x) => x.load.rps))} vs ${n(med(empty, (x) => x.load.rps))}; rounds ${s.perRoundRatio.join(', ')}) | ≥ ${DAY_TARGETS.largeVsEmpty}× | ${verdict(s.largeVsEmpty >= DAY_TARGETS.largeVsEmpty)} |`,
    `| sequential scans of idempotency_keys, rounds on the seeded table | **${s.seqScans}** | 0 | ${verdict(s.seqScans === 0)} |`,
    `| purge rate / ingest rate, serving at full speed | **${s.purgeVsIngest}×** (${n(med(purge, (x) => x.purgedPerSecond))} keys/s purged, ${n(med(purge, (x) => x.load.rps))} payments/s; rounds ${s.perRoundPurge.join(', ')}) | ≥ ${DAY_TARGETS.purgeVsIngest}× | ${verdict(s.purgeVsIngest >= DAY_TARGETS.purgeVsIngest)} |`,
    `| the purge's batch of ${r.purge.batchSize} on the seeded table, idle; under load (from its rate: a batch is ${PURGE_SHARE * 100} % of its cycle, the rest its pause) | p50 ${r.purge.batchP50Ms} ms, max ${r.purge.batchMaxMs} ms: at most ${n(r.purge.pacedCeiling)} keys/s paced; under load ${purge.map((x) => x.purged > 0 ? `${round2((1000 * r.purge.batchSize * PURGE_SHARE) / x.purgedPerSecond)} ms` : '–').join(', ')} | (read) | |`,
    `| p99 with the purge / without (seeded table) | **${s.purgeP99}×** (${med(purge, (x) => x.load.p99)} vs ${med(large, (x) => x.load.p99)} ms) | ≤ ${DAY_TARGETS.purgeP99}× | ${verdict(s.purgeP99 <= DAY_TARGETS.purgeP99)} |`,
    ...(freezes.length === 0
      ? ['| one VACUUM (FREEZE) of idempotency_keys under load | not run (`--skip-freeze`) | (read) | |']
      : freezes.map((f, i) => `| ${vacuumOf(f)} | **${f.vacuumSeconds} s**; p99 ${f.before.p99} ms before, ${f.during.map((w, j) => `${w.p99}${windowNote(f.windows?.[j])}`).join(', ')} ms during (median ${s.freezeP99[i]}×); ${n(f.before.rps)} then ${f.during.map((w) => n(w.rps)).join(', ')} payments/s; age(relfrozenxid) ${n(f.frozenXidAge.before)} → ${n(f.frozenXidAge.after)} | (read) | |`)),
    `| exactly once, every round: payments = charges for the round's keys | ${s.exactlyOnce.held === s.exactlyOnce.rounds ? 'holds' : '**BROKEN**'} in ${s.exactlyOnce.held} of ${s.exactlyOnce.rounds} (${n(s.exactlyOnce.payments)} payments, ${n(s.exactlyOnce.charges)} charges) | holds | ${verdict(s.exactlyOnce.held === s.exactlyOnce.rounds)} |`,
    '',
    '| round | table | payments/s | p50 ms | p99 ms | seq scans | purged keys/s | exactly once (payments / charges) |',
    '| --- | --- | --- | --- | --- | --- | --- | --- |',
    ...row('large', large), ...row('empty', empty), ...row('purge', purge),
    ...(r.purge.plan ? ['', 'One batch of the purge on the seeded table (auto_explain, idle):', '', '```', r.purge.plan.trim(), '```'] : []),
  ].join('\n')
}

