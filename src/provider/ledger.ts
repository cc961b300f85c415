/**
 * The simulator's durable ledger: one SQLite file, one row per charge.
 *
 * Durability: WAL with synchronous=FULL fsyncs the log at every commit, so a
 * charge whose answer left the simulator survives a SIGKILL (or a power cut)
 * of the simulator. NORMAL would be faster but may lose the last commits on a
 * power cut, and a lost charge is exactly the bug this ledger exists to catch.
 *
 * Exactly one charge per idempotency key: the lookup and the insert run in one
 * synchronous transaction. bun:sqlite is synchronous, so no other request of
 * this process can interleave; BEGIN IMMEDIATE takes the write lock up front,
 * so even a second process on the same file cannot slip in between the two,
 * and the UNIQUE constraint is the last line of defence behind both.
 */
import { Database } from 'bun:sqlite'
import { mkdirSync } from 'node:fs'
import { dirname } from 'node:path'
import { sameTerms, type Charge, type ChargeRequest } from './charge'

export type RecordResult =
  /** A new charge was made for this key. */
  | { readonly kind: 'created'; readonly charge: Charge }
  /** The key was seen with the same terms: the charge made then. */
  | { readonly kind: 'replayed'; readonly charge: Charge }
  /** The key was seen with other terms: nothing is charged. */
  | { readonly kind: 'mismatch'; readonly charge: Charge }

export interface Ledger {
  record(idempotencyKey: string, request: ChargeRequest): RecordResult
  /** Every charge, or every charge of one customer, oldest first. */
  list(customer?: string): Charge[]
  close(): void
}

/**
 * 5 s: a second process on the same file (tests, an operator's sqlite3) holds
 * the write lock for a few ms per commit; waiting beats failing a charge.
 */
const BUSY_TIMEOUT_MS = 5_000

const COLUMNS = 'id, amount, currency, customer, created_at'

export function openLedger(path: string): Ledger {
  if (path !== ':memory:') mkdirSync(dirname(path), { recursive: true })
  const db = new Database(path, { create: true, strict: true })
  db.run(`PRAGMA busy_timeout = ${BUSY_TIMEOUT_MS}`)
  db.run('PRAGMA journal_mode = WAL')
  db.run('PRAGMA synchronous = FULL')
  db.run(`
    create table if not exists charges (
      id              text primary key,
      idempotency_key text not null unique check (length(idempotency_key) between 1 and 255),
      amount          integer not null check (amount >= 1),
      currency        text not null check (length(currency) = 3),
      customer        text not null check (length(customer) between 1 and 64),
      created_at      text not null
    )`)
  // Listing by customer in insertion order (rowid, not created_at, which can tie): an
  // index entry ends with the rowid, so this index serves the order by too.
  db.run('create index if not exists charges_customer on charges (customer)')

  const byKey = db.query<Charge, [string]>(`select ${COLUMNS} from charges where idempotency_key = ?`)
  const insert = db.query(`insert into charges (id, idempotency_key, amount, currency, customer, created_at)
                           values ($id, $key, $amount, $currency, $customer, $created_at)`)
  const all = db.query<Charge, []>(`select ${COLUMNS} from charges order by rowid`)
  const ofCustomer = db.query<Charge, [string]>(`select ${COLUMNS} from charges where customer = ? order by rowid`)

  const record = db.transaction((key: string, request: ChargeRequest): RecordResult => {
    const existing = byKey.get(key)
    if (existing) return { kind: sameTerms(existing, request) ? 'replayed' : 'mismatch', charge: existing }
    const charge: Charge = { id: newChargeId(), ...request, created_at: new Date().toISOString() }
    insert.run({ ...charge, key })
    return { kind: 'created', charge }
  })

  return {
    record: (key, request) => record.immediate(key, request),
    list: (customer) => (customer === undefined ? all.all() : ofCustomer.all(customer)),
    close: () => db.close(),
  }
}

/** `ch_` and 24 hex characters (96 random bits): unguessable, like a real provider's ids. */
function newChargeId(): string {
  return `ch_${Buffer.from(crypto.getRandomValues(new Uint8Array(12))).toString('hex')}`
}
