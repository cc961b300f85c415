/**
 * Where a connection to PostgreSQL goes and how, read once: DATABASE_URL and
 * the PG* variables resolved into one object that the start check
 * (REQUIRE_TLS, the production warning), the CLI, `npm run migrate` and the
 * driver all read. The driver is handed the resolved values (`driverConnection`),
 * so it never reads the query or the environment for them itself: what was
 * checked is what is used (issue 41: the check read the first of two
 * `sslmode`s, postgres.js the last, and a REQUIRE_TLS=1 start spoke plain text).
 *
 * The rules, as postgres.js 3.4.9 reads a URL (parseOptions in its index.js),
 * with its ambiguities refused instead of guessed:
 *
 * - A parameter given twice is refused, whichever it is (postgres.js takes the
 *   last, URLSearchParams.get and libpq readers the first).
 * - TLS: `sslmode` or `ssl` (disable, prefer, require, verify-ca,
 *   verify-full; `true` is verify-full and `false` disable, as postgres.js
 *   reads them; `allow` is require, as postgres.js speaks it; `no-verify`,
 *   node-postgres's spelling, is require too), or
 *   `sslrootcert=system` (verify-full). Two of them that disagree are refused
 *   (`sslmode=disable&ssl=true`; `sslrootcert=system` with a mode other than
 *   verify-full, as libpq refuses it). Another value, or an empty one, is refused.
 * - Where the URL names no mode: PGSSLMODE (libpq's variable, which postgres.js
 *   ignores: we honour it, and tell the driver) or PGSSL (postgres.js's), with
 *   the same values; the two disagreeing are refused. The URL wins over both,
 *   as in libpq: `sslmode=disable` with PGSSLMODE=verify-full is disable, and
 *   so warned about (production) or refused (REQUIRE_TLS=1) like any plain text.
 *   Nothing set: disable (postgres.js's default, not libpq's prefer).
 * - Hosts: the URL's (one, or a list `h1:5432,h2:5433`; a host without a port
 *   takes the first host's, as postgres.js does), else `?host=` (and `?port=`),
 *   else PGHOST (and PGPORT), else localhost; port 5432 when none says.
 *   A host that is a directory (`/var/run/postgresql`, or percent-encoded) is
 *   a Unix socket. A host or port both in the URL's authority and as a
 *   parameter is refused.
 * - `target_session_attrs` (or PGTARGETSESSIONATTRS): `read-write` is taken as
 *   `primary` (db.ts driverOptions says why), `any` as none; `sslnegotiation`
 *   (or PGSSLNEGOTIATION): postgres or direct.
 * - libpq's TLS and authentication parameters that postgres.js does not read
 *   (sslcert, sslkey, sslrootcert=<file>, channel_binding, ...) are refused:
 *   postgres.js would send each to the server as a setting, which fails the
 *   connection after its startup was sent. So is a parameter the driver reads
 *   spelled in another letter case (`SSLMODE`): it would be ignored.
 *
 * A refusal names the variable and the parameter, never the URL or a value
 * that is not one of the known modes (it may hold a password).
 */
import { splitHosts } from './masked-url'

export type Env = Readonly<Record<string, string | undefined>>

/** libpq's modes as postgres.js speaks them (`allow` is require there); it verifies verify-ca as verify-full (the host name too). */
export type SslMode = 'disable' | 'prefer' | 'require' | 'verify-ca' | 'verify-full'
export type TargetSessionAttrs = 'read-only' | 'primary' | 'standby' | 'prefer-standby'

export interface ConnectionSettings {
  /** The URL as given: to print masked (maskedUrl), never read again for where or how. */
  readonly url: string
  /** The TCP hosts in the order tried, or the one socket directory (then `socket` is set). */
  readonly hosts: readonly { readonly host: string; readonly port: number }[]
  /** The Unix socket file, when the host is a directory. */
  readonly socket: string | undefined
  readonly sslmode: SslMode
  /** What chose `sslmode`: `sslmode`, `ssl`, `sslrootcert` (in the URL), PGSSLMODE, PGSSL, or `default`. */
  readonly sslmodeFrom: 'sslmode' | 'ssl' | 'sslrootcert' | 'PGSSLMODE' | 'PGSSL' | 'default'
  readonly sslnegotiation: 'postgres' | 'direct'
  readonly targetSessionAttrs: TargetSessionAttrs | undefined
  /** A host other than this one (not loopback, not a socket): the connection may cross a network. */
  readonly leavesHost: boolean
  /** leavesHost, and a mode that speaks plain text or falls back to it (disable, prefer). */
  readonly plainText: boolean
}

/** A URL or a variable the driver would read otherwise than the check: `variable` and `parameter` name it; the message never shows the URL. */
export class ConnectionSettingsError extends Error {
  constructor(readonly variable: string, readonly parameter: string, readonly reason: string) {
    super(`${variable}: ${reason}`)
    this.name = 'ConnectionSettingsError'
  }
}

/** Every value of sslmode, ssl, PGSSLMODE and PGSSL that reaches the driver, and the mode it is. */
export const TLS_VALUES: Readonly<Record<string, SslMode>> = Object.freeze({
  disable: 'disable', prefer: 'prefer', require: 'require', 'verify-ca': 'verify-ca', 'verify-full': 'verify-full',
  // As postgres.js does it: TLS without checking the certificate, failing where the server has none (libpq's allow
  // would try plain text first; postgres.js never falls back from it), so never plain text.
  allow: 'require',
  // postgres.js: `false` is no TLS, `true` (any other string) TLS with the certificate and host name verified.
  false: 'disable', true: 'verify-full',
  // node-postgres's spelling of "TLS, certificate not checked"; postgres.js alone would verify it.
  'no-verify': 'require',
})
const PLAIN_TEXT_MODES: readonly SslMode[] = ['disable', 'prefer']
const TARGET_SESSION_ATTRS: Readonly<Record<string, TargetSessionAttrs | undefined>> = Object.freeze({
  'read-write': 'primary', primary: 'primary', 'read-only': 'read-only', standby: 'standby', 'prefer-standby': 'prefer-standby', any: undefined,
})
/** The parameters resolved here and handed to the driver as options: removed from the URL it is given. */
const RESOLVED = ['sslmode', 'ssl', 'sslrootcert', 'sslnegotiation', 'target_session_attrs', 'host', 'port'] as const
/** libpq's parameters for TLS, authentication and addressing that postgres.js does not read (it would send them to the server as settings). */
const NOT_READ = ['sslcert', 'sslkey', 'sslpassword', 'sslcrl', 'sslcrldir', 'sslsni', 'sslcertmode', 'sslcompression', 'ssl_min_protocol_version',
  'ssl_max_protocol_version', 'requiressl', 'gssencmode', 'gsslib', 'krbsrvname', 'channel_binding', 'require_auth', 'hostaddr', 'passfile', 'service'] as const
const DEFAULT_PORT = 5432

/** localhost, 127.0.0.0/8 or ::1: a connection that never leaves the host. */
export function isLoopback(hostname: string): boolean {
  const host = hostname.replace(/^\[|\]$/g, '').toLowerCase()
  return host === 'localhost' || host === '::1' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host)
}

/**
 * DATABASE_URL (`variable` names it in refusals) and the PG* variables of
 * `env`, resolved (see the module's comment); throws ConnectionSettingsError.
 */
export function resolveConnection(raw: string, env: Env = process.env, variable = 'DATABASE_URL'): ConnectionSettings {
  const refuse = (parameter: string, reason: string, at = variable): never => { throw new ConnectionSettingsError(at, parameter, reason) }
  if (!/^postgres(ql)?:\/\//.test(raw)) refuse('scheme', 'must be a postgres:// or postgresql:// URL')
  const { hosts: listed, single } = splitHosts(raw)
  if (!URL.canParse(single)) refuse('url', 'is not a URL that parses (a password with @, / or : must be percent-encoded); not shown, it may hold a password')
  const url = new URL(single)
  const query = queryOf(url, refuse)

  // TLS: the URL's spellings, which must agree, else the environment's, which must agree.
  const named: [from: 'sslmode' | 'ssl' | 'sslrootcert', mode: SslMode][] = []
  for (const name of ['sslmode', 'ssl'] as const) {
    const value = query.get(name)
    if (value === undefined) continue
    const mode = own(TLS_VALUES, value)
    if (!mode) refuse(name, `has a value of ${name} that is not one of ${Object.keys(TLS_VALUES).join(', ')} (not shown)`)
    named.push([name, mode!])
  }
  const rootcert = query.get('sslrootcert')
  if (rootcert !== undefined) {
    if (rootcert !== 'system') refuse('sslrootcert', 'has sslrootcert with a file, which postgres.js does not read (only sslrootcert=system, the system\'s certificate authorities): remove it, and trust a private authority with NODE_EXTRA_CA_CERTS')
    named.push(['sslrootcert', 'verify-full'])
  }
  for (const [from, mode] of named.slice(1)) {
    const [firstFrom, first] = named[0]!
    if (mode !== first) {
      const shown = (name: string, value: SslMode) => name === 'sslrootcert' ? 'sslrootcert=system (verify-full)' : `${name}=${query.get(name)}${query.get(name) === value ? '' : ` (${value})`}`
      refuse(from, `has ${shown(firstFrom, first)} and ${shown(from, mode)}, which disagree (postgres.js would take ${from === 'sslrootcert' ? 'verify-full' : 'sslmode'}, another reader the other): keep one`)
    }
  }
  let sslmode: SslMode = 'disable'
  let sslmodeFrom: ConnectionSettings['sslmodeFrom'] = 'default'
  if (named.length > 0) [sslmodeFrom, sslmode] = named[0]!
  else {
    const fromEnv: ['PGSSLMODE' | 'PGSSL', SslMode][] = []
    for (const name of ['PGSSLMODE', 'PGSSL'] as const) {
      const value = env[name]?.trim()
      if (!value) continue
      const mode = own(TLS_VALUES, value)
      if (!mode) refuse(name, `is not one of ${Object.keys(TLS_VALUES).join(', ')}`, name)
      fromEnv.push([name, mode!])
    }
    if (fromEnv.length === 2 && fromEnv[0]![1] !== fromEnv[1]![1])
      refuse('PGSSL', `PGSSLMODE (${fromEnv[0]![1]}) and PGSSL (${fromEnv[1]![1]}) disagree: keep one (DATABASE_URL names no sslmode, so the driver would take one of them)`, 'PGSSLMODE')
    if (fromEnv.length > 0) [sslmodeFrom, sslmode] = fromEnv[0]!
  }

  const negotiation = query.get('sslnegotiation') ?? (env.PGSSLNEGOTIATION?.trim() || undefined)
  if (negotiation !== undefined && negotiation !== 'postgres' && negotiation !== 'direct')
    refuse('sslnegotiation', 'has a value of sslnegotiation that is neither postgres nor direct', query.has('sslnegotiation') ? variable : 'PGSSLNEGOTIATION')
  const attrs = query.get('target_session_attrs') ?? (env.PGTARGETSESSIONATTRS?.trim() || undefined)
  if (attrs !== undefined && !Object.hasOwn(TARGET_SESSION_ATTRS, attrs))
    refuse('target_session_attrs', `has a value of target_session_attrs that is not one of ${Object.keys(TARGET_SESSION_ATTRS).join(', ')}`, query.has('target_session_attrs') ? variable : 'PGTARGETSESSIONATTRS')

  const { hosts, socket } = hostsOf(url, listed, query, env, refuse)
  const leavesHost = socket === undefined && !hosts.every(({ host }) => isLoopback(host))
  return Object.freeze({
    url: raw,
    hosts: Object.freeze(hosts.map((host) => Object.freeze(host))),
    socket,
    sslmode,
    sslmodeFrom,
    sslnegotiation: negotiation === 'direct' ? 'direct' : 'postgres',
    targetSessionAttrs: attrs === undefined ? undefined : TARGET_SESSION_ATTRS[attrs],
    leavesHost,
    plainText: leavesHost && PLAIN_TEXT_MODES.includes(sslmode),
  })
}

/** `table[key]` when it is the table's own (not `constructor` or another name every object has). */
const own = <T>(table: Readonly<Record<string, T>>, key: string): T | undefined => (Object.hasOwn(table, key) ? table[key] : undefined)

type Refuse = (parameter: string, reason: string, at?: string) => never

/** The query as postgres.js reads it (URLSearchParams' decoding), each name at most once, none it would misread. */
function queryOf(url: URL, refuse: Refuse): Map<string, string> {
  const query = new Map<string, string>()
  const read = new Set<string>([...RESOLVED, ...NOT_READ])
  for (const [name, value] of url.searchParams) {
    if (query.has(name)) refuse(name, `gives ${name} more than once (postgres.js would use the last, another reader the first): give each parameter once`)
    query.set(name, value)
    const lower = name.toLowerCase()
    if (lower !== name && read.has(lower)) refuse(lower, `has ${name}, which the driver does not read (it reads ${lower}, in lower case)`)
    if ((NOT_READ as readonly string[]).includes(name)) refuse(name, `has ${name}, which postgres.js does not read (it would send it to the server as a setting, and the connection fails): remove it`)
    if ((RESOLVED as readonly string[]).includes(name) && value.trim() === '') refuse(name, `has an empty ${name}: give it a value, or remove it`)
  }
  return query
}

/** Where the connection goes (see the module's comment). */
function hostsOf(url: URL, listed: string | undefined, query: Map<string, string>, env: Env, refuse: Refuse): { hosts: { host: string; port: number }[]; socket: string | undefined } {
  const authority = listed ?? url.host
  if (authority !== '' && query.has('host')) refuse('host', 'names a host both before its path and as ?host=: keep one')
  const fromQuery = query.get('host')
  const fromEnv = env.PGHOST?.trim() || undefined
  const written = authority !== '' ? authority : fromQuery ?? fromEnv ?? 'localhost'
  const where = authority !== '' || fromQuery !== undefined ? undefined : fromEnv !== undefined ? 'PGHOST' : undefined
  const portOf = (text: string, name: string, at?: string): number => {
    const port = /^\d{1,5}$/.test(text) ? Number(text) : NaN
    if (!(port >= 1 && port <= 65_535)) refuse(name, `has a value of ${name} that is not a port (1..65535)`, at)
    return port
  }
  const entries = written.split(',').map((entry) => splitPort(entry, refuse))
  if (authority !== '' && query.has('port') && entries.some(({ port }) => port !== undefined)) refuse('port', 'names a port both after its host and as ?port=: keep one')
  // postgres.js: a host without its own port takes the first host's, else the query's or PGPORT, else 5432.
  const fallback = entries[0]!.port !== undefined ? portOf(entries[0]!.port, 'port')
    : query.has('port') ? portOf(query.get('port')!, 'port')
      : env.PGPORT?.trim() ? portOf(env.PGPORT.trim(), 'PGPORT', 'PGPORT')
        : DEFAULT_PORT
  const hosts = entries.map(({ host, port }) => ({ host, port: port === undefined ? fallback : portOf(port, 'port') }))
  const sockets = hosts.filter(({ host }) => host.startsWith('/'))
  if (sockets.length === 0) {
    if (hosts.some(({ host }) => host === '')) refuse('host', 'has an empty host in its list of hosts', where)
    return { hosts, socket: undefined }
  }
  if (hosts.length > 1) refuse('host', 'mixes a socket directory with other hosts: give one socket, or TCP hosts', where)
  return { hosts, socket: `${hosts[0]!.host.replace(/\/+$/, '')}/.s.PGSQL.${hosts[0]!.port}` }
}

/** `host`, `host:port`, `[v6]`, `[v6]:port` or a bare `v6` (PGHOST=::1), percent-decoded (a socket directory may be written `%2Fvar%2Frun%2Fpostgresql`). */
function splitPort(entry: string, refuse: Refuse): { host: string; port: string | undefined } {
  const bracketed = /^\[([^\]]*)\](?::(.*))?$/.exec(entry)
  const bare = entry.startsWith('/') || entry.indexOf(':') !== entry.lastIndexOf(':')
  const [host, port] = bracketed ? [bracketed[1]!, bracketed[2]] : bare ? [entry, undefined] : (() => {
    const colon = entry.lastIndexOf(':')
    return colon < 0 ? [entry, undefined] : [entry.slice(0, colon), entry.slice(colon + 1)]
  })()
  try {
    return { host: decodeURIComponent(host!), port }
  } catch {
    return refuse('host', 'has a host that is not percent-encoded properly')
  }
}

/** What postgres.js 3.4.9 takes for the resolved settings: a URL without them, and options that it never overrides from the URL or the environment. */
export interface DriverConnection {
  readonly url: string
  readonly options: {
    readonly host: string[]
    readonly port: number[]
    readonly path?: string
    readonly ssl: false | 'prefer' | 'require' | 'verify-full'
    readonly sslnegotiation: 'direct' | null
    readonly target_session_attrs?: TargetSessionAttrs
  }
}

/**
 * The driver's URL and options for `settings` (or a URL, resolved with
 * process.env): the URL keeps the user, password, database and the other
 * parameters (startup settings such as application_name); where and how to
 * connect are options, which postgres.js takes over anything it would read.
 */
export function driverConnection(settings: ConnectionSettings | string): DriverConnection {
  const resolved = typeof settings === 'string' ? resolveConnection(settings) : settings
  const url = new URL(splitHosts(resolved.url).single)
  for (const name of RESOLVED) url.searchParams.delete(name)
  const ssl = resolved.sslmode === 'disable' ? false : resolved.sslmode === 'verify-ca' ? 'verify-full' : resolved.sslmode
  return {
    url: url.href,
    options: {
      host: resolved.hosts.map(({ host }) => host),
      port: resolved.hosts.map(({ port }) => port),
      ...(resolved.socket ? { path: resolved.socket } : {}),
      ssl,
      sslnegotiation: resolved.sslnegotiation === 'direct' ? 'direct' : null,
      ...(resolved.targetSessionAttrs ? { target_session_attrs: resolved.targetSessionAttrs } : {}),
    },
  }
}
