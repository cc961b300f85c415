/**
 * What an app gives the idempotency plugin, and what the plugin gives the
 * route's steps: its options, the route (schema, `act`, `record` or
 * `recordRows`, `summary`) and the contexts of the steps.
 */
import type postgres from 'postgres'
import type { TSchema } from '@sinclair/typebox'
import type { TransactionSql } from '../core/complete'
import type { RowWrites } from '../core/complete-rows'
import type { IdempotencyHooks } from './outcomes'
import type { InFlight } from './in-flight'
import type { RouteDocs } from './operation'
import type { ProblemCatalogue } from './problem'
import type { Logger } from '../log'

/** A postgres.js handle (`postgres(url)`), with the schema of sql/ applied to its database. */
export type Database = postgres.Sql<Record<string, never>>

/**
 * Two handles on one database (they may be the same one). Kept apart in the
 * service so a burst of completions never starves claims and 409s of
 * connections (No blocked connections, docs/explanation/invariants.md); engine's `openPools` makes both, with the session
 * settings that bound every statement and transaction (Bounded processing).
 */
export interface IdempotencyPools {
  /** Single statements in autocommit: claims, replays, releases. */
  readonly short: Database
  /** The completing transactions, each held for a couple of round trips. */
  readonly work: Database
}

export interface IdempotencyOptions {
  readonly pools: IdempotencyPools
  /** The tenant of a request (from its credentials), or undefined for 401. Keys are scoped by it. */
  readonly tenant: (request: Request) => string | undefined
  /** The longest a request may process; a processing key older than this may be reclaimed. @default 30 */
  readonly ttlSeconds?: number
  /** How long a completed key is replayed. @default 86400 */
  readonly retentionSeconds?: number
  /** Larger bodies get 413. @default 65536 */
  readonly maxBodyBytes?: number
  /** Told each request's outcome, reclaims, lost claims and releases (for metrics). @default none */
  readonly hooks?: IdempotencyHooks
  /**
   * Counts requests from their acceptance, so a shutdown can drain them (no
   * new claim starts while it does), and lists the leases being worked on
   * for the heartbeat (per-request liveness).
   */
  readonly inFlight?: InFlight
  /** This process's heartbeat id (core/processes.ts), recorded as the owner of the keys it claims. */
  readonly owner?: () => string | undefined
  /** Tests move the clock with this instead of sleeping. @default the database's now() */
  readonly now?: () => Date | undefined
  /** Where the line about each failed, deadline-hit or fenced request goes (with its request id). @default src/log.ts's logger */
  readonly log?: Logger
  /**
   * Completed keys' answers kept in this process, so a replay needs no
   * database (http/replay-cache.ts: safe, a done key is immutable for its
   * retention); 0 turns it off. Off when `now` moves the clock (tests). @default 10000
   */
  readonly replayCacheEntries?: number
}

/** What the recording step returns: stored and replayed byte for byte, 4xx included (a business refusal). */
export interface HandlerResult {
  readonly status: number
  readonly body: unknown
  readonly headers?: Readonly<Record<string, string>>
}

export interface ActContext<Body> {
  readonly body: Body
  readonly tenant: string
  readonly key: string
  readonly request: Request
  /** Fires at the request's deadline, a little before the key's TTL ends: pass it to every foreign call. */
  readonly signal: AbortSignal
  /**
   * Send this to the foreign service as its idempotency key. It is the same on
   * every re-execution of this request (a reclaim, a retry after a failure or
   * a lost answer), so the service returns what it did the first time instead
   * of doing it again; it differs between tenants and between requests.
   */
  readonly idempotencyKey: string
  /** 1 for the first execution of this request, more for re-executions. */
  readonly attempt: number
}

export interface RecordContext<Body, Result> {
  readonly body: Body
  readonly tenant: string
  readonly key: string
  /** What the external step returned. */
  readonly result: Result
  /** The transaction that completes the key: write the entities in it, and nothing slow. */
  readonly tx: TransactionSql
}

export interface RowsContext<Body, Result> {
  readonly body: Body
  readonly tenant: string
  readonly key: string
  /** What the external step returned. */
  readonly result: Result
}

/** What a declarative recording step returns: the answer to store, and the rows to insert with it. */
export interface RowsResult extends HandlerResult {
  /**
   * Rows to insert, by table (`{ payments: [{ id, tenant, ... }] }`), in the
   * same statement that completes the key: a column a row leaves out gets
   * its default. Names are checked (lower-case identifiers).
   */
  readonly insert: RowWrites
}

/** What the route keeps of a request at claim, for operators: a few small fields (a payment's customer and amount). */
export type RequestSummary = Readonly<Record<string, string | number | boolean | null>>

export type Validation<Body> = { ok: true; value: Body } | { ok: false; errors: string[] }

export interface IdempotentRoute<Body, Result> {
  /** Route path, also the `route` of the hooks' events. */
  readonly path: string
  /**
   * The body's schema (TypeBox, i.e. JSON Schema): checks the body when no
   * `validate` is given, and is the request body of the OpenAPI document.
   */
  readonly body?: TSchema & { static: Body }
  /** Checks the parsed JSON body (`text`: as sent); errors become a 400 and nothing is stored. @default checks `body` */
  readonly validate?: (body: unknown, text: string) => Validation<Body>
  /** What the OpenAPI document says of this route besides what the plugin knows: its own answers (the 201), summary, tags. */
  readonly docs?: RouteDocs
  /**
   * The route's own problem codes (`defineProblems`): an error thrown by `act`
   * (or the recording step) whose `code` is one of them (an IdempotencyError's
   * `PROVIDER_FAILED` is `provider-failed`) is answered with it. A
   * `ProblemError` is answered with its problem whatever its catalogue; any
   * other error of the route's code is `internal` (500). @default none
   */
  readonly problems?: ProblemCatalogue<string>
  /**
   * The external step: foreign calls (a payment provider), with no database
   * connection held and no transaction open. Pass `signal` and
   * `idempotencyKey` on. Throwing fails the request (5xx) and releases the key.
   * What it throws is the route's failure, whatever its code: a refused or
   * reset connection to the route's own backend, or an error of the app's own
   * database pool, is answered 500 (or as above), never the engine's
   * `database-unavailable`, and logged as "the route's act failed: ...".
   */
  readonly act: (context: ActContext<Body>) => Promise<Result>
  /**
   * The recording step, declarative (give this or `record`): the answer to
   * store and the rows to insert, written with the key's completion in one
   * autocommit statement, batched with other requests' (core/complete-rows.ts).
   * Two statements per fresh request in all, claim included. A status of 500
   * or more is not stored: nothing is written and the key is released.
   */
  readonly recordRows?: (context: RowsContext<Body, Result>) => RowsResult | Promise<RowsResult>
  /**
   * The recording step, transactional (give this or `recordRows`): the
   * business writes through `tx`, in the transaction that completes the key,
   * and the answer to store; for writes that need one (reads, updates,
   * several dependent statements). A status of 500 or more is not stored:
   * the writes roll back and the key is released. An error of a statement
   * sent through `tx` is the engine's (a lost connection is sent again, a
   * lock not obtained in time answers 503), even when thrown on by this
   * code; any other error it throws is the route's failure, as for `act`.
   */
  readonly record?: (context: RecordContext<Body, Result>) => Promise<HandlerResult>
  /**
   * A summary of the request kept with its claim (at no extra statement), so
   * an operator can tell what a stuck or released request was: the
   * provider-side fields to look it up by. Keep it small (at most 1 kB). @default none
   */
  readonly summary?: (body: Body) => RequestSummary
}

