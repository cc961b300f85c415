/**
 * The Citus round of `npm run bench` (issue 47), or alone: `bun bench/citus.ts`.
 *
 * A cluster of our own (test/support/citus.ts: a coordinator and two workers
 * on this machine, each its own PostgreSQL), and on the coordinator's server
 * two databases: one distributed by tenant (citus in it, the workers added,
 * sql/engine/00011), one plain (no citus: the tables local, as on one
 * primary). The same service (`bun src/main.ts`) against each, fresh payments
 * through wrk at 32 connections to an instant provider, rounds interleaved
 * (plain, distributed, distributed, plain, ...), each round on a fresh
 * database and process. Figures: fresh payments/s of each, the ratio of
 * their medians, and for the distributed one the commands Citus sent per
 * payment, counted in a pass of its own (`citus.log_remote_commands` into
 * the coordinator's log, one payment at a time, so nothing is batched), and
 * the two-phase commits per payment (PREPARE TRANSACTION among those
 * commands). Exactly once is counted in every round: its payments in the
 * table, its charges at the provider.
 *
 * BENCH_CITUS_ROUNDS (3), BENCH_ROUND_SECONDS (5), BENCH_CONNECTIONS (32).
 */
import { readFileSync, statSync } from 'node:fs'
import { join } from 'node:path'
import postgres from 'postgres'
import { migrateService } from '../src/store/migrate'
import { startCitusCluster, type CitusCluster } from '../test/support/citus'
import { chargesAt } from '../test/support/server'
import { startProvider, type BenchProvider } from './provider'
import { BENCH_API_KEY, startService } from './service'
import { median } from './versus-naive'
import { benchBody, runWrk } from './wrk'

export interface CitusRound {
  readonly side: 'plain' | 'distributed'
  readonly rps: number
  readonly p50: number
  readonly exactlyOnce: boolean
}

export interface CitusResult {
  readonly rounds: readonly CitusRound[]
  readonly plainRps: number
  readonly distributedRps: number
  /** distributedRps / plainRps. */
  readonly ratio: number
  /** Commands the coordinator sent to workers per fresh payment, one payment at a time (the request path's: claim and completion). */
  readonly remoteCommandsPerPayment: number
  /** Of those, on how many distinct workers each payment's commands ran (1: its tenant's). */
  readonly workersPerPayment: number
  /** Two-phase commits per fresh payment on the request path (0: every call commits once, on one worker). */
  readonly twoPhaseCommitsPerPayment: number
  /** Worker transactions per payment under load (batched calls: under 2). */
  readonly workerTransactionsPerPayment: number
}

const HEADERS = { authorization: `Bearer ${BENCH_API_KEY}`, 'content-type': 'application/json' }
const WARMUP_SECONDS = 2
const COUNTED_PAYMENTS = 200

export async function runCitusRound(options: { rounds: number; seconds: number; connections: number; log: (line: string) => void }): Promise<CitusResult> {
  const { log } = options
  const cluster = await startCitusCluster({ workers: 2 })
  const provider = await startProvider(0)
  try {
    const rounds: CitusRound[] = []
    let loadTransactions = { payments: 0, transactions: 0 }
    for (let round = 1; round <= options.rounds; round++) {
      const sides = round % 2 === 1 ? (['plain', 'distributed'] as const) : (['distributed', 'plain'] as const)
      for (const side of sides) {
        const result = await oneRound(cluster, provider, side, `c${round}${side[0]}`, options)
        rounds.push(result.round)
        if (side === 'distributed') loadTransactions = { payments: loadTransactions.payments + result.payments, transactions: loadTransactions.transactions + result.workerTransactions }
        log(`citus round ${round} ${side}: ${Math.round(result.round.rps)}/s p50 ${result.round.p50} ms, exactly once ${result.round.exactlyOnce ? 'holds' : 'BROKEN'}`)
      }
    }
    const counted = await countRemoteCommands(cluster, provider)
    log(`citus: ${counted.commandsPerPayment} remote commands per fresh payment on ${counted.workersPerPayment} worker(s), ${counted.twoPhasePerPayment} two-phase commits`)
    const plainRps = median(rounds.filter((r) => r.side === 'plain').map((r) => r.rps))
    const distributedRps = median(rounds.filter((r) => r.side === 'distributed').map((r) => r.rps))
    return {
      rounds, plainRps, distributedRps, ratio: round2(distributedRps / plainRps),
      remoteCommandsPerPayment: counted.commandsPerPayment, workersPerPayment: counted.workersPerPayment,
      twoPhaseCommitsPerPayment: counted.twoPhasePerPayment,
      workerTransactionsPerPayment: round2(loadTransactions.transactions / Math.max(1, loadTransactions.payments)),
    }
  } finally {
    await provider.stop().catch(() => undefined)
    await cluster.stop()
  }
}

/** A database of the side's kind on the coordinator's server, migrated: distributed (citus, the workers) or plain (no citus). */
async function makeDatabase(cluster: CitusCluster, side: 'plain' | 'distributed', tag: string): Promise<{ url: string; drop(): Promise<void> }> {
  if (side === 'distributed') {
    const db = await cluster.createDatabase(`bench_${tag}`)
    await migrateService(db.url)
    return { url: db.url, drop: () => db.drop() }
  }
  const name = `bench_${tag}_${crypto.randomUUID().slice(0, 6)}`
  const admin = postgres(cluster.coordinator.url, { max: 1, onnotice: () => undefined })
  try {
    await admin.unsafe(`create database "${name}"`)
  } finally {
    await admin.end()
  }
  const url = cluster.coordinator.urlOf(name)
  await migrateService(url)
  return {
    url,
    async drop() {
      const sql = postgres(cluster.coordinator.url, { max: 1, onnotice: () => undefined })
      try {
        await sql.unsafe(`drop database if exists "${name}" with (force)`)
      } finally {
        await sql.end()
      }
    },
  }
}

async function oneRound(cluster: CitusCluster, provider: BenchProvider, side: 'plain' | 'distributed', tag: string,
  options: { seconds: number; connections: number }): Promise<{ round: CitusRound; payments: number; workerTransactions: number }> {
  const db = await makeDatabase(cluster, side, tag)
  const service = await startService(db.url, provider.url, { METRICS_CACHE_MS: '0' })
  const customer = `cus_${tag}_${crypto.randomUUID().slice(0, 6)}`
  const sql = postgres(db.url, { max: 1, onnotice: () => undefined })
  const url = `${service.url}/api/payments`
  let stopped = false
  try {
    await runWrk({ url, connections: options.connections, seconds: WARMUP_SECONDS, headers: HEADERS, keys: { kind: 'fresh', prefix: `${tag}-w-` }, customer })
    const before = side === 'distributed' ? await workerCommits(cluster, db.url) : 0
    const load = await runWrk({ url, connections: options.connections, seconds: options.seconds, headers: HEADERS, keys: { kind: 'fresh', prefix: `${tag}-f-` }, customer })
    const workerTransactions = side === 'distributed' ? (await workerCommits(cluster, db.url)) - before : 0
    if (load.non2xx > 0 || load.socketErrors > 0) throw new Error(`citus ${side}: ${load.non2xx} answers not 2xx, ${load.socketErrors} socket errors of ${load.requests}\n${service.output().slice(-2000)}`)
    await service.stop()
    stopped = true
    const rows = await sql<{ ref: string }[]>`select provider_ref as ref from payments where customer = ${customer}`
    const charges = new Set((await chargesAt(provider.url, customer)).map((charge) => charge.id))
    const refs = new Set(rows.map((row) => row.ref))
    const exactlyOnce = refs.size === rows.length && rows.length === charges.size && [...refs].every((ref) => charges.has(ref))
    return { round: { side, rps: load.rps, p50: load.p50, exactlyOnce }, payments: load.requests, workerTransactions }
  } finally {
    await sql.end()
    if (!stopped) await service.stop().catch(() => undefined)
    await db.drop()
  }
}

/** Transactions committed on the workers in the database of `url` (its name, on each worker). */
async function workerCommits(cluster: CitusCluster, url: string): Promise<number> {
  const name = new URL(url).pathname.slice(1)
  let total = 0
  for (const worker of cluster.workers) {
    const sql = postgres(worker.urlOf(name), { max: 1, onnotice: () => undefined })
    try {
      await sql`select pg_stat_clear_snapshot()`
      const [row] = await sql<{ n: string }[]>`select xact_commit::text as n from pg_stat_database where datname = current_database()`
      total += Number(row?.n ?? 0)
    } finally {
      await sql.end()
    }
  }
  return total
}

/**
 * Commands per fresh payment, one payment at a time: the service's sessions log
 * every command Citus sends (ALTER DATABASE ... SET citus.log_remote_commands),
 * counted in the coordinator's log between one payment's request and its
 * answer, with the node each went to, and the two-phase commits among them
 * (PREPARE TRANSACTION). A payment during which the heartbeat wrote its
 * reference table (every few seconds, to every node) is left out, and the
 * readiness check's `select 1` on every worker is not counted: those commands
 * are not a request's.
 */
async function countRemoteCommands(cluster: CitusCluster, provider: BenchProvider): Promise<{ commandsPerPayment: number; workersPerPayment: number; twoPhasePerPayment: number }> {
  const db = await makeDatabase(cluster, 'distributed', 'count')
  const admin = postgres(db.url, { max: 1, onnotice: () => undefined })
  const name = new URL(db.url).pathname.slice(1)
  // Citus sends these lines at NOTICE: the server log keeps them only from that level.
  await admin.unsafe(`alter database "${name}" set citus.log_remote_commands = on`)
  await admin.unsafe(`alter database "${name}" set log_min_messages = notice`)
  const service = await startService(db.url, provider.url, { METRICS_CACHE_MS: '0' })
  const logFile = join(cluster.home, 'coordinator.log')
  try {
    const customer = `cus_count_${crypto.randomUUID().slice(0, 6)}`
    await pay(service.url, customer, 'count-warm', 0)
    let counted = 0
    let commands = 0
    let workers = 0
    let twoPhase = 0
    for (let n = 1; n <= COUNTED_PAYMENTS; n++) {
      const offset = statSync(logFile).size
      await pay(service.url, customer, `count-${n}`, n)
      const lines = readFileSync(logFile).subarray(offset).toString('utf8').split('\n')
      if (lines.some((line) => /idempotency_processes_\d+/.test(line))) continue // the heartbeat wrote its reference table
      const sent = lines.flatMap((line, i) => {
        if (!/(LOG|NOTICE):\s+issuing /.test(line)) return []
        // The readiness check's probe of every worker (run_command_on_workers), not a request's.
        if (/issuing (SET application_name TO 'citus_run_command|select 1$)/.test(line)) return []
        const detail = lines.slice(i + 1).find((next) => /DETAIL:\s+on server/.test(next)) ?? ''
        return [{ node: /on server \S+:(\d+)/.exec(detail)?.[1] ?? '?', prepare: /PREPARE TRANSACTION/i.test(line) }]
      })
      counted++
      commands += sent.length
      workers += new Set(sent.map((command) => command.node)).size
      twoPhase += sent.filter((command) => command.prepare).length
    }
    const per = (value: number) => round2(value / Math.max(1, counted))
    return { commandsPerPayment: per(commands), workersPerPayment: per(workers), twoPhasePerPayment: per(twoPhase) }
  } finally {
    await service.stop().catch(() => undefined)
    await admin.end()
    await db.drop()
  }
}

async function pay(serviceUrl: string, customer: string, key: string, n: number): Promise<void> {
  const response = await fetch(`${serviceUrl}/api/payments`, { method: 'POST', headers: { ...HEADERS, 'idempotency-key': key }, body: benchBody(n, customer) })
  if (response.status !== 201) throw new Error(`payment ${key}: ${response.status} ${await response.text()}`)
  await response.arrayBuffer()
}

const round2 = (value: number) => Math.round(value * 100) / 100

/** The round as Markdown, for `npm run bench`'s report (BENCHMARKS.md, "Issue 47"). */
export function citusReport(result: CitusResult): string {
  const rounds = result.rounds.map((r) => `| ${r.side} | ${Math.round(r.rps)} | ${r.p50} | ${r.exactlyOnce ? 'holds' : 'BROKEN'} |`).join('\n')
  return `## Citus: fresh payments on a coordinator and two workers, against a plain database of the same server

| database | payments/s | p50 ms | exactly once |
| --- | --- | --- | --- |
${rounds}

- distributed / plain (medians): **${result.ratio}×** (${Math.round(result.distributedRps)}/s against ${Math.round(result.plainRps)}/s; target ≥ 0.5×)
- remote commands per fresh payment, one at a time: **${result.remoteCommandsPerPayment}** on ${result.workersPerPayment} worker(s), two-phase commits per payment: **${result.twoPhaseCommitsPerPayment}**
- worker transactions per payment under load (batched calls): ${result.workerTransactionsPerPayment}
`
}

if (import.meta.main) {
  const log = (line: string) => console.error(`[bench citus ${new Date().toISOString().slice(11, 19)}] ${line}`)
  const result = await runCitusRound({
    rounds: Number(process.env.BENCH_CITUS_ROUNDS ?? 3),
    seconds: Number(process.env.BENCH_ROUND_SECONDS ?? 5),
    connections: Number(process.env.BENCH_CONNECTIONS ?? 32),
    log,
  })
  console.log(JSON.stringify(result, null, 2))
}
