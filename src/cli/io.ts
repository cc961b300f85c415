/** What the CLI talks to (a terminal, a user), its exit codes and the errors that choose them. */
import { userInfo } from 'node:os'
import { createInterface } from 'node:readline/promises'

export const EXIT = { ok: 0, refused: 1, usage: 2 } as const

/** Bad arguments, no database, no actor, a question nobody can answer: exit 2. */
export class UsageError extends Error {}
/** Refused or not done (a live worker, a missing key, a "no"): exit 1. */
export class RefusedError extends Error {}

/** What a run ends with, when an action decides it (a refusal it reports itself). */
export interface RunState {
  exitCode: number
}

/** What the CLI talks to: the process by default; tests give their own terminal and user. */
export interface CliIo {
  readonly env: Readonly<Record<string, string | undefined>>
  readonly out: (text: string) => void
  readonly err: (text: string) => void
  /** Whether someone sits at a terminal to be asked (stdin and stderr are TTYs). */
  readonly interactive: boolean
  /** Asks one question on the terminal and returns the answer line. */
  readonly ask: (question: string) => Promise<string>
  /** The OS user (passwd entry) of this process; throws when it has none. */
  readonly osUser: () => string
}

export const processIo: CliIo = {
  env: process.env,
  out: (text) => process.stdout.write(text),
  err: (text) => process.stderr.write(text),
  interactive: Boolean(process.stdin.isTTY && process.stderr.isTTY),
  async ask(question) {
    const prompt = createInterface({ input: process.stdin, output: process.stderr })
    try {
      return await prompt.question(question)
    } finally {
      prompt.close()
    }
  },
  osUser() {
    const { username } = userInfo()
    if (username !== 'unknown') return username
    // Bun answers "unknown" where Node throws ENOENT (this uid has no passwd entry: a container's
    // arbitrary uid), and also when it could not tell (seen as root with $USER unset). id(1) asks NSS.
    const id = Bun.spawnSync(['id', '-un'], { stdout: 'pipe', stderr: 'ignore' })
    if (id.exitCode !== 0) throw new Error('no passwd entry')
    return id.stdout.toString().trim()
  },
}

/**
 * A destructive command goes ahead with --yes, or when the operator answers
 * "yes" at a terminal after reading what it will do; anywhere else (a
 * script, a pipe, cron) it refuses with exit 2, having done nothing.
 */
export async function confirmed(io: CliIo, yes: boolean | undefined, what: string): Promise<void> {
  if (yes) return
  if (!io.interactive) throw new UsageError(`${what}\nrefusing without --yes: not a terminal, so nobody can be asked. Nothing was done.`)
  const answer = (await io.ask(`${what}\nType "yes" to go ahead: `)).trim().toLowerCase()
  if (answer !== 'yes' && answer !== 'y') throw new RefusedError('not confirmed; nothing was done')
}
