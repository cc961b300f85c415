/**
 * The gateway's route table: which requests are claimed, where they go, and
 * what each kind of upstream answer does to the key. The first route whose
 * method and path pattern match a request decides; a request no route claims
 * is forwarded untouched to the default upstream.
 *
 * A path pattern is a path whose segments may be `:name` (one segment) or a
 * final `*` (any rest, none included): `/items`, `/orders/:id/pay`, `/api/*`,
 * `*` (every path).
 */

/** What an unknown outcome (the request was sent, the answer never came) does to the key. */
export type UnknownOutcome = 'hold' | 'release'
/** What an upstream answer of a status class does: stored and replayed, or not stored and the key released. */
export type AnswerRule = 'store' | 'release'

export interface GatewayRoute {
  /** For metrics, logs and the key rows' `route`: the pattern unless named. */
  readonly name: string
  /** Methods claimed (upper case). */
  readonly methods: readonly string[]
  readonly pattern: string
  /** Base URL the request is forwarded to (its path and query are appended). */
  readonly upstream: string
  /** A claimed key's TTL: how long it may process, and how long an unknown outcome holds it. */
  readonly ttlSeconds: number
  /** The longest one forward may take (the claim's deadline, at most the TTL less its margin). */
  readonly timeoutMs: number | undefined
  /** Request bodies over this are refused with 413. */
  readonly maxBodyBytes: number
  /** Answers over this are answered, not stored: the key is released (and counted). */
  readonly maxStoredBytes: number
  readonly on4xx: AnswerRule
  readonly on5xx: AnswerRule
  readonly unknown: UnknownOutcome
  /** Compiled pattern. */
  readonly matches: (path: string) => boolean
}

/** What a route file gives per route: everything but `pattern` optional, defaults from the settings. */
export interface RouteSpec {
  readonly name?: string
  readonly methods?: readonly string[]
  readonly path: string
  readonly upstream?: string
  readonly ttlSeconds?: number
  readonly timeoutMs?: number
  readonly maxBodyBytes?: number
  readonly maxStoredBytes?: number
  readonly on4xx?: AnswerRule
  readonly on5xx?: AnswerRule
  readonly unknown?: UnknownOutcome
}

export interface RouteDefaults {
  readonly upstream: string | undefined
  readonly ttlSeconds: number
  readonly maxBodyBytes: number
  readonly maxStoredBytes: number
}

/** POST and PATCH: the methods that are not idempotent by definition (RFC 9110 §9.2.2), as the draft's gateways claim. */
export const DEFAULT_METHODS: readonly string[] = ['POST', 'PATCH']

const SPEC_FIELDS = new Set(['name', 'methods', 'path', 'upstream', 'ttlSeconds', 'timeoutMs', 'maxBodyBytes', 'maxStoredBytes', 'on4xx', 'on5xx', 'unknown'])

export class RouteError extends Error {
  constructor(message: string) {
    super(message)
    this.name = 'RouteError'
  }
}

/** `pattern` as a matcher of request paths. */
export function compilePattern(pattern: string): (path: string) => boolean {
  if (pattern === '*') return () => true
  if (!pattern.startsWith('/')) throw new RouteError(`path ${JSON.stringify(pattern)} must start with / (or be *)`)
  const segments = pattern.split('/').slice(1)
  const parts = segments.map((segment, i) => {
    if (segment === '*') {
      if (i !== segments.length - 1) throw new RouteError(`path ${JSON.stringify(pattern)}: * only as the last segment`)
      return '(?:/.*)?'
    }
    if (segment.startsWith(':')) return '/[^/]+'
    return `/${segment.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}`
  })
  const last = segments[segments.length - 1]
  const regex = new RegExp(`^${parts.join('')}${last === '*' ? '' : '/?'}$`)
  return (path) => regex.test(path)
}

function checkUrl(value: unknown, where: string): string {
  if (typeof value !== 'string') throw new RouteError(`${where}: upstream must be a URL string`)
  let url: URL
  try {
    url = new URL(value)
  } catch {
    throw new RouteError(`${where}: upstream ${JSON.stringify(value.slice(0, 80))} is not a URL`)
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new RouteError(`${where}: upstream must be http or https`)
  if (url.search || url.hash) throw new RouteError(`${where}: upstream must have no query or fragment`)
  return url.toString().replace(/\/$/, '')
}

function whole(value: unknown, where: string, min: number, max: number): number {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < min || value > max)
    throw new RouteError(`${where} must be a whole number from ${min} to ${max}`)
  return value
}

function oneOf<T extends string>(value: unknown, where: string, choices: readonly T[]): T {
  if (typeof value !== 'string' || !(choices as readonly string[]).includes(value)) throw new RouteError(`${where} must be one of ${choices.join(', ')}`)
  return value as T
}

/** One route from its spec, checked; `where` names it in a refusal ("route 2"). */
export function route(spec: RouteSpec, defaults: RouteDefaults, where = 'route'): GatewayRoute {
  for (const field of Object.keys(spec)) if (!SPEC_FIELDS.has(field)) throw new RouteError(`${where}: unknown field ${JSON.stringify(field)}`)
  if (typeof spec.path !== 'string') throw new RouteError(`${where}: path is required`)
  const methods = (spec.methods ?? DEFAULT_METHODS).map((method) => {
    if (typeof method !== 'string' || !/^[A-Za-z]{1,16}$/.test(method)) throw new RouteError(`${where}: methods must be HTTP method names`)
    return method.toUpperCase()
  })
  const upstream = spec.upstream ?? defaults.upstream
  if (upstream === undefined) throw new RouteError(`${where}: no upstream (set UPSTREAM_URL or the route's upstream)`)
  const ttlSeconds = spec.ttlSeconds === undefined ? defaults.ttlSeconds : whole(spec.ttlSeconds, `${where}: ttlSeconds`, 1, 7 * 86_400)
  return {
    name: spec.name === undefined ? spec.path : String(spec.name).slice(0, 64),
    methods,
    pattern: spec.path,
    upstream: checkUrl(upstream, where),
    ttlSeconds,
    timeoutMs: spec.timeoutMs === undefined ? undefined : whole(spec.timeoutMs, `${where}: timeoutMs`, 1, ttlSeconds * 1000),
    maxBodyBytes: spec.maxBodyBytes === undefined ? defaults.maxBodyBytes : whole(spec.maxBodyBytes, `${where}: maxBodyBytes`, 1, 64 * 1024 * 1024),
    maxStoredBytes: spec.maxStoredBytes === undefined ? defaults.maxStoredBytes : whole(spec.maxStoredBytes, `${where}: maxStoredBytes`, 0, 64 * 1024 * 1024),
    on4xx: spec.on4xx === undefined ? 'store' : oneOf(spec.on4xx, `${where}: on4xx`, ['store', 'release']),
    on5xx: spec.on5xx === undefined ? 'release' : oneOf(spec.on5xx, `${where}: on5xx`, ['store', 'release']),
    unknown: spec.unknown === undefined ? 'hold' : oneOf(spec.unknown, `${where}: unknown`, ['hold', 'release']),
    matches: compilePattern(spec.path),
  }
}

/** A route table from a parsed JSON file: `{ "routes": [RouteSpec, ...] }` or the array itself. */
export function routeTable(json: unknown, defaults: RouteDefaults): GatewayRoute[] {
  const list = Array.isArray(json) ? json : (json as { routes?: unknown } | null)?.routes
  if (!Array.isArray(list) || list.length === 0) throw new RouteError('expected {"routes": [...]} with at least one route')
  return list.map((spec, i) => {
    if (typeof spec !== 'object' || spec === null || Array.isArray(spec)) throw new RouteError(`route ${i + 1}: must be an object`)
    return route(spec as RouteSpec, defaults, `route ${i + 1}`)
  })
}

/** The default table: POST and PATCH to any path, claimed and forwarded to UPSTREAM_URL. */
export function defaultTable(defaults: RouteDefaults): GatewayRoute[] {
  return [route({ path: '*', name: 'default' }, defaults)]
}

/** The route that claims this request, if any. */
export function routeFor(table: readonly GatewayRoute[], method: string, path: string): GatewayRoute | undefined {
  return table.find((candidate) => candidate.methods.includes(method) && candidate.matches(path))
}
