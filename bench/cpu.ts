import { readFileSync } from 'node:fs'
import type postgres from 'postgres'
import type { CpuTotals } from './load'

/**
 * CPU time of processes from /proc (Linux; elsewhere every reading is NaN):
 * user + system, in microseconds. CPU per request is steadier than req/s on a
 * shared machine: other work slows a request down but does not make it cost
 * more CPU, so it compares across runs where throughput cannot.
 */
const TICK_US = 1_000_000 / 100 // USER_HZ is 100 on every Linux we run on

export function cpuMicros(pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    // The fields after the command (which may hold spaces) start at field 3; utime is 14, stime 15.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
    return (Number(fields[11]) + Number(fields[12])) * TICK_US
  } catch {
    return Number.NaN
  }
}

/** All CPUs' busy and total time since boot, in USER_HZ ticks, from the first line of /proc/stat. */
export function machineTicks(): { busy: number; total: number } {
  try {
    const fields = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1, 9).map(Number)
    const total = fields.reduce((sum, x) => sum + x, 0)
    const idle = fields[3]! + fields[4]! // idle + iowait
    return { busy: total - idle, total }
  } catch {
    return { busy: Number.NaN, total: Number.NaN }
  }
}

/** The server processes (backends) of every connection to `database`, other than this one. */
async function backendPids(sql: postgres.Sql, database: string): Promise<number[]> {
  const rows = await sql<{ pid: number }[]>`select pid from pg_stat_activity where datname = ${database} and pid <> pg_backend_pid()`
  return rows.map((row) => row.pid)
}

/**
 * What `work` costs each side in CPU: the service process, the PostgreSQL
 * backends connected to this run's database (other users of the server are
 * not counted), the provider simulator, and this process (the load
 * generator). Backends are listed before and after, since pools open
 * connections lazily; one that ended in between counts nothing. Also how busy
 * the whole machine was, and how much of that was none of the above: other
 * people's work on a shared machine, which takes CPU from the run.
 */
export async function measureCpu<T>(
  sql: postgres.Sql, database: string, pids: { service: number; provider: number }, work: () => Promise<T>,
): Promise<{ result: T; cpu: CpuTotals }> {
  const backends = await backendPids(sql, database)
  const before = new Map(backends.map((pid) => [pid, cpuMicros(pid)]))
  const service = cpuMicros(pids.service)
  const provider = cpuMicros(pids.provider)
  const own = process.cpuUsage()
  const machine = machineTicks()
  const started = performance.now()
  const result = await work()
  const seconds = (performance.now() - started) / 1000
  const machineAfter = machineTicks()
  const ownUsage = process.cpuUsage(own)
  const serviceUs = cpuMicros(pids.service) - service
  const providerUs = cpuMicros(pids.provider) - provider
  let postgresUs = 0
  for (const pid of new Set([...backends, ...(await backendPids(sql, database))])) {
    const now = cpuMicros(pid)
    if (!Number.isNaN(now)) postgresUs += now - (before.get(pid) ?? 0)
  }
  const loadGeneratorUs = ownUsage.user + ownUsage.system
  const busyUs = (machineAfter.busy - machine.busy) * TICK_US
  return {
    result,
    cpu: {
      serviceUs, postgresUs, providerUs, loadGeneratorUs,
      machineBusyShare: busyUs / ((machineAfter.total - machine.total) * TICK_US),
      othersUs: Math.max(0, busyUs - serviceUs - postgresUs - providerUs - loadGeneratorUs),
      seconds,
    },
  }
}
