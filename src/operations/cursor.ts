/**
 * The admin's list cursors (keys in processing, released keys), opaque and
 * signed: the page, the JSON API and the CLI hand out the same ones and take
 * each other's; an edited one is refused (400, exit 2), so what a cursor
 * holds (a tenant, a key) always came from this list.
 *
 * Signed by the payments cursor's rule (signed-cursor.ts) with a secret kept
 * in the database (idempotency_secrets, sql/engine/00009): the CLI runs in
 * another process, maybe on another machine, and the database is the one
 * thing it shares with every instance. Read at each use, never cached, so a
 * rotation (deleting the row) holds at once everywhere.
 */
import { randomBytes } from 'node:crypto'
import type { Sql } from '../core/types'
import { cursorSigningKey, openCursor, signCursor } from '../signed-cursor'
import { isTimestampText } from '../store/timestamp'
import { OperationInputError } from './context'

/** Where a page of a key list ended: its order is (an instant, tenant, key), unique. */
export interface KeyCursor {
  /** The list's instant (stale_at for keys in processing, released_at for released ones) as PostgreSQL text, exact to the microsecond (a JS Date keeps only milliseconds). */
  readonly at: string
  readonly tenant: string
  readonly key: string
}

/** Which list a cursor belongs to: one list's cursor never opens another. */
export type CursorList = 'keys' | 'released'

/** A key of 255 characters, each escaped in JSON, fits with room (about 860 characters). */
export const MAX_CURSOR_LENGTH = 1024
const SHAPE = /^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]{22}$/
const PURPOSE = 'admin-cursor'
/** 256 bits: more than the HMAC's 128-bit tag needs. */
const SECRET_BYTES = 32

async function readSecret(sql: Sql): Promise<Buffer | undefined> {
  const [row] = await sql<{ secret: Buffer }[]>`select secret from idempotency_secrets where purpose = ${PURPOSE}`
  return row?.secret
}

/** The secret, made once per database by whoever needs it first (two at once: one insert wins, both read it). */
async function secretToSign(sql: Sql): Promise<Buffer> {
  const found = await readSecret(sql)
  if (found) return found
  await sql`insert into idempotency_secrets (purpose, secret) values (${PURPOSE}, ${randomBytes(SECRET_BYTES)}) on conflict (purpose) do nothing`
  const made = await readSecret(sql)
  if (!made) throw new Error('the admin cursor secret was deleted while it was being made; ask again')
  return made
}

const keyOf = (list: CursorList, secret: Buffer) => cursorSigningKey(`admin ${list}`, secret)

/** The signed cursor of the page after `cursor`. */
export async function encodeCursor(sql: Sql, list: CursorList, cursor: KeyCursor): Promise<string> {
  return signCursor(JSON.stringify([cursor.at, cursor.tenant, cursor.key]), keyOf(list, await secretToSign(sql)))
}

/**
 * The cursor, or an OperationInputError when this list did not give it out:
 * edited, unsigned, another list's, signed before a rotation, or holding
 * what the query would refuse (a changed timestamp included: 400, never a
 * database error). Malformed text is refused before the secret is read.
 */
export async function decodeCursor(sql: Sql, list: CursorList, raw: string): Promise<KeyCursor> {
  const bad = new OperationInputError('cursor is not one this list gave out')
  if (raw.length > MAX_CURSOR_LENGTH || !SHAPE.test(raw)) throw bad
  const secret = await readSecret(sql)
  const text = secret && openCursor(raw, keyOf(list, secret), MAX_CURSOR_LENGTH)
  if (text === undefined) throw bad
  let value: unknown
  try {
    value = JSON.parse(text)
  } catch {
    throw bad
  }
  if (!Array.isArray(value) || value.length !== 3 || !value.every((part) => typeof part === 'string')) throw bad
  const [at, tenant, key] = value as [string, string, string]
  if (!isTimestampText(at) || tenant.length < 1 || tenant.length > 64 || key.length < 1 || key.length > 255) throw bad
  if ((tenant + key).includes('\u0000')) throw bad
  return { at, tenant, key }
}
