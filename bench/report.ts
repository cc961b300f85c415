import type { timePurge, timeScrapes } from './maintenance'
import type { StatementRow } from './pg-statements'
import type { RoundTrips, WireCost } from './round-trips'
import type { runStorm } from './storm'
import type { Kind, Side } from './versus-naive'

interface LoadRange { min: number; max: number }

/** One measured configuration of bench/run.ts: one process, one kind of request, one provider, one machine condition. */
export interface Cell {
  readonly name: string
  readonly side: Side
  readonly kind: Kind
  readonly provider: 'instant' | 'slow'
  readonly connections: number
  readonly condition: 'quiet' | 'busy'
  readonly table: 'empty' | 'large'
}

/** A cell's rounds: medians, and each round's throughput. */
export interface CellResult {
  readonly cell: Cell
  readonly rounds: readonly number[]
  readonly rps: number
  readonly p50: number
  readonly p99: number
  /** CPU per answer, µs: the process, PostgreSQL, the provider, wrk. */
  readonly cpuUs: { readonly process: number; readonly postgres: number; readonly provider: number; readonly wrk: number }
  readonly busyPercent: number
  readonly othersPercent: number
  readonly hotPercent: number | undefined
  readonly exactlyOnce: { readonly rounds: number; readonly held: number; readonly payments: number; readonly charges: number }
  /** pg_stat_statements of the median round, when loaded. */
  readonly statements: readonly StatementRow[] | undefined
  /** Answers of the median round. */
  readonly requests: number
}

export interface Results {
  at: string
  machine: { nproc: number; cpu: string; postgres: string; privateCluster: boolean; bun: string; os: string; loadBefore: number; loadAfter: number }
  settings: Record<string, number>
  stressNote: string
  versus: CellResult[]
  roundTrips: RoundTrips
  /** 409s of a key another process runs (answered by the claim statement). */
  storm: Awaited<ReturnType<typeof runStorm>> & { loadAverage: LoadRange }
  /** 409s of a key the loaded service runs itself (answered from memory). */
  stormHere: Awaited<ReturnType<typeof runStorm>> & { loadAverage: LoadRange }
  scrape: (Awaited<ReturnType<typeof timeScrapes>> & { keys: number; loadAverage: number }) | undefined
  purge: (Awaited<ReturnType<typeof timePurge>> & { loadAverage: number }) | undefined
  totalSeconds: number
}

/** The targets of issue 25 ("Exactly once faster than doing it wrong"). */
export const TARGETS = Object.freeze({
  instantFreshVsNaive: 0.9,
  instantFreshStretch: 1.0,
  slowFreshVsNaive: 0.95,
  /** Fresh p50 at most this much above the provider's own latency. */
  slowP50OverProviderMs: 25,
  busySlowFreshVsNaive: 0.9,
  replayVsNaiveReplay: 1.5,
  /** 409s answered at once. */
  stormP99Ms: 10,
  /** Fresh payments on 1M keys against an empty table. */
  largeVsEmpty: 0.9,
  statements: 2,
  roundTrips: 2,
  concurrentClaimStatements: 1,
  hotPercent: 90,
})

const verdict = (ok: boolean) => (ok ? 'met' : '**not met**')
const n = (x: number) => (Number.isFinite(x) ? x.toLocaleString('en') : '–')
const load = (l: LoadRange | number) => (typeof l === 'number' ? `${l}` : l.min === l.max ? `${l.min}` : `${l.min}–${l.max}`)
const round2 = (x: number) => Math.round(x * 100) / 100

export function report(r: Results): string {
  const { storm, stormHere, roundTrips: rt } = r
  const s = r.settings
  const cell = (name: string) => r.versus.find((c) => c.cell.name === name)
  const rows: string[] = []
  const target = (figure: string, measured: string, goal: string, ok: boolean | undefined) =>
    rows.push(`| ${figure} | ${measured} | ${goal} | ${ok === undefined ? '' : verdict(ok)} |`)
  /** The ratio of two cells' medians, and each round's own ratio (rounds ran interleaved: round i of both). */
  const versus = (figure: string, a: CellResult | undefined, b: CellResult | undefined, goal: number, unit = 'payments/s', stretch?: number) => {
    if (!a || !b) return
    const x = round2(a.rps / b.rps)
    const perRound = a.rounds.map((v, i) => round2(v / (b.rounds[i] ?? Number.NaN)))
    target(figure, `**${x}×** (${n(a.rps)} vs ${n(b.rps)} ${unit}; rounds ${perRound.join(', ')})`, `≥ ${goal}×${stretch ? ` (stretch ${stretch}×)` : ''}`, x >= goal)
  }

  const instantFresh = cell('instant fresh')
  const instantNaive = cell('instant fresh, naive')
  versus(`instant provider, ${s.connections} connections: fresh / naive`, instantFresh, instantNaive, TARGETS.instantFreshVsNaive, 'payments/s', TARGETS.instantFreshStretch)
  const slowFresh = cell('slow fresh')
  versus(`${s.slowProviderMs} ms provider, ${s.slowConnections} connections: fresh / naive`, slowFresh, cell('slow fresh, naive'), TARGETS.slowFreshVsNaive)
  if (slowFresh) {
    const over = round2(slowFresh.p50 - s.slowProviderMs!)
    target(`${s.slowProviderMs} ms provider: fresh p50 (naive p50)`, `**${slowFresh.p50} ms** (${cell('slow fresh, naive')?.p50 ?? '–'} ms): provider + ${over} ms`, `≤ provider + ${TARGETS.slowP50OverProviderMs} ms`, over <= TARGETS.slowP50OverProviderMs)
  }
  if (cell('slow fresh, busy')) versus(`${s.slowProviderMs} ms provider, one core busy: fresh / naive`, cell('slow fresh, busy'), cell('slow fresh, naive, busy'), TARGETS.busySlowFreshVsNaive)
  else rows.push(`| one core busy | ${r.stressNote} | ≥ ${TARGETS.busySlowFreshVsNaive}× | |`)
  versus(`replays / naive replays, ${s.connections} connections`, cell('instant replay'), cell('instant replay, naive'), TARGETS.replayVsNaiveReplay, 'replays/s')
  versus('fresh on a table of 1,000,000 keys / fresh on an empty one', cell('instant fresh, 1M keys'), instantFresh, TARGETS.largeVsEmpty)
  if (instantFresh && instantNaive)
    target('PostgreSQL CPU per fresh payment, instant provider (all of its processes)', `**${instantFresh.cpuUs.postgres} µs** (naive: ${instantNaive.cpuUs.postgres} µs)`, '≤ the naive app\'s', instantFresh.cpuUs.postgres <= instantNaive.cpuUs.postgres)
  if (instantFresh && instantNaive)
    target('the process\'s CPU per fresh payment, instant provider', `${instantFresh.cpuUs.process} µs (naive: ${instantNaive.cpuUs.process} µs)`, '(read)', undefined)
  for (const [whose, st] of [['another process runs', storm], ['this service runs itself', stormHere]] as const) {
    target(`409 p99, ${s.connections} retries at a time of a key ${whose} (the service's own histogram: ${st.moderate.serverWithin10Ms}% within 10 ms)`, `${st.moderate.p99Ms} ms (${n(st.moderate.rps)}/s)`, `≤ ${TARGETS.stormP99Ms} ms`, st.moderate.p99Ms <= TARGETS.stormP99Ms)
    target(`409 p99, one wave of ${s.stormConnections} at once, a key ${whose} (300 new connections at once: their accept queue is in it)`, `${st.singleWave.p99Ms} ms`, '(read)', undefined)
  }
  const services = r.versus.filter((c) => c.cell.side === 'service')
  const held = services.every((c) => c.exactlyOnce.held === c.exactlyOnce.rounds)
  const payments = services.reduce((sum, c) => sum + c.exactlyOnce.payments, 0)
  const charges = services.reduce((sum, c) => sum + c.exactlyOnce.charges, 0)
  target('exactly once, every service round: each payment has its own charge in the provider\'s ledger, and nothing else was charged', `${held ? 'holds' : '**BROKEN**'} (${n(payments)} payments, ${n(charges)} charges)`, 'holds', held)
  target('statements per fresh request, on the wire (one at a time)', `**${rt.sequential.fresh.statements}**`, `≤ ${TARGETS.statements}`, Math.round(rt.sequential.fresh.statements) <= TARGETS.statements)
  target('round trips per fresh request, on the wire (one at a time)', `**${rt.sequential.fresh.roundTrips}**`, `≤ ${TARGETS.roundTrips}`, Math.round(rt.sequential.fresh.roundTrips) <= TARGETS.roundTrips)
  const conc = rt.concurrent
  target(`claim statements per request under ${conc.connections} concurrent fresh requests (claims per claim round trip)`, `**${conc.fresh.claimStatements}** (${n(conc.fresh.claimsPerRoundTrip)})`, `< ${TARGETS.concurrentClaimStatements}`, conc.fresh.claimStatements < TARGETS.concurrentClaimStatements)
  if (instantFresh?.hotPercent !== undefined)
    target('HOT share of the key table\'s updates, instant fresh rounds', `**${instantFresh.hotPercent}%**`, `≥ ${TARGETS.hotPercent}%`, instantFresh.hotPercent >= TARGETS.hotPercent)
  if (r.scrape) target(`/metrics scrape, ${n(r.scrape.keys)} keys (cache off)`, `p50 ${r.scrape.p50Ms} ms, max ${r.scrape.maxMs} ms; ${r.scrape.staleKeysReported} stale keys reported (500 seeded stale)`, '(read)', undefined)
  if (r.purge) target(`purge (batches of ${r.purge.batchSize})`, `${n(r.purge.rowsPerSecond)} rows/s back to back; ${n(r.purge.pacedRowsPerSecond)} rows/s with the production pause after a median batch, ${r.purge.pauseMs} ms (batch p50 ${r.purge.batchP50Ms} ms)`, '(read)', undefined)

  const cellRows = r.versus.map((c) => `| ${c.cell.name} | ${c.cell.connections} | ${n(c.rps)} | ${c.rounds.map(n).join(', ')} | ${c.p50} | ${c.p99} | ${c.cpuUs.process} / ${c.cpuUs.postgres} / ${c.cpuUs.provider} / ${c.cpuUs.wrk} | ${c.busyPercent}% (${c.othersPercent}%) | ${c.cell.side === 'service' ? `${c.exactlyOnce.held}/${c.exactlyOnce.rounds}` : `(${n(c.exactlyOnce.payments)} payments, ${n(c.exactlyOnce.charges)} charges)`} |`)

  const statementRows = (c: CellResult | undefined) => {
    if (!c?.statements) return ['(pg_stat_statements not loaded)']
    const payments = c.requests
    return [
      '| statement | calls | calls per answer | mean ms | µs per answer | WAL bytes per call |',
      '| --- | --- | --- | --- | --- | --- |',
      ...c.statements.filter((st) => st.calls >= 10).map((st) => `| \`${shorten(st.query)}\` | ${n(st.calls)} | ${round2(st.calls / payments)} | ${st.meanMs} | ${round2((st.totalMs * 1000) / payments)} | ${n(st.walBytesPerCall)} |`),
    ]
  }

  const wire = (name: string, w: WireCost) => `| ${name} | ${w.statements} | ${w.roundTrips} | ${w.transactions} | ${w.writingTransactions} | ${w.commits} | ${w.claimStatements} | ${w.claimRoundTrips} |`

  return [
    `## Results (${r.at.slice(0, 16)}Z, run took ${r.totalSeconds} s)`,
    '',
    `Machine: ${r.machine.nproc} CPU (${r.machine.cpu}), PostgreSQL ${r.machine.postgres} (${r.machine.privateCluster ? 'the bench\'s own embedded cluster' : 'DATABASE_URL\'s server'}), Bun ${r.machine.bun}, ${r.machine.os}; wrk, the processes, the provider simulators and the database on the same machine; 1-minute load average **${r.machine.loadBefore} before** the run, **${r.machine.loadAfter} after**. One core busy: ${r.stressNote}.`,
    '',
    `Every round ran on a fresh database with a freshly started process, ${s.roundSeconds} s of wrk after ${s.warmupSeconds} s of warm-up; ${s.rounds} rounds of every cell, interleaved (odd rounds in one order, even rounds in the reverse). Figures are medians of the rounds; ratios are of the medians, with each round's own ratio beside them.`,
    '',
    '### Targets of issue 25',
    '',
    '| figure | measured | target | |',
    '| --- | --- | --- | --- |',
    ...rows,
    '',
    `Every cell. CPU per answer in µs, from /proc: the process (service or naive app) / PostgreSQL (${r.machine.privateCluster ? 'every process of its cluster' : 'the round\'s backends'}) / provider simulator / wrk. Machine busy: both CPUs' time in use, and in brackets the share that was none of these (stress-ng, other users).`,
    '',
    '| cell | connections | answers/s | rounds | p50 ms | p99 ms | CPU µs per answer | machine busy | exactly once (the naive app: not promised; it is stopped with requests in flight) |',
    '| --- | --- | --- | --- | --- | --- | --- | --- | --- |',
    ...cellRows,
    '',
    'PostgreSQL\'s side of a fresh payment, instant provider, median round (pg_stat_statements: execution time only; parsing, commits and the WAL writer are in the CPU above). The service:',
    '',
    ...statementRows(instantFresh),
    '',
    'The naive app:',
    '',
    ...statementRows(instantNaive),
    '',
    `Database statements, round trips and transactions per request, counted on the wire (${rt.sequential.fresh.requests} requests one at a time, then ${n(conc.fresh.requests)} at ${conc.connections} at a time). A writing transaction has a statement whose text mentions INSERT, UPDATE or DELETE.`,
    '',
    '| request | statements | round trips | transactions | writing transactions | COMMITs | claim statements | claim round trips |',
    '| --- | --- | --- | --- | --- | --- | --- | --- |',
    wire('fresh', rt.sequential.fresh),
    wire('replay', rt.sequential.replay),
    wire('409', rt.sequential.inProgress),
    wire('naive app', rt.sequential.naive),
    wire('naive app, replay', rt.sequential.naiveReplay),
    wire('naive app, no idempotency', rt.sequential.baseline),
    wire(`fresh, ${conc.connections} at a time`, conc.fresh),
    wire(`naive app, ${conc.connections} at a time`, conc.naive),
    '',
    '409s in detail (autocannon, the service on a fresh database):',
    '',
    '| key | load | answers/s | p50 ms | p99 ms | max ms |',
    '| --- | --- | --- | --- | --- | --- |',
    ...([['run elsewhere', storm], ['run here', stormHere]] as const).flatMap(([whose, st]) => [
      `| ${whose} | ${s.connections} at a time | ${n(st.moderate.rps)} | ${st.moderate.p50Ms} | ${st.moderate.p99Ms} | ${st.moderate.maxMs} |`,
      `| ${whose} | ${s.stormConnections} × ${s.stormWaves} | ${n(st.sustained.rps)} | ${st.sustained.p50Ms} | ${st.sustained.p99Ms} | ${st.sustained.maxMs} |`,
      `| ${whose} | one wave of ${s.stormConnections} | | ${st.singleWave.p50Ms} | ${st.singleWave.p99Ms} | ${st.singleWave.maxMs} |`,
    ]),
  ].join('\n')
}

function shorten(text: string): string {
  const clean = text.replaceAll('|', '\\|').replaceAll('`', "'")
  return clean.length > 110 ? `${clean.slice(0, 107)}...` : clean
}
