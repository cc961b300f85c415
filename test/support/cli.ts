/**
 * The operator CLI (`idem`, src/cli.ts) as an operator runs it: its own
 * process, against `databaseUrl`, with no TTL or retention of the shell's
 * (it must take the server's), reading `stdin` if given.
 */
export interface CliRun {
  readonly code: number
  readonly stdout: string
  readonly stderr: string
}

export async function runIdem(databaseUrl: string, args: readonly string[], env: Record<string, string | undefined> = {}, stdin?: string): Promise<CliRun> {
  const merged = { ...process.env, DATABASE_URL: databaseUrl, IDEMPOTENCY_TTL_SECONDS: '', IDEMPOTENCY_RETENTION_SECONDS: '', ...env }
  const proc = Bun.spawn([process.execPath, 'src/cli.ts', ...args], {
    env: Object.fromEntries(Object.entries(merged).filter(([, value]) => value !== undefined)) as Record<string, string>,
    stdin: stdin === undefined ? 'ignore' : new TextEncoder().encode(stdin),
    stdout: 'pipe',
    stderr: 'pipe',
  })
  const [stdout, stderr, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited])
  return { code, stdout, stderr }
}
