/**
 * `bun bench/ab.ts <other checkout> [cells]`: a lever's before and after, in
 * one run. This checkout's service, another checkout's (the code before the
 * lever, e.g. `git worktree add /tmp/before HEAD~1`, with a node_modules
 * symlink) and the naive app, in the rounds `npm run bench` runs
 * (bench/versus-naive.ts: a fresh database and a freshly started process per
 * round, wrk as the load), interleaved so that over three rounds each takes
 * each place once (A B N, B N A, N A B, then the same reversed), and a drift
 * of the machine, or whatever favours a place in the order, hits all three
 * alike. Prints each round and the medians.
 *
 * cells: a comma-separated list of `fresh`, `replay`, `slow` (200 ms
 * provider, 256 connections), `fresh1m` (fresh, on a table of 1,000,000
 * keys). @default fresh,replay
 * BENCH_ROUNDS (6: a multiple of three keeps the places even), BENCH_ROUND_SECONDS (5) as in `npm run bench`.
 */
import { loadavg } from 'node:os'
import { startProvider, type BenchProvider } from './provider'
import { seedKeys } from './seed'
import { openBenchServer } from './server'
import { median, runRound, type Kind, type RoundResult, type Side } from './versus-naive'

const other = process.argv[2]
if (!other) throw new Error('usage: bun bench/ab.ts <other checkout> [fresh,replay,slow]')
const cells = (process.argv[3] ?? 'fresh,replay').split(',')
const rounds = Number(process.env.BENCH_ROUNDS ?? 6)
const seconds = Number(process.env.BENCH_ROUND_SECONDS ?? 5)

type Variant = 'this' | 'other' | 'naive'
const VARIANTS: readonly Variant[] = ['this', 'other', 'naive']
/** Round n's order: rotated by one a round, and reversed in every second run of three (a balanced Latin square). */
function placesOf(round: number): readonly Variant[] {
  const shift = (round - 1) % 3
  const rotated = [...VARIANTS.slice(shift), ...VARIANTS.slice(0, shift)]
  return Math.floor((round - 1) / 3) % 2 === 0 ? rotated : rotated.reverse()
}
const log = (line: string) => console.error(`[ab load ${loadavg()[0]!.toFixed(2)}] ${line}`)

const server = await openBenchServer(log)
const providers: BenchProvider[] = []
try {
  const template = await server.template(`idem_ab_template_${crypto.randomUUID().slice(0, 6)}`)
  const large = cells.includes('fresh1m') ? await server.template(`${template}_seeded`, (sql) => seedKeys(sql, 1_000_000)) : undefined
  const instant = await startProvider(0)
  providers.push(instant)
  const slow = cells.includes('slow') ? await startProvider(200) : undefined
  if (slow) providers.push(slow)
  const results = new Map<string, RoundResult[]>()
  for (let round = 1; round <= rounds; round++) {
    const order = placesOf(round)
    for (const cell of cells) {
      for (const variant of order) {
        const side: Side = variant === 'naive' ? 'naive' : 'service'
        const kind: Kind = cell === 'replay' ? 'replay' : 'fresh'
        const result = await runRound(server, {
          side, kind, provider: cell === 'slow' ? slow! : instant, connections: cell === 'slow' ? 256 : 32, seconds, template: cell === 'fresh1m' ? large! : template,
          tag: `ab${round}${cell}${variant}`, serviceDir: variant === 'other' ? other : undefined,
        })
        const name = `${cell} ${variant}`
        results.set(name, [...(results.get(name) ?? []), result])
        log(`round ${round} ${name}: ${Math.round(result.load.rps)}/s p50 ${result.load.p50} ms, CPU µs per answer: process ${result.cpuUs.process}, PostgreSQL ${result.cpuUs.postgres}, provider ${result.cpuUs.provider}, wrk ${result.cpuUs.wrk}; machine busy ${result.machine.busyPercent} %${side === 'service' ? `, exactly once ${result.exactlyOnce.ok ? 'holds' : 'BROKEN'}` : ''}`)
      }
    }
  }
  for (const cell of cells) {
    const of = (variant: Variant) => results.get(`${cell} ${variant}`)!
    const rps = (variant: Variant) => median(of(variant).map((r) => r.load.rps))
    const cpu = (variant: Variant, side: 'process' | 'postgres') => median(of(variant).map((r) => r.cpuUs[side]))
    const p50 = (variant: Variant) => median(of(variant).map((r) => r.load.p50))
    console.log(`${cell}: this ${Math.round(rps('this'))}/s (${(rps('this') / rps('naive')).toFixed(2)}× naive), other ${Math.round(rps('other'))}/s (${(rps('other') / rps('naive')).toFixed(2)}×), naive ${Math.round(rps('naive'))}/s; ` +
      `p50 ${p50('this')} / ${p50('other')} / ${p50('naive')} ms; CPU µs process ${cpu('this', 'process')} / ${cpu('other', 'process')} / ${cpu('naive', 'process')}, PostgreSQL ${cpu('this', 'postgres')} / ${cpu('other', 'postgres')} / ${cpu('naive', 'postgres')}`)
  }
} finally {
  for (const provider of providers) await provider.stop().catch(() => undefined)
  await server.stop()
}
