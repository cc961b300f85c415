import type postgres from 'postgres'

/**
 * SPEC invariant 13: the service runs only on a UTF8 database. Elsewhere
 * (SQL_ASCII above all) the payments table's length checks count bytes, so
 * a valid customer of 64 emoji failed the completion after the provider had
 * charged, and every retry charged again: charges without a payment. So the
 * migration and the start-up schema check refuse it before anything else.
 */
export async function requireUtf8(sql: postgres.Sql<any>): Promise<void> {
  const [row] = await sql<{ encoding: string }[]>`select current_setting('server_encoding') as encoding`
  const encoding = row!.encoding
  if (encoding !== 'UTF8') {
    throw new Error(`the database's server_encoding is ${encoding}; the service needs UTF8 (its length checks would count bytes, ` +
      `failing valid customers after the provider charged): create the database with ENCODING 'UTF8' (docs/how-to/production.md)`)
  }
}
