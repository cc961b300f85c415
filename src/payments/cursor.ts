/**
 * Keyset cursor for the payments list: the (created_at, id) of the last row
 * shown. Clients hold it, so a cursor may come back changed: anything that is
 * not exactly what encodeCursor writes, with a timestamp PostgreSQL takes, is
 * refused here (400), never handed to the query (which answered a 500).
 */
import { isTimestampText } from '../store/timestamp'

export interface Cursor {
  readonly createdAt: string
  readonly id: string
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/

export function encodeCursor(cursor: Cursor): string {
  return Buffer.from(`${cursor.createdAt}|${cursor.id}`).toString('base64url')
}

export function decodeCursor(raw: string): Cursor | undefined {
  if (!/^[A-Za-z0-9_-]{1,200}$/.test(raw)) return undefined
  const [createdAt, id, ...rest] = Buffer.from(raw, 'base64url').toString('utf8').split('|')
  if (rest.length > 0 || !createdAt || !id || !UUID.test(id) || !isTimestampText(createdAt)) return undefined
  return { createdAt, id }
}

export function isUuid(value: string): boolean {
  return UUID.test(value)
}
