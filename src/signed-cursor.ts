/**
 * Signed list cursors, one rule for every list that hands one out (the
 * payments API, the admin's lists): `<base64url payload>.<base64url tag>`,
 * the tag HMAC-SHA-256 of the payload cut to 128 bits. A client holds the
 * cursor, so it may come back edited; only one this service signed opens,
 * and what it holds then still gets its own shape check from the caller.
 * Who holds the key differs by list (payments/cursor.ts, operations/cursor.ts).
 */
import { createHash, createHmac, timingSafeEqual } from 'node:crypto'

/** 128 bits: a forger's odds per try are 2^-128; the cursor stays short. */
const TAG_BYTES = 16
const TAG_CHARACTERS = 22

/**
 * The signing key of one kind of cursor, from a secret: `purpose` names the
 * list, so a cursor of one list never opens another even under one secret.
 */
export function cursorSigningKey(purpose: string, secret: string | Uint8Array): Buffer {
  return createHash('sha256').update(`idempotent-post ${purpose} cursor v1\u0000`).update(secret).digest()
}

const tagOf = (payload: string, key: Buffer): Buffer => createHmac('sha256', key).update(payload).digest().subarray(0, TAG_BYTES)

/** The cursor for `text` (the list's own encoding of where a page ended). */
export function signCursor(text: string, key: Buffer): string {
  const payload = Buffer.from(text).toString('base64url')
  return `${payload}.${tagOf(payload, key).toString('base64url')}`
}

/**
 * The text `raw` was signed with, or undefined when it is not a cursor this
 * key signed (edited, unsigned, another list's or another key's, or longer
 * than `maxPayload` base64url characters). Compared in constant time.
 */
export function openCursor(raw: string, key: Buffer, maxPayload: number): string | undefined {
  const dot = raw.indexOf('.')
  if (dot < 1 || dot > maxPayload || raw.length !== dot + 1 + TAG_CHARACTERS) return undefined
  const payload = raw.slice(0, dot)
  const tag = raw.slice(dot + 1)
  if (!/^[A-Za-z0-9_-]+$/.test(payload) || !/^[A-Za-z0-9_-]+$/.test(tag)) return undefined
  // Compared as text: base64url spells 16 bytes 16 ways in its last character, and only ours is the cursor.
  if (!timingSafeEqual(Buffer.from(tag), Buffer.from(tagOf(payload, key).toString('base64url')))) return undefined
  return Buffer.from(payload, 'base64url').toString('utf8')
}
