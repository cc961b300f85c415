/**
 * CPU time of processes, from /proc (Linux): what a phase of load cost each
 * component, in CPU seconds, whatever else shares the machine. Throughput per
 * core is then requests / CPU seconds, a figure that does not depend on how
 * many cores were free while it was measured.
 */
import { readFileSync } from 'node:fs'
import { descendants } from './processes'

const TICKS_PER_SECOND = Number(Bun.spawnSync(['getconf', 'CLK_TCK']).stdout.toString().trim()) || 100

/** utime + stime of one process (all its threads), in seconds; 0 if it is gone. */
function processSeconds(pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    // Fields after the command name (which may hold spaces) in its parentheses.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
    return (Number(fields[11]) + Number(fields[12])) / TICKS_PER_SECOND
  } catch {
    return 0
  }
}

/**
 * CPU seconds of a process and its descendants so far. PostgreSQL's backends
 * each call setsid(), so they are found by parent, not by process group.
 * Children that exited during the phase are counted through the parent's
 * cutime/cstime (the postmaster reaps its backends).
 */
export function treeSeconds(root: number): number {
  let total = 0
  for (const pid of descendants(root)) total += processSeconds(pid)
  try {
    const stat = readFileSync(`/proc/${root}/stat`, 'utf8')
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
    total += (Number(fields[13]) + Number(fields[14])) / TICKS_PER_SECOND
  } catch { /* gone */ }
  return total
}

export interface Meter {
  /** CPU seconds per named component since the meter started. */
  read(): Record<string, number>
}

/** Starts metering named process trees (each name: the root's pid). */
export function meter(groups: Record<string, number>): Meter {
  const start = Object.fromEntries(Object.entries(groups).map(([name, pid]) => [name, treeSeconds(pid)]))
  return {
    read() {
      return Object.fromEntries(Object.entries(groups).map(([name, pid]) => [name, treeSeconds(pid) - start[name]!]))
    },
  }
}
