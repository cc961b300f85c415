/**
 * Admin sessions in the database (sql/00005_admin_sessions.sql): one row per
 * signed-in browser, found by the SHA-256 of the random token its cookie
 * carries. Signing out or ending a session deletes the row, so the cookie
 * opens nothing any more, on every process at once. A session ends by itself
 * after SESSION_IDLE_SECONDS without a request, and SESSION_MAX_SECONDS after
 * it began, whatever its use.
 *
 * Every time-based statement takes an optional `now` (tests move the clock
 * instead of sleeping); the database's now() otherwise, one clock for every
 * process.
 */
import { createHash, createHmac } from 'node:crypto'
import type { Sql } from '../core/types'

/** SPEC: a session idle for 30 minutes ends. */
export const SESSION_IDLE_SECONDS = 30 * 60
/** Eight hours: one on-call shift; after it the operator signs in again, however active. */
export const SESSION_MAX_SECONDS = 8 * 3600
/**
 * Open sessions one operator may have: each sign-in past it ends their
 * least recently used one. Ten browsers or scripts at once is already a lot
 * for one person; an unbounded number is a table a leaked token can fill.
 */
export const MAX_SESSIONS_PER_OPERATOR = 10
/** 32 random bytes, base64url: 43 characters. */
const TOKEN_PATTERN = /^[A-Za-z0-9_-]{43}$/

export interface Session {
  /** The session's public handle (the sessions list, ending one). */
  readonly id: string
  /** The operator the token named. */
  readonly operator: string
  /** What they typed at sign-in for the audit trail, if anything. */
  readonly note: string | null
  readonly address: string
  readonly startedAt: Date
  readonly lastSeenAt: Date
  /** The tag of the credential it was opened with (operators.ts bindingOf); null for a session of an earlier release. */
  readonly binding: Buffer | null
  /** This session's CSRF token (derived from its secret token, so it is known to this browser only). */
  readonly csrf: string
}

export type SessionSummary = Omit<Session, 'csrf'>

interface Row {
  id: string
  operator: string
  note: string | null
  address: string
  started_at: Date
  last_seen_at: Date
  credential: Buffer | null
}

const hashOf = (token: string): Buffer => createHash('sha256').update(token).digest()
/** A key derived from the session token: another session (or site) cannot compute it. */
export const csrfOf = (token: string): string => createHmac('sha256', token).update('idempotent-post admin csrf v2').digest('base64url')

const clock = (sql: Sql, now: Date | undefined) => sql`coalesce(${now ?? null}::timestamptz, now())`
/** The columns of a session row, as every statement here returns them (nested with sql.unsafe: not a parameter). */
const COLUMNS = 'id, operator, note, address, started_at, last_seen_at, credential'

function sessionOf(row: Row, token: string): Session {
  return { ...summaryOf(row), csrf: csrfOf(token) }
}

function summaryOf(row: Row): SessionSummary {
  return { id: String(row.id), operator: row.operator, note: row.note, address: row.address, startedAt: row.started_at, lastSeenAt: row.last_seen_at, binding: row.credential }
}

/**
 * Opens a session for `operator`; returns the cookie's token (never stored)
 * and the session. Sessions that have ended by time are deleted first: the
 * table holds open sessions and, at most, those since the last sign-in.
 */
export async function startSession(sql: Sql, who: { operator: string; binding: Buffer; note?: string | undefined; address: string }, now?: Date): Promise<{ token: string; session: Session }> {
  const token = Buffer.from(crypto.getRandomValues(new Uint8Array(32))).toString('base64url')
  const at = clock(sql, now)
  await sql`delete from admin_sessions
             where last_seen_at <= ${at} - make_interval(secs => ${SESSION_IDLE_SECONDS})
                or started_at <= ${at} - make_interval(secs => ${SESSION_MAX_SECONDS})`
  const [row] = await sql<Row[]>`
    insert into admin_sessions (token_hash, operator, credential, note, address, started_at, last_seen_at)
    values (${hashOf(token)}, ${who.operator}, ${who.binding}, ${who.note || null}, ${who.address.slice(0, 64) || 'unknown'}, ${at}, ${at})
    returning ${sql.unsafe(COLUMNS)}`
  await sql`delete from admin_sessions
             where operator = ${who.operator}
               and id not in (select id from admin_sessions where operator = ${who.operator}
                               order by last_seen_at desc, id desc limit ${MAX_SESSIONS_PER_OPERATOR})`
  return { token, session: sessionOf(row!, token) }
}

/**
 * The open session of a cookie's token, marked as used now; undefined when
 * there is none (malformed, signed out, ended, idle too long, too old), or
 * when `revoked` says its credential is no longer configured (its row then
 * goes, as an ended one's does). One UPDATE, on the unique index: an admin
 * request costs one row write.
 */
export async function useSession(sql: Sql, token: string | undefined, revoked: (session: SessionSummary) => unknown, now?: Date, options: { renew?: boolean } = {}): Promise<Session | undefined> {
  if (!token || !TOKEN_PATTERN.test(token)) return undefined
  const at = clock(sql, now)
  // `renew: false` (a page's automatic reload): the session must still be open, but this is not the
  // operator's activity, so it does not push the idle limit (an unattended browser ends its session).
  const [row] = await sql<Row[]>`
    update admin_sessions set last_seen_at = ${options.renew === false ? sql`last_seen_at` : sql`greatest(last_seen_at, ${at})`}
     where token_hash = ${hashOf(token)}
       and last_seen_at > ${at} - make_interval(secs => ${SESSION_IDLE_SECONDS})
       and started_at > ${at} - make_interval(secs => ${SESSION_MAX_SECONDS})
    returning ${sql.unsafe(COLUMNS)}`
  if (row) {
    const session = sessionOf(row, token)
    if (!revoked(session)) return session
    await sql`delete from admin_sessions where id = ${row.id}`
    return undefined
  }
  // Ended by time: the row goes now, so the session stays ended whatever a clock does next.
  await sql`delete from admin_sessions
             where token_hash = ${hashOf(token)}
               and (last_seen_at <= ${at} - make_interval(secs => ${SESSION_IDLE_SECONDS})
                    or started_at <= ${at} - make_interval(secs => ${SESSION_MAX_SECONDS}))`
  return undefined
}

/** Signing out: the session of this token ends. */
export async function endSessionByToken(sql: Sql, token: string): Promise<boolean> {
  if (!TOKEN_PATTERN.test(token)) return false
  return (await sql`delete from admin_sessions where token_hash = ${hashOf(token)}`).count > 0
}

/** An operator ends a session from the list; returns what it was, if it was open. */
export async function endSessionById(sql: Sql, id: string): Promise<SessionSummary | undefined> {
  const [row] = await sql<Row[]>`delete from admin_sessions where id = ${id} returning ${sql.unsafe(COLUMNS)}`
  return row ? summaryOf(row) : undefined
}

/** Open sessions, most recently used first. */
export async function openSessions(sql: Sql, now?: Date): Promise<SessionSummary[]> {
  const at = clock(sql, now)
  const rows = await sql<Row[]>`
    select ${sql.unsafe(COLUMNS)} from admin_sessions
     where last_seen_at > ${at} - make_interval(secs => ${SESSION_IDLE_SECONDS})
       and started_at > ${at} - make_interval(secs => ${SESSION_MAX_SECONDS})
     order by last_seen_at desc, id desc
     limit 200`
  return rows.map(summaryOf)
}
