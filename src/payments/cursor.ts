/**
 * Keyset cursor for the payments list: the (created_at, id) of the last row
 * shown. Clients hold it, so a cursor may come back changed: it is signed
 * (HMAC-SHA-256, 128 bits of it) with a key derived from the API key it was
 * given to, so an edited cursor, or one given to another key, is refused
 * here (400), as is anything not exactly what encodeCursor writes with a
 * timestamp PostgreSQL takes; none of it reaches the query (which answered
 * a 500). Every instance with the same API_KEYS checks the same signature;
 * rotating a key ends the cursors given to it (the list starts again).
 */
import { createHash, createHmac, timingSafeEqual } from 'node:crypto'
import { isTimestampText } from '../store/timestamp'

export interface Cursor {
  readonly createdAt: string
  readonly id: string
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/

/** The key cursors given to the holder of `apiKey` are signed with. */
export function cursorKey(apiKey: string): Buffer {
  return createHash('sha256').update('idempotent-post payments cursor v1\u0000').update(apiKey).digest()
}

const signatureOf = (payload: string, key: Buffer): Buffer => createHmac('sha256', key).update(payload).digest().subarray(0, 16)

export function encodeCursor(cursor: Cursor, key: Buffer): string {
  const payload = Buffer.from(`${cursor.createdAt}|${cursor.id}`).toString('base64url')
  return `${payload}.${signatureOf(payload, key).toString('base64url')}`
}

export function decodeCursor(raw: string, key: Buffer): Cursor | undefined {
  const match = /^([A-Za-z0-9_-]{1,200})\.([A-Za-z0-9_-]{22})$/.exec(raw)
  if (!match) return undefined
  const [, payload, signature] = match as unknown as [string, string, string]
  const given = Buffer.from(signature, 'base64url')
  if (given.length !== 16 || !timingSafeEqual(given, signatureOf(payload, key))) return undefined
  const [createdAt, id, ...rest] = Buffer.from(payload, 'base64url').toString('utf8').split('|')
  if (rest.length > 0 || !createdAt || !id || !UUID.test(id) || !isTimestampText(createdAt)) return undefined
  return { createdAt, id }
}

export function isUuid(value: string): boolean {
  return UUID.test(value)
}
