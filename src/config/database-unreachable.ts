/**
 * A start that cannot reach DATABASE_URL says which setting, where it points
 * (host, port and database: never the user or the password), the likeliest
 * cause by the error, and what to check: "connect ECONNREFUSED" alone sends
 * an operator searching.
 */
import { splitHosts } from '../store/masked-url'

/**
 * Not a ConfigError: the exit stays 1, not 2, so a supervisor (systemd,
 * Kubernetes) restarts the service: a database that is down now may be up in
 * a minute, while a bad value stays bad.
 */
export class DatabaseUnreachableError extends Error {
  readonly setting = 'DATABASE_URL'
  constructor(message: string, readonly code: string | undefined) {
    super(`DATABASE_URL: ${message}`)
    this.name = 'DatabaseUnreachableError'
  }
}

/** Host(s), port and database of a postgres URL: what a message may show of it. */
export function databaseTarget(url: string): string {
  const { hosts, single } = splitHosts(url)
  try {
    const parsed = new URL(single)
    const socket = parsed.searchParams.get('host')
    const where = hosts ?? (parsed.host || (socket ? `socket ${socket}` : 'localhost'))
    const database = decodeURIComponent(parsed.pathname.replace(/^\//, '')) || '(the user\'s default database)'
    return `${where}${/:\d+$/.test(where) || hosts || socket ? '' : ':5432'}/${database}`
  } catch {
    return '(not shown: not a URL)'
  }
}

/** SQLSTATEs and socket codes, by the cause they point at. */
const CAUSES: readonly { readonly when: (code: string) => boolean; readonly cause: string }[] = [
  { when: (code) => code === 'ECONNREFUSED', cause: 'nothing listens there: is PostgreSQL running, and are the host and port in DATABASE_URL its own (pg_isready -h <host> -p <port>)?' },
  { when: (code) => code === 'ENOTFOUND' || code === 'EAI_AGAIN', cause: 'the host name does not resolve: check the host in DATABASE_URL and this machine\'s DNS' },
  { when: (code) => ['ETIMEDOUT', 'CONNECT_TIMEOUT', 'EHOSTUNREACH', 'ENETUNREACH'].includes(code), cause: 'no answer from the host: check the host and port in DATABASE_URL, and any firewall or security group between' },
  { when: (code) => code === '28P01' || code === '28000', cause: 'the server refused the credentials: check the user and password in DATABASE_URL, and pg_hba.conf for this client address' },
  { when: (code) => code === '3D000', cause: 'the database does not exist on that server: create it (createdb) or fix its name in DATABASE_URL' },
  { when: (code) => code === '53300' || code === '57P03', cause: 'the server is up but takes no connection now (too many clients, or starting up): check max_connections and the server\'s state' },
  { when: (code) => code === 'ECONNRESET' || code === 'EPIPE', cause: 'the connection was dropped: a TLS mismatch (sslmode) or a proxy in front; check both' },
]

const GENERAL = 'check that PostgreSQL runs (pg_isready), that the host and port in DATABASE_URL are its own, the user and password, and that the database exists'

/** The error's code: a SQLSTATE (postgres.js PostgresError), a socket code, or a postgres.js code. */
function codeOf(error: unknown): string | undefined {
  const code = (error as { code?: unknown; errno?: unknown } | null)?.code
  return typeof code === 'string' ? code : undefined
}

/** Whether `error` is the database being unreachable or refusing us, rather than a fault of ours. */
export function isConnectFailure(error: unknown): boolean {
  const code = codeOf(error)
  return code !== undefined && CAUSES.some(({ when }) => when(code))
}

/** The refusal naming DATABASE_URL (masked), the cause the error points at and what to check. */
export function databaseUnreachable(url: string, error: unknown): DatabaseUnreachableError {
  const code = codeOf(error)
  const cause = code === undefined ? undefined : CAUSES.find(({ when }) => when(code))?.cause
  // Only the code: the server's own message may name the user ('password authentication failed for user "..."').
  return new DatabaseUnreachableError(`cannot reach the database at ${databaseTarget(url)} (${code ?? 'no error code'}): ${cause ?? GENERAL}`, code)
}
