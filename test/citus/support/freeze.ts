/**
 * A worker that stalls without going away: its postmaster and every backend
 * SIGSTOPped (a VM paused, a process frozen by the kernel), so connections to
 * it are accepted by the kernel and never answered, and statements on it
 * hang, unlike a stopped worker, which refuses at once. SIGCONT thaws it.
 */
import { readdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'

/** The postmaster running on data directory `dir` and its children, by /proc. */
function processesOf(dir: string): number[] {
  const postmaster = Number(readFileSync(join(dir, 'postmaster.pid'), 'utf8').split('\n')[0])
  const children = readdirSync('/proc').filter((name) => /^\d+$/.test(name)).map(Number).filter((pid) => {
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
      return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]) === postmaster
    } catch {
      return false
    }
  })
  return [postmaster, ...children]
}

/** Freezes the node whose data is `${home}/${name}` (test/support/citus.ts's layout); the result thaws it. */
export function freezeNode(home: string, name: string): () => void {
  const pids = processesOf(join(home, name))
  for (const pid of pids) process.kill(pid, 'SIGSTOP')
  let thawed = false
  return () => {
    if (thawed) return
    thawed = true
    for (const pid of pids) {
      try { process.kill(pid, 'SIGCONT') } catch { /* gone */ }
    }
  }
}
