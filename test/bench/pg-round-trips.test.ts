/**
 * The bench's wire counter (bench/pg-round-trips.ts) counts what the issue's
 * targets are about: a multi-row statement is one statement, a statement
 * pipelined behind an unanswered one is no extra round trip, BEGIN ... COMMIT
 * is one transaction, each autocommit statement one, and per statement text.
 * Through postgres.js on a real PostgreSQL, as the service talks to it.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import postgres from 'postgres'
import { difference, startRoundTripCounter, type Counts, type RoundTripCounter } from '../../bench/pg-round-trips'
import { createTestDatabase, type TestDatabase } from '../support/db'

let db: TestDatabase
let counter: RoundTripCounter
let sql: postgres.Sql
beforeAll(async () => {
  db = await createTestDatabase('bench_wire')
  await db.sql`create table wire (id int primary key, note text)`
  counter = await startRoundTripCounter(db.url)
  sql = postgres(counter.url, { max: 1, onnotice: () => undefined })
  // Warm: prepared statements are described once per connection.
  await sql`select 1 as one`
})
afterAll(async () => {
  await sql?.end({ timeout: 1 })
  counter?.stop()
  await db?.drop()
})

async function counted(work: () => Promise<unknown>): Promise<Counts> {
  const before = counter.snapshot()
  await work()
  return difference(counter.snapshot(), before)
}

test('one statement at a time: a round trip each, an autocommit transaction each', async () => {
  const counts = await counted(async () => {
    await sql`select 1 as one`
    await sql`select 1 as one`
  })
  expect(counts).toMatchObject({ statements: 2, roundTrips: 2, transactions: 2, writingTransactions: 0, commits: 0 })
  expect(counts.byText).toEqual({ 'select 1 as one': { statements: 2, roundTrips: 2 } })
})

test('pipelined on one connection: two statements, one round trip, a transaction each', async () => {
  await sql`select 2 as two`
  const reads = await counted(() => Promise.all([sql`select 1 as one`, sql`select 2 as two`]))
  expect(reads).toMatchObject({ statements: 2, roundTrips: 1, transactions: 2, writingTransactions: 0 })
  const insert = (id: number) => sql`insert into wire (id, note) values (${id}, 'pipelined')`
  await insert(2000) // prepared (described) once, so the two below can go out together
  const writes = await counted(() => Promise.all([insert(2001), insert(2002)]))
  expect(writes).toMatchObject({ statements: 2, roundTrips: 1, transactions: 2, writingTransactions: 2 })
})

test('a multi-row statement is one statement, however many rows', async () => {
  const ids = Array.from({ length: 50 }, (_, i) => i + 1)
  const counts = await counted(() => sql`insert into wire (id, note) select id, 'batched' from unnest(${sql.array(ids)}::int[]) as id`)
  expect(counts).toMatchObject({ statements: 1, roundTrips: 1, transactions: 1, writingTransactions: 1 })
  const [row] = await db.sql<{ n: number }[]>`select count(*)::int as n from wire where note = 'batched'`
  expect(row!.n).toBe(50)
})

test('BEGIN, two writes, COMMIT: four statements, one transaction that writes, one COMMIT', async () => {
  const counts = await counted(() => sql.begin(async (tx) => {
    await tx`insert into wire (id, note) values (${1001}, 'tx')`
    await tx`update wire set note = 'tx2' where id = ${1001}`
  }))
  expect(counts).toMatchObject({ statements: 4, transactions: 1, writingTransactions: 1, commits: 1 })
  expect(Object.keys(counts.byText).sort()).toEqual(['begin', 'commit', "insert into wire (id, note) values ($1, 'tx')", "update wire set note = 'tx2' where id = $1"])
})
