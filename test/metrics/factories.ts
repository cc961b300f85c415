import type postgres from 'postgres'

/** Any valid fingerprint: 64 hex characters derived from a label. */
export function fingerprintOf(label: string): string {
  return new Bun.CryptoHasher('sha256').update(label).digest('hex')
}

export interface KeyRow {
  tenant?: string
  key?: string
  path?: string
  fingerprint?: string
  status: 'processing' | 'done'
  /** When the lease was taken (processing) or the key completed (done). */
  at: Date
}

/** Puts a key in any state directly, as a dead worker or an old completion would have left it. */
export async function createKey(sql: postgres.Sql, row: KeyRow): Promise<void> {
  const done = row.status === 'done'
  await sql`
    insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at,
                                  completed_at, response_status, response_headers, response_body)
    values (${row.tenant ?? 'acme'}, ${row.key ?? crypto.randomUUID()}, 'POST', ${row.path ?? '/api/payments'},
            ${row.fingerprint ?? fingerprintOf(crypto.randomUUID())}, ${row.status}, ${row.at}, ${row.at},
            ${done ? row.at : null}, ${done ? 201 : null}, ${done ? sql.json({}) : null}, ${done ? '{}' : null})`
}

/** The value of one sample in a Prometheus text exposition, or undefined. */
export function sample(text: string, name: string, labels: Record<string, string> = {}): number | undefined {
  for (const line of text.split('\n')) {
    if (line.startsWith('#')) continue
    const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$/.exec(line)
    if (!match || match[1] !== name) continue
    const present = Object.fromEntries([...(match[3] ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)].map((m) => [m[1], m[2]]))
    if (Object.entries(labels).every(([k, v]) => present[k] === v) && Object.keys(present).length === Object.keys(labels).length)
      return Number(match[4])
  }
  return undefined
}
