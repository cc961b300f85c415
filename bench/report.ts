import { ratio, type Ratio, type Throughput } from './load'
import type { timePurge, timeScrapes } from './maintenance'
import type { RoundTrips, WireCost } from './round-trips'
import type { runStorm } from './storm'
import type { StatementStats } from './pg-statements'
import type { IndexChurn, TableChange } from './table-stats'

type Condition = 'quiet' | 'busy'
type ByCondition<K extends string> = { quiet: Record<K, Throughput> } & Partial<Record<Condition, Record<K, Throughput>>>
type SlowKind = 'baseline' | 'naive' | 'fresh'
type InstantKind = SlowKind | 'replay' | 'naiveReplay'
interface LoadRange { min: number; max: number }

export interface Results {
  at: string
  machine: { nproc: number; cpu: string; postgres: string; bun: string; os: string; loadBefore: number; loadAfter: number }
  settings: Record<string, number>
  stress: { conditions: Condition[]; note: string }
  slow: { providerMs: number; connections: number } & ByCondition<SlowKind>
  slowLight: { providerMs: number; connections: number; quiet: Record<SlowKind, Throughput> } | undefined
  instant: { connections: number } & ByCondition<InstantKind>
  replayed: { payments: number; keys: number }
  provider: {
    idempotentPayments: number
    idempotentCharges: number
    paymentsSharingACharge: number
    paymentsWithoutCharge: number
    chargesWithoutPayment: number
    baselinePayments: number
    baselineCharges: number
    naivePayments: number
    naiveCharges: number
  }
  roundTrips: RoundTrips
  tables: { changes: TableChange[]; indexes: IndexChurn; loadAverage: number }
  statements: StatementStats
  /** 409s of a key another process runs (answered by the claim statement). */
  storm: Awaited<ReturnType<typeof runStorm>> & { loadAverage: LoadRange }
  /** 409s of a key the loaded service runs itself (answered from memory). */
  stormHere: Awaited<ReturnType<typeof runStorm>> & { loadAverage: LoadRange }
  scrape: (Awaited<ReturnType<typeof timeScrapes>> & { keys: number; loadAverage: number }) | undefined
  purge: (Awaited<ReturnType<typeof timePurge>> & { loadAverage: number }) | undefined
  totalSeconds: number
}

/** The targets of issue 17 ("Exactly once at the price of doing it wrong"). */
export const TARGETS = Object.freeze({
  instantFreshVsNaive: 0.8,
  slowFreshVsNaive: 0.9,
  /** Fresh p50 at most this much above the provider's own latency. */
  slowP50OverProviderMs: 40,
  /** Replays at least as fast as the naive route's. */
  replayVsNaiveReplay: 1,
  /** 409s answered at once (the target of issue 8, kept). */
  stormP99Ms: 10,
  statements: 2,
  roundTrips: 2,
  /** Under concurrency, claim statements per request below this: one statement serves several claims. */
  concurrentClaimStatements: 1,
  hotPercent: 90,
  deadIndexEntries: 0,
})

/**
 * Tables whose updates are not completions: the per-process heartbeat (one
 * row per process, every 2 s) and the settings row each process writes at
 * start. Their rows still show in the tables below; the HOT and dead-entry
 * verdicts leave them out.
 */
export const NOT_COMPLETIONS = new Set(['idempotency_processes', 'idempotency_settings'])

/** The figures of the previous BENCHMARKS.md that issue 17 says must not get worse (other machine state: read, not judged). */
export const PREVIOUS = Object.freeze({ scrapeP50Ms: 96.42, purgeRowsPerSecond: 83_954 })

const verdict = (ok: boolean) => (ok ? 'met' : '**not met**')
const n = (x: number) => (Number.isFinite(x) ? x.toLocaleString('en') : '–')
const load = (l: LoadRange | number) => (typeof l === 'number' ? `${l}` : l.min === l.max ? `${l.min}` : `${l.min}–${l.max}`)
const cpu = (t: Throughput) => `${t.cpuUs.service} / ${t.cpuUs.postgres} / ${t.cpuUs.provider} / ${t.cpuUs.loadGenerator}`
const machineUse = (t: Throughput) => `${t.machineBusyPercent}% (${t.othersCpus})`
const statuses = (t: { byStatus: Record<string, number>; errors?: number }) =>
  `${Object.entries(t.byStatus).map(([s, count]) => `${s}: ${n(count)}`).join(', ')}${t.errors ? `, errors: ${n(t.errors)}` : ''}`
const ratioText = (r: Ratio, a: Throughput, b: Throughput, unit = 'payments/s') =>
  `**${n(r.ratio)}×** (${n(a.rps)} vs ${n(b.rps)} ${unit}; rounds ${r.rounds.map(n).join(', ')})`
const CONDITION_LABEL: Record<Condition, string> = { quiet: 'quiet', busy: 'one core busy' }

export function report(r: Results): string {
  const { slow, slowLight, instant, storm, stormHere, roundTrips: rt, tables } = r
  const s = r.settings
  const busy = r.stress.conditions.includes('busy')
  const over = (t: Throughput, providerMs: number) => Math.round((t.p50Ms - providerMs) * 100) / 100
  const completions = tables.changes.filter((t) => !NOT_COMPLETIONS.has(t.table))
  const updates = completions.reduce((sum, t) => sum + t.updates, 0)
  const hot = completions.reduce((sum, t) => sum + t.hotUpdates, 0)
  const hotPercent = updates > 0 ? Math.round((hot / updates) * 1000) / 10 : Number.NaN
  const indexes = tables.indexes.ok ? tables.indexes.indexes.filter((i) => !NOT_COMPLETIONS.has(i.table)) : []
  const excess = indexes.reduce((sum, i) => sum + Math.max(0, i.excess), 0)
  const conc = rt.concurrent
  const exactlyOnce = r.provider.paymentsSharingACharge === 0 && r.provider.paymentsWithoutCharge === 0 && r.provider.chargesWithoutPayment === 0
    && r.provider.idempotentPayments === r.provider.idempotentCharges && r.replayed.payments === r.replayed.keys

  const rows: string[] = []
  const target = (figure: string, measured: string, goal: string, ok: boolean | undefined, loadAverage: LoadRange | number) =>
    rows.push(`| ${figure} | ${measured} | ${goal} | ${ok === undefined ? '' : verdict(ok)} | ${load(loadAverage)} |`)

  const iq = instant.quiet
  const sq = slow.quiet
  const instantQuiet = ratio(iq.fresh, iq.naive)
  const slowQuiet = ratio(sq.fresh, sq.naive)
  target(`instant provider, ${instant.connections} connections: fresh / naive`, ratioText(instantQuiet, iq.fresh, iq.naive), `≥ ${TARGETS.instantFreshVsNaive}×`, instantQuiet.ratio >= TARGETS.instantFreshVsNaive, instantQuiet.loadAverage)
  target(`slow provider (${slow.providerMs} ms), ${slow.connections} connections: fresh / naive`, ratioText(slowQuiet, sq.fresh, sq.naive), `≥ ${TARGETS.slowFreshVsNaive}×`, slowQuiet.ratio >= TARGETS.slowFreshVsNaive, slowQuiet.loadAverage)
  target('slow provider: fresh p50 (naive p50)', `**${sq.fresh.p50Ms} ms** (${sq.naive.p50Ms} ms): provider + ${over(sq.fresh, slow.providerMs)} ms`, `≤ provider + ${TARGETS.slowP50OverProviderMs} ms`, over(sq.fresh, slow.providerMs) <= TARGETS.slowP50OverProviderMs, sq.fresh.loadAverage)
  if (busy && instant.busy && slow.busy) {
    const ib = instant.busy
    const sb = slow.busy
    const instantBusy = ratio(ib.fresh, ib.naive)
    const slowBusy = ratio(sb.fresh, sb.naive)
    target('one core busy, instant provider: fresh / naive', ratioText(instantBusy, ib.fresh, ib.naive), `≥ quiet's ${instantQuiet.ratio}×`, instantBusy.ratio >= instantQuiet.ratio, instantBusy.loadAverage)
    target('one core busy, slow provider: fresh / naive', ratioText(slowBusy, sb.fresh, sb.naive), `≥ quiet's ${slowQuiet.ratio}×`, slowBusy.ratio >= slowQuiet.ratio, slowBusy.loadAverage)
    target('one core busy, slow provider: fresh p50 (naive p50)', `${sb.fresh.p50Ms} ms (${sb.naive.p50Ms} ms): provider + ${over(sb.fresh, slow.providerMs)} ms`, `(≤ provider + ${TARGETS.slowP50OverProviderMs} ms)`, undefined, sb.fresh.loadAverage)
  } else {
    rows.push(`| one core busy (both providers): fresh / naive | ${r.stress.note} | no worse than quiet | | |`)
  }
  for (const condition of r.stress.conditions) {
    const kinds = instant[condition]
    if (!kinds) continue
    const replays = ratio(kinds.replay, kinds.naiveReplay)
    target(`replays / naive replays, ${instant.connections} connections, ${CONDITION_LABEL[condition]}`, ratioText(replays, kinds.replay, kinds.naiveReplay, 'replays/s'), `≥ ${TARGETS.replayVsNaiveReplay}×`, replays.ratio >= TARGETS.replayVsNaiveReplay, replays.loadAverage)
  }
  for (const [whose, st] of [['another process runs', storm], ['this service runs itself', stormHere]] as const) {
    target(`409 p99, ${s.connections} retries at a time of a key ${whose} (the service's own histogram: ${st.moderate.serverWithin10Ms}% within 10 ms)`, `${st.moderate.p99Ms} ms (${n(st.moderate.rps)}/s)`, `≤ ${TARGETS.stormP99Ms} ms`, st.moderate.p99Ms <= TARGETS.stormP99Ms, st.loadAverage)
    target(`409 p99, one wave of ${s.stormConnections} at once, a key ${whose}`, `${st.singleWave.p99Ms} ms`, `≤ ${TARGETS.stormP99Ms} ms`, st.singleWave.p99Ms <= TARGETS.stormP99Ms, st.loadAverage)
  }
  target('statements per fresh request, on the wire (one at a time)', `**${rt.sequential.fresh.statements}**`, `≤ ${TARGETS.statements}`, Math.round(rt.sequential.fresh.statements) <= TARGETS.statements, rt.sequential.fresh.loadAverage)
  target('round trips per fresh request, on the wire (one at a time)', `**${rt.sequential.fresh.roundTrips}**`, `≤ ${TARGETS.roundTrips}`, Math.round(rt.sequential.fresh.roundTrips) <= TARGETS.roundTrips, rt.sequential.fresh.loadAverage)
  if (conc.fresh.claimStatements > 0)
    target(`claims under ${conc.connections} concurrent fresh requests: claim statements per request (claim round trips per request; claims per round trip)`, `**${conc.fresh.claimStatements}** (${conc.fresh.claimRoundTrips}; ${n(conc.fresh.claimsPerRoundTrip)})`, `< ${TARGETS.concurrentClaimStatements}`, conc.fresh.claimStatements < TARGETS.concurrentClaimStatements, conc.fresh.loadAverage)
  else rows.push(`| claims under ${conc.connections} concurrent fresh requests | **no statement recognised as a claim**: update \`isClaim\` in bench/round-trips.ts (the statements by text are below) | < ${TARGETS.concurrentClaimStatements} | | ${conc.fresh.loadAverage} |`)
  target(`HOT share of completion updates (${completions.map((t) => t.table).join(', ') || 'no table updated'})`, `**${Number.isNaN(hotPercent) ? '–' : `${hotPercent}%`}** (${n(hot)} of ${n(updates)})`, `≥ ${TARGETS.hotPercent}%`, hotPercent >= TARGETS.hotPercent, tables.loadAverage)
  if (tables.indexes.ok)
    target('dead index entries after the fresh rounds (entries beyond the rows each index should hold)', `**${n(excess)}** (${indexes.filter((i) => i.excess > 0).map((i) => `${i.index}: ${n(i.excess)}`).join(', ') || 'none'})`, `${TARGETS.deadIndexEntries}`, excess <= TARGETS.deadIndexEntries, tables.loadAverage)
  else rows.push(`| dead index entries after the fresh rounds | ${tables.indexes.note} | 0 | | |`)
  target('exactly once at the provider, and one payment per replayed key', exactlyOnce ? 'holds' : '**BROKEN** (see below)', 'holds', exactlyOnce, r.machine.loadAfter)
  if (r.scrape) target(`/metrics scrape, ${n(r.scrape.keys)} keys (cache off)`, `p50 ${r.scrape.p50Ms} ms, max ${r.scrape.maxMs} ms; ${r.scrape.staleKeysReported} stale keys reported (500 seeded stale, plus the bench's own in-flight keys past their TTL)`, `no worse (last BENCHMARKS.md: p50 ${PREVIOUS.scrapeP50Ms} ms)`, undefined, r.scrape.loadAverage)
  if (r.purge) target(`purge (batches of ${r.purge.batchSize})`, `${n(r.purge.rowsPerSecond)} rows/s back to back; ${n(r.purge.pacedRowsPerSecond)} rows/s with the ${r.purge.pauseMs} ms production pause (batch p50 ${r.purge.batchP50Ms} ms)`, `no worse (last BENCHMARKS.md: ${n(PREVIOUS.purgeRowsPerSecond)} rows/s)`, undefined, r.purge.loadAverage)

  // The old yardstick, for the reading: the price of idempotency over none at all.
  const info: string[] = []
  const infoRow = (figure: string, a: Throughput, b: Throughput) => {
    const x = ratio(a, b)
    info.push(`| ${figure} | ${ratioText(x, a, b)} | ${load(x.loadAverage)} |`)
  }
  for (const condition of r.stress.conditions) {
    const i = instant[condition]
    const sl = slow[condition]
    if (i) { infoRow(`instant, ${CONDITION_LABEL[condition]}: fresh / baseline`, i.fresh, i.baseline); infoRow(`instant, ${CONDITION_LABEL[condition]}: naive / baseline`, i.naive, i.baseline) }
    if (sl) { infoRow(`slow ${slow.connections}, ${CONDITION_LABEL[condition]}: fresh / baseline`, sl.fresh, sl.baseline); infoRow(`slow ${slow.connections}, ${CONDITION_LABEL[condition]}: naive / baseline`, sl.naive, sl.baseline) }
  }
  if (slowLight) {
    infoRow(`slow ${slowLight.connections} (CPU to spare): fresh / naive`, slowLight.quiet.fresh, slowLight.quiet.naive)
    infoRow(`slow ${slowLight.connections}: fresh / baseline`, slowLight.quiet.fresh, slowLight.quiet.baseline)
  }

  const kindRows: string[] = []
  const kindRow = (provider: string, condition: Condition, kind: string, t: Throughput) =>
    kindRows.push(`| ${provider} | ${CONDITION_LABEL[condition]} | ${kind} | ${n(t.rps)} | ${t.p50Ms} | ${t.p99Ms} | ${cpu(t)} | ${machineUse(t)} | ${load(t.loadAverage)} | ${statuses(t)} |`)
  for (const condition of r.stress.conditions) for (const kind of ['baseline', 'naive', 'fresh'] as const) { const t = slow[condition]?.[kind]; if (t) kindRow(`${slow.providerMs} ms, ${slow.connections} conns`, condition, kind, t) }
  if (slowLight) for (const kind of ['baseline', 'naive', 'fresh'] as const) kindRow(`${slowLight.providerMs} ms, ${slowLight.connections} conns`, 'quiet', kind, slowLight.quiet[kind])
  for (const condition of r.stress.conditions) for (const kind of ['baseline', 'naive', 'fresh', 'replay', 'naiveReplay'] as const) { const t = instant[condition]?.[kind]; if (t) kindRow(`0 ms, ${instant.connections} conns`, condition, kind === 'naiveReplay' ? 'naive replay' : kind, t) }
  for (const [whose, st] of [['run elsewhere', storm], ['run here', stormHere]] as const) {
    kindRows.push(`| | quiet | 409 (${whose}), ${s.connections} conns | ${n(st.moderate.rps)} | ${st.moderate.p50Ms} | ${st.moderate.p99Ms} | ${st.moderate.cpuUs.service} / ${st.moderate.cpuUs.postgres} / 0 / ${st.moderate.cpuUs.loadGenerator} | ${st.moderate.machineBusyPercent}% | ${load(st.loadAverage)} | ${statuses(st.moderate)} |`)
    kindRows.push(`| | quiet | 409 (${whose}), ${s.stormConnections} conns × ${s.stormWaves} | ${n(st.sustained.rps)} | ${st.sustained.p50Ms} | ${st.sustained.p99Ms} | | | ${load(st.loadAverage)} | ${statuses(st.sustained)} |`)
    kindRows.push(`| | quiet | 409 (${whose}), one wave of ${s.stormConnections} | | ${st.singleWave.p50Ms} | ${st.singleWave.p99Ms} | | | ${load(st.loadAverage)} | ${statuses(st.singleWave)} |`)
  }

  const wire = (name: string, w: WireCost) => `| ${name} | ${w.statements} | ${w.roundTrips} | ${w.transactions} | ${w.writingTransactions} | ${w.commits} | ${w.claimStatements} | ${w.claimRoundTrips} | ${w.loadAverage} |`
  const texts = (a: WireCost, b: WireCost) => {
    const all = new Map<string, { a?: { statements: number; roundTrips: number }; b?: { statements: number; roundTrips: number } }>()
    for (const t of a.byText) all.set(t.text, { ...all.get(t.text), a: t })
    for (const t of b.byText) all.set(t.text, { ...all.get(t.text), b: t })
    return [...all].map(([text, { a: x, b: y }]) => `| \`${shorten(text)}\` | ${x?.statements ?? 0} | ${x?.roundTrips ?? 0} | ${y?.statements ?? 0} | ${y?.roundTrips ?? 0} |`)
  }

  const lines = [
    `## Results (${r.at.slice(0, 16)}Z, run took ${r.totalSeconds} s)`,
    '',
    `Machine: ${r.machine.nproc} CPU (${r.machine.cpu}), PostgreSQL ${r.machine.postgres}, Bun ${r.machine.bun}, ${r.machine.os}; load generator, service, provider simulators and database on the same machine; 1-minute load average **${r.machine.loadBefore} before** the run, **${r.machine.loadAfter} after**. One core busy: ${r.stress.note}.`,
    '',
    'Ratios are of rounds run in this run, interleaved; "rounds" lists each round\'s own ratio. The last column is the 1-minute load average (os.loadavg) over the rounds behind the figure, lowest–highest: the bench alone makes about 2 to 3 of it.',
    '',
    '### Targets of issue 17',
    '',
    '| figure | measured | target | | load average |',
    '| --- | --- | --- | --- | --- |',
    ...rows,
    '',
    'Against no idempotency at all (the non-idempotent baseline route), for the reading:',
    '',
    '| figure | measured | load average |',
    '| --- | --- | --- |',
    ...info,
    '',
    `Exactly once under load: after ${n(iq.replay.requests)} replays, ${n(r.replayed.keys)} keys have ${n(r.replayed.payments)} payments${r.replayed.payments === r.replayed.keys ? ' (one each)' : ' (**DUPLICATES**)'}.`,
    `Exactly once at the provider: ${n(r.provider.idempotentPayments)} idempotent payments, ${n(r.provider.idempotentCharges)} charges under our downstream keys in the simulators' ledgers; payments sharing a charge: ${r.provider.paymentsSharingACharge}, payments whose charge is missing: ${r.provider.paymentsWithoutCharge}, charges without a payment: ${r.provider.chargesWithoutPayment} (baseline: ${n(r.provider.baselinePayments)} payments, ${n(r.provider.baselineCharges)} charges; naive: ${n(r.provider.naivePayments)} payments, ${n(r.provider.naiveCharges)} charges).`,
    '',
    `Every kind, rounds summed (${s.rounds} rounds each, alternating order). CPU per answer in µs, from /proc: service / its PostgreSQL backends / provider simulator / load generator. Machine busy: share of both CPUs' time in use while the kind ran, and in brackets how many CPUs' worth of that was other processes (stress-ng, other engineers' tests, PostgreSQL's shared background work):`,
    '',
    '| provider | machine | kind | req/s | p50 ms | p99 ms | CPU µs per answer | machine busy | load average | answers |',
    '| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |',
    ...kindRows,
    '',
    `Database statements, round trips and transactions per request, counted on the wire (${rt.sequential.fresh.requests} requests one at a time, then ${n(conc.fresh.requests)} at ${conc.connections} at a time; a fraction such as .01 is the process's own background work, its heartbeat, spread over the requests). A writing transaction is one with a statement whose text mentions INSERT, UPDATE or DELETE, a WAL flush at its commit; by text only, so a replay's or a 409's claim counts though it inserts nothing.`,
    '',
    '| request | statements | round trips | transactions | writing transactions | COMMITs | claim statements | claim round trips | load average |',
    '| --- | --- | --- | --- | --- | --- | --- | --- | --- |',
    wire('fresh', rt.sequential.fresh),
    wire('replay', rt.sequential.replay),
    wire('409', rt.sequential.inProgress),
    wire('naive', rt.sequential.naive),
    wire('naive replay', rt.sequential.naiveReplay),
    wire('baseline', rt.sequential.baseline),
    wire(`fresh, ${conc.connections} at a time`, conc.fresh),
    wire(`naive, ${conc.connections} at a time`, conc.naive),
    '',
    `Under ${conc.connections} concurrent fresh requests, ${n(conc.fresh.claimsPerRoundTrip)} claims per claim round trip. postgres.js pipelines queries queued on a busy connection, so round trips fall below statements even without batching; a batched claim shows as fewer claim statements than requests.`,
    '',
    'A fresh request\'s statements by text, per request:',
    '',
    `| statement | one at a time | round trips | ${conc.connections} at a time | round trips |`,
    '| --- | --- | --- | --- | --- |',
    ...texts(rt.sequential.fresh, conc.fresh),
    '',
    `What the fresh payments did to the tables (pg_stat_user_tables, from the slow warm-up to the last instant round, both conditions, all three routes: only the idempotent one updates; load average ${tables.loadAverage} when read). Every table with updates:`,
    '',
    '| table | updates | HOT updates | HOT | inserts | deletes | dead rows now | vacuums in between |',
    '| --- | --- | --- | --- | --- | --- | --- | --- |',
    ...tables.changes.map((t) => `| ${t.table}${NOT_COMPLETIONS.has(t.table) ? ' (not completions)' : ''} | ${n(t.updates)} | ${n(t.hotUpdates)} | ${Number.isNaN(t.hotPercent) ? '–' : `${t.hotPercent}%`} | ${n(t.inserts)} | ${n(t.deletes)} | ${n(t.deadRows)} | ${t.vacuums} |`),
    '',
    ...(tables.indexes.ok
      ? [
          'Their btree indexes, right after (pageinspect: heap pointers in the leaf pages, against the rows the index should point to now):',
          '',
          '| index | predicate | entries | rows it should hold | dead entries | of which marked dead | pages |',
          '| --- | --- | --- | --- | --- | --- | --- |',
          ...tables.indexes.indexes.map((i) => `| ${i.index} | ${i.predicate ? `\`${i.predicate}\`` : ''} | ${n(i.entries)} | ${n(i.liveRows)} | ${n(i.excess)} | ${n(i.markedDead)} | ${n(i.pages)} |`),
        ]
      : [`Indexes: ${tables.indexes.note}.`]),
    '',
    ...(r.statements.ok
      ? [
          'PostgreSQL\'s side of the instant rounds (all five kinds, both conditions), from pg_stat_statements, the statements that took the most execution time:',
          '',
          '| statement | calls | mean ms | share of time | rows per call | WAL bytes per call | blocks per call |',
          '| --- | --- | --- | --- | --- | --- | --- |',
          ...r.statements.statements.map((st) => `| \`${shorten(st.query)}\` | ${n(st.calls)} | ${st.meanMs} | ${st.percent}% | ${st.rowsPerCall} | ${n(st.walBytesPerCall)} | ${st.blocksPerCall} |`),
        ]
      : [`Statements: ${r.statements.note}.`]),
  ]
  return lines.join('\n')
}

function shorten(text: string): string {
  const clean = text.replaceAll('|', '\\|').replaceAll('`', "'")
  return clean.length > 120 ? `${clean.slice(0, 117)}...` : clean
}
