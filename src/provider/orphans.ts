/**
 * The bundled simulator runs in a process group of its own (a Ctrl-C to the
 * service must not stop it before the service has drained), so a SIGKILL of
 * the service leaves it running, on its port and its ledger. Every simulator
 * `npm start` runs leaves a record, removed by its clean stop; the next start
 * on the same ledger stops the simulators whose service is gone.
 *
 * Records are per ledger (the ledger file is what two simulators cannot
 * share, and the default ledger lives in the checkout), so a start never
 * stops another checkout's simulator, nor one on another ledger. A record
 * names each process with its start time (/proc/PID/stat), so a pid reused
 * by an unrelated process is never mistaken for ours. A process that has
 * exited but is not yet reaped (a zombie: its parent has not waited for it)
 * is gone: a restart 0.6 s after a SIGKILL found the killed service still
 * "alive" by kill(pid, 0), left its simulator running, and died with
 * "Is port 3901 in use?".
 *
 * Linux only (/proc): elsewhere no process is ever recognised, so none is stopped.
 */
import { createHash } from 'node:crypto'
import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'

export interface ProcessIdentity {
  readonly pid: number
  /** Clock ticks after boot at which it started (field 22 of /proc/PID/stat). */
  readonly start: string
}

interface SimulatorRecord {
  readonly simulator: ProcessIdentity
  readonly service: ProcessIdentity
  readonly ledger: string
}

/**
 * Where the records for one ledger live: per user, per ledger (its absolute
 * path). Not under the former per-user folder (idempotent-post-simulators-UID):
 * a service of an older version reads every entry there as a file, and
 * failed to start (EISDIR) on a folder.
 */
export function recordsDir(ledgerPath: string, base = tmpdir()): string {
  const ledger = resolve(ledgerPath)
  const id = createHash('sha256').update(ledger).digest('hex').slice(0, 16)
  return join(base, `idempotent-post-simulator-records-${process.getuid?.() ?? 'user'}`, id)
}

/** A live process's identity, or undefined when it is gone (a zombie counts as gone) or unreadable. */
export function identityOf(pid: number): ProcessIdentity | undefined {
  if (!Number.isInteger(pid) || pid <= 0) return undefined
  let stat: string
  try {
    stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
  } catch {
    return undefined
  }
  // Fields after the command name, which may hold spaces, in its parentheses: state is the first, starttime the 20th.
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
  if (fields[0] === 'Z' || fields[0] === 'X') return undefined
  return { pid, start: fields[19] ?? '' }
}

/** True when `identity` is still that very process, running. */
export function stillRunning(identity: ProcessIdentity): boolean {
  return identityOf(identity.pid)?.start === identity.start
}

/**
 * The simulators recorded for this ledger whose service is gone and that
 * still run; stale records (simulator gone too) are removed on the way.
 */
export function orphanedSimulators(ledgerPath: string): ProcessIdentity[] {
  const dir = recordsDir(ledgerPath)
  let names: string[]
  try {
    names = readdirSync(dir)
  } catch {
    return []
  }
  const orphans: ProcessIdentity[] = []
  for (const name of names) {
    const path = join(dir, name)
    if (!name.endsWith('.json')) continue
    let record: SimulatorRecord
    try {
      record = JSON.parse(readFileSync(path, 'utf8')) as SimulatorRecord
    } catch {
      rmSync(path, { force: true }) // unreadable: from an older version, or half-written
      continue
    }
    if (stillRunning(record.service)) continue // its service still runs (tests run several at once)
    if (stillRunning(record.simulator)) orphans.push(record.simulator)
    rmSync(path, { force: true })
  }
  return orphans
}

/** Records a simulator this process started; the returned function removes the record (call it after a clean stop). */
export function recordSimulator(ledgerPath: string, simulatorPid: number): () => void {
  const simulator = identityOf(simulatorPid)
  const service = identityOf(process.pid)
  if (!simulator || !service) return () => undefined
  const dir = recordsDir(ledgerPath)
  mkdirSync(dir, { recursive: true, mode: 0o700 })
  const path = join(dir, `${simulatorPid}.json`)
  const record: SimulatorRecord = { simulator, service, ledger: resolve(ledgerPath) }
  // Written whole, then renamed: a reader never sees half a record.
  writeFileSync(`${path}.tmp`, JSON.stringify(record))
  renameSync(`${path}.tmp`, path)
  return () => rmSync(path, { force: true })
}
