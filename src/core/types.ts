import type postgres from 'postgres'

/** A postgres.js handle: the pool, a reserved connection or a transaction. */
export type Sql = postgres.Sql<Record<string, never>> | postgres.TransactionSql<Record<string, never>>

/** What identifies one logical request: the key within its tenant, and what was asked. */
export interface RequestIdentity {
  readonly tenant: string
  readonly key: string
  readonly method: string
  readonly path: string
  /** sha256 hex of method, path and canonical body (see fingerprint.ts). */
  readonly fingerprint: string
}

/** The answer stored with a completed key and replayed byte for byte. */
export interface StoredResponse {
  readonly status: number
  readonly headers: Readonly<Record<string, string>>
  readonly body: string
}

/** Proof of ownership of a key: only the holder of the current lease may complete it. */
export interface Lease {
  readonly tenant: string
  readonly key: string
  /** 63 random bits drawn by the service (lease-id.ts): never handed out twice, even across a failover. */
  readonly lease: string
  readonly attempts: number
  /** The logical request (kept across reclaims and releases): the downstream key derives from it. */
  readonly requestId: string
}

/** Time-based operations take an optional `now`, so tests can move the clock instead of sleeping. */
export interface Clock {
  readonly now?: Date | undefined
}

export interface Timing extends Clock {
  readonly ttlSeconds: number
  readonly retentionSeconds: number
}

/** Who claims: the process's heartbeat id (core/processes.ts), or null when it has none. */
export interface Claimant extends Timing {
  readonly owner?: string | null | undefined
  /** The lease to claim under, drawn by the caller before the claim is sent (lease-id.ts). @default a new one */
  readonly lease?: string | undefined
  /** A small summary of the request chosen by the route (customer, amount), stored with the claim for operators. */
  readonly summary?: Readonly<Record<string, string | number | boolean | null>> | null | undefined
  /** The HTTP request's id (X-Request-Id, or the one the service answers with), stored with the key for operators: the id of its log lines. */
  readonly httpRequestId?: string | null | undefined
}

/** The outcome of trying to claim a key: the HTTP layer maps each kind to one status. */
export type ClaimResult =
  | { readonly kind: 'created'; readonly lease: Lease }
  | { readonly kind: 'reclaimed'; readonly lease: Lease }
  | { readonly kind: 'replay'; readonly response: StoredResponse; readonly ageSeconds: number }
  | { readonly kind: 'in_progress'; readonly retryAfterSeconds: number }
  | { readonly kind: 'mismatch'; readonly status: 'processing' | 'done' | 'released' }

export type KeyStatus = 'processing' | 'done' | 'released'
